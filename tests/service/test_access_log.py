"""Logs as an operator reads them: one access line per call, session open/close lines, forwards at debug.

The server runs as `python -m service` (the `ladder serve` entry), its JSON lines read from stderr.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import free_port
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
ACCESS = ("rpc", "rpc_failed", "rpc_cancelled")
Run = tuple[list[dict[str, Any]], dict[str, str]]


def serve_and_call(served_model: Path, level: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Run a server at `level`, make one call of each kind, stop it; its log lines and the ids used."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "service",
        "--model",
        str(served_model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        "0",
        "--http-port",
        "0",
        "--log-level",
        level,
        "--pod-name",
        "pod-l",
        "--drain-seconds",
        "2",
    ]
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ids: dict[str, str] = {}
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            stub = ladder_pb2_grpc.LadderStub(channel)
            wait_for(lambda: _serving(stub), 60)
            stub.Generate(greedy_request(prompt_ids(40, seed=1), 5), metadata=(("x-request-id", "gen-1"),))
            first = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=prompt_ids(20, seed=2))))
            done = list(stub.Prefill(iter([first]), metadata=(("x-request-id", "pre-1"),)))[-1].done
            ids["session"] = done.session_id
            list(
                stub.Decode(
                    pb.DecodeRequest(
                        session_id=done.session_id,
                        stopping=pb.StoppingOptions(max_new_tokens=3, ignore_eos=True),
                    ),
                    metadata=(("x-request-id", "dec-1"),),
                )
            )
            stub.CloseSession(
                pb.CloseSessionRequest(session_id=done.session_id), metadata=(("x-request-id", "close-1"),)
            )
            with pytest.raises(grpc.RpcError):
                stub.Generate(greedy_request([], 2), metadata=(("x-request-id", "bad-1"),))
            stream = stub.GenerateStream(
                greedy_request(prompt_ids(30, seed=3), 960), metadata=(("x-request-id", "cancel-1"),)
            )
            ids["cancel_seen"] = str(len([next(stream) for _ in range(3)]))
            stream.cancel()
            first = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=prompt_ids(20, seed=4))))
            events = list(stub.Prefill(iter([first]), metadata=(("x-request-id", "src-1"),)))
            source = events[-1].done.session_id
            fork = stub.ForkSession(
                pb.ForkSessionRequest(session_id=source), metadata=(("x-request-id", "fork-1"),)
            )
            ids["fork"], ids["fork_source"] = fork.session_id, source
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, err
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")], ids


def _serving(stub: ladder_pb2_grpc.LadderStub) -> bool:
    try:
        stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
        return True
    except grpc.RpcError:
        return False


@pytest.fixture(scope="module")
def info_run(served_model: Path) -> Run:
    return serve_and_call(served_model, "info")


def by_request(lines: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if line["event"] in ACCESS:
            found.setdefault(line["request_id"], []).append(line)
    return found


def test_every_call_gets_exactly_one_access_line_with_its_request_id_method_and_code(info_run: Run) -> None:
    lines, _ = info_run
    access = by_request(lines)
    for request_id in ("gen-1", "pre-1", "dec-1", "close-1", "bad-1", "cancel-1", "fork-1"):
        assert len(access[request_id]) == 1, access.get(request_id)
    methods = {rid: (e[0]["method"], e[0]["code"]) for rid, e in access.items() if "-" in rid}
    assert methods == {
        "gen-1": ("Generate", "OK"),
        "pre-1": ("Prefill", "OK"),
        "dec-1": ("Decode", "OK"),
        "close-1": ("CloseSession", "OK"),
        "bad-1": ("Generate", "INVALID_ARGUMENT"),
        "cancel-1": ("GenerateStream", "CANCELLED"),
        "src-1": ("Prefill", "OK"),
        "fork-1": ("ForkSession", "OK"),
    }
    assert all(
        e["level"] == "info" and "timestamp" in e and e["peer"].startswith("ipv4:127.0.0.1")
        for entries in access.values()
        for e in entries
    )


def test_an_access_line_carries_tokens_timing_session_and_finish_reason(info_run: Run) -> None:
    lines, ids = info_run
    access = {rid: entries[0] for rid, entries in by_request(lines).items()}
    gen, pre, dec, close = access["gen-1"], access["pre-1"], access["dec-1"], access["close-1"]
    assert (gen["prompt_tokens"], gen["completion_tokens"], gen["finish_reason"]) == (40, 5, "length")
    assert 0 <= gen["queue_ms"] <= gen["ttft_ms"] <= gen["duration_ms"]
    assert gen["caller"] == "" and "session" not in gen
    assert (pre["session"], pre["prompt_tokens"], pre["completion_tokens"]) == (ids["session"], 20, 0)
    assert 0 < pre["ttft_ms"] <= pre["duration_ms"], "arrival to PrefillDone"
    assert (dec["session"], dec["completion_tokens"], dec["finish_reason"]) == (ids["session"], 3, "length")
    assert close["session"] == ids["session"] and "prompt_tokens" not in close
    assert "details" in access["bad-1"] and "prompt is empty" in access["bad-1"]["details"]
    cancelled = access["cancel-1"]
    assert cancelled["finish_reason"] == "cancelled" and cancelled["prompt_tokens"] == 30
    assert cancelled["completion_tokens"] >= int(ids["cancel_seen"])
    fork = access["fork-1"]
    assert (fork["session"], fork["source_session"]) == (ids["fork"], ids["fork_source"])


def test_sessions_opening_and_closing_are_logged(info_run: Run) -> None:
    lines, ids = info_run
    opened = [e for e in lines if e["event"] == "session_opened"]
    closed = [e for e in lines if e["event"] == "session_closed"]
    assert [(e["session"], e["request_id"]) for e in opened] == [
        (ids["session"], "pre-1"),
        (ids["fork_source"], "src-1"),
        (ids["fork"], "fork-1"),
    ]
    assert [(e["session"], e["reason"], e["length"]) for e in closed] == [(ids["session"], "closed", 23)]


def test_forwards_are_logged_at_debug_level_only(served_model: Path, info_run: Run) -> None:
    debug_lines, _ = serve_and_call(served_model, "debug")
    prefill = [e for e in debug_lines if e["event"] == "prefill_forward"]
    decode = [e for e in debug_lines if e["event"] == "decode_forward"]
    assert {e["request_id"] for e in prefill} == {"gen-1", "pre-1", "cancel-1", "src-1"}
    assert sum(e["rows"] for e in prefill if e["request_id"] == "gen-1") == 40
    assert all(e["level"] == "debug" and e["ms"] >= 0 and e["width"] >= e["rows"] for e in prefill)
    assert sum(1 for e in decode if e["request_ids"] == ["gen-1"]) == 4  # 5 tokens: 4 decode forwards
    info_lines, _ = info_run
    assert not [e for e in info_lines if e["level"] == "debug"]
