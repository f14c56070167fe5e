"""Requests that do not parse, and session ids that are not ids, end their own call with a precise status.

Bytes that are not the RPC's message (a corrupt wire format, a string that is not
UTF-8) are INVALID_ARGUMENT on every RPC, unary, server-streaming and Prefill
alike, after the same checks as any call (bearer token, request id). A session
id that is not at most 236 characters of [A-Za-z0-9._-] is NOT_FOUND, and
neither the id nor anything taken from it comes back.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from service.core.sessions import SessionRegistry
from tests.support.servers import RunningServer, server_config

Code = grpc.StatusCode
CORRUPT = b"\xff\xff\xff\xff"
BAD_UTF8 = b"\x0a\x01\xff"  # field 1, a string, holding the byte 0xff


def raw_call(
    server: RunningServer, method: str, *messages: bytes, metadata: tuple[tuple[str, str], ...] = ()
) -> grpc.RpcError:
    """Send `messages` as they are (no serializer) and return the error the call ends with."""
    channel, path = server.channel, f"/ladder.v1.Ladder/{method}"
    with pytest.raises(grpc.RpcError) as caught:
        if method == "Prefill":
            list(channel.stream_stream(path)(iter(messages), metadata=metadata, timeout=10))
        elif method in ("GenerateStream", "Decode"):
            list(channel.unary_stream(path)(messages[0], metadata=metadata, timeout=10))
        else:
            channel.unary_unary(path)(messages[0], metadata=metadata, timeout=10)
    return caught.value


@pytest.mark.parametrize(
    "method", ["Generate", "GenerateStream", "Decode", "Rewind", "Tokenize", "Prefill", "GetEngineStats"]
)
@pytest.mark.parametrize("payload", [CORRUPT, BAD_UTF8], ids=["corrupt", "bad-utf8"])
def test_bytes_that_do_not_parse_are_invalid_argument_on_every_kind_of_rpc(
    server: RunningServer, method: str, payload: bytes
) -> None:
    if method == "GetEngineStats" and payload == BAD_UTF8:
        payload = b"\x0a\x01"  # an empty message has no strings: a truncated field instead
    error = raw_call(server, method, payload, metadata=(("x-request-id", "garbage-1"),))
    assert error.code() == Code.INVALID_ARGUMENT
    assert "is not a valid" in error.details()
    assert ("x-request-id", "garbage-1") in tuple(error.trailing_metadata())


def test_a_prefill_part_that_does_not_parse_after_a_good_one_closes_the_session_it_opened(
    server: RunningServer,
) -> None:
    good = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6, 7]))).SerializeToString()
    assert raw_call(server, "Prefill", good, CORRUPT).code() == Code.INVALID_ARGUMENT
    assert server.stats().sessions_open == 0
    assert (
        len(
            server.stub.Generate(
                pb.GenerateRequest(
                    prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5])),
                    stopping=pb.StoppingOptions(max_new_tokens=2, ignore_eos=True),
                )
            ).token_ids
        )
        == 2
    )


def test_bytes_that_do_not_parse_still_need_a_bearer_token(served_model: Path) -> None:
    running = RunningServer(server_config(served_model, auth_tokens=("alice=s3cret",)))
    try:
        assert raw_call(running, "Generate", CORRUPT).code() == Code.UNAUTHENTICATED
        assert raw_call(running, "Prefill", CORRUPT).code() == Code.UNAUTHENTICATED
        token = (("authorization", "Bearer s3cret"),)
        assert raw_call(running, "Generate", CORRUPT, metadata=token).code() == Code.INVALID_ARGUMENT
        assert raw_call(running, "Prefill", CORRUPT, metadata=token).code() == Code.INVALID_ARGUMENT
    finally:
        running.close()


MALFORMED_IDS = {
    "20 kB": "pod-a." + "a" * 20_000,
    "20 kB on another pod": "pod-b." + "b" * 20_000,
    "237 characters": "pod-a." + "x" * 231,  # one past the longest id, a 128-character fork_id's
    "control characters": "pod-a.\x00\x01\x1b[2J",
    "not ASCII": "pod-a.é",
    "a path in the pod": "pod-a/../etc.abc",
    "a header in the pod": "pod\r\nladder-session-owner: evil.abc",
    "empty": "",
}


@pytest.mark.parametrize("case", sorted(MALFORMED_IDS))
def test_a_malformed_session_id_is_not_found_and_nothing_of_it_comes_back(
    server: RunningServer, case: str
) -> None:
    session_id = MALFORMED_IDS[case]
    calls = [
        lambda: server.stub.Rewind(pb.RewindRequest(session_id=session_id)),
        lambda: server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id)),
        lambda: list(server.stub.Decode(pb.DecodeRequest(session_id=session_id))),
        lambda: list(
            server.stub.Prefill(
                iter(
                    [pb.PrefillRequest(session_id=session_id, prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5])))]
                )
            )
        ),
    ]
    for call in calls if session_id else calls[:3]:  # Prefill with no id opens a session
        with pytest.raises(grpc.RpcError) as caught:
            call()
        error = caught.value
        assert error.code() == Code.NOT_FOUND
        echoed = session_id[6:]  # what follows the pod
        assert len(error.details()) < 200 and (not echoed or echoed not in error.details())
        trailers = dict(error.trailing_metadata())
        assert sorted(trailers) == ["grpc-status-details-bin", "x-request-id"]
        assert not echoed or echoed.encode() not in trailers["grpc-status-details-bin"]


def test_a_well_formed_id_of_another_pod_names_only_that_pod_in_the_trailer(server: RunningServer) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        server.stub.Rewind(pb.RewindRequest(session_id="pod-b.abc_DEF-123"))
    assert caught.value.code() == Code.FAILED_PRECONDITION
    assert ("ladder-session-owner", "pod-b") in tuple(caught.value.trailing_metadata())


@pytest.mark.parametrize("pod", ["", "pod a", "pod\r\n", "p" * 106])
def test_a_pod_name_that_could_not_prefix_a_well_formed_session_id_is_refused(pod: str) -> None:
    with pytest.raises(ValueError):
        SessionRegistry(pod, 0)
    assert len(SessionRegistry("p" * 105, 0).new_id()) == 128
