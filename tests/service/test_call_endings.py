"""Calls that end early are counted and logged with their code; repeated failures are rate-limited."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, both_ways, server_config
from tests.support.waiting import wait_for


def lines(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == event]


@both_ways
def test_a_call_past_its_deadline_and_a_cancelled_stream_are_counted_and_logged_once_each(
    served_model: Path, frontends: int
) -> None:
    running = RunningServer(
        server_config(
            served_model, max_sessions=1, max_new_tokens=1000, session_memory_mb=0, frontends=frontends
        )
    )
    try:
        with capture_logs() as logs:
            first = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6])))
            held = list(running.stub.Prefill(iter([first])))[-1].done.session_id
            # A session holds the only slot: the next call waits for it until its deadline.
            with pytest.raises(grpc.RpcError) as caught:
                running.stub.Generate(
                    greedy_request([5, 6], 2), timeout=0.3, metadata=(("x-request-id", "unary-1"),)
                )
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            running.stub.CloseSession(pb.CloseSessionRequest(session_id=held))
            stream = running.stub.GenerateStream(
                greedy_request(prompt_ids(20), 900), metadata=(("x-request-id", "stream-1"),)
            )
            next(stream)
            stream.cancel()
            wait_for(lambda: running.calls("GenerateStream", "CANCELLED") == 1)
            wait_for(lambda: running.calls("Generate", "DEADLINE_EXCEEDED") == 1)
            # The call is counted a moment before its log line is written: wait for both lines.
            # (A frontend process writes its calls' lines to its own log: read here in one process.)
            if not frontends:
                wait_for(lambda: len(lines(logs, "rpc_cancelled")) >= 2)
        ended = sorted(
            (e["method"], e["request_id"], e["code"], e["log_level"]) for e in lines(logs, "rpc_cancelled")
        )
        expected = [
            ("Generate", "unary-1", "DEADLINE_EXCEEDED", "info"),
            ("GenerateStream", "stream-1", "CANCELLED", "info"),
        ]
        assert ended == ([] if frontends else expected)
        wait_for(lambda: running.stats().sessions_open == 0)
    finally:
        running.close()


@both_ways
def test_a_prefill_whose_client_leaves_before_its_first_message_is_cancelled_not_invalid(
    served_model: Path, frontends: int
) -> None:
    running = RunningServer(server_config(served_model, frontends=frontends))
    try:
        release = threading.Event()

        def parts() -> Any:
            release.wait(10)
            yield from ()

        stream = running.stub.Prefill(parts())
        wait_for(lambda: running.in_flight() == 1)
        stream.cancel()
        release.set()
        wait_for(lambda: running.calls("Prefill", "CANCELLED") == 1)
        assert running.calls("Prefill", "INVALID_ARGUMENT") == 0
    finally:
        running.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def one_process(served_model: Path) -> Iterator[RunningServer]:
    """gRPC served in the server's process, whose log the test reads (a frontend writes its own)."""
    with RunningServer(server_config(served_model, frontends=0)) as running:
        yield running


def test_identical_failures_are_logged_at_most_five_a_second_and_the_next_line_counts_the_rest(
    one_process: RunningServer,
) -> None:
    server = one_process
    clock = Clock()
    server.server.access_log.failures.clock = clock
    bad = greedy_request([], 2)  # an empty prompt: INVALID_ARGUMENT
    with capture_logs() as logs:
        for _ in range(12):
            with pytest.raises(grpc.RpcError):
                server.stub.Generate(bad)
        with pytest.raises(grpc.RpcError):
            server.stub.Rewind(pb.RewindRequest(session_id="pod-a.nope"))  # another kind: its own budget
        clock.now += 1.0
        with pytest.raises(grpc.RpcError):
            server.stub.Generate(bad)
    failed = [(e["method"], e["code"], e.get("suppressed", 0)) for e in lines(logs, "rpc_failed")]
    assert failed == [("Generate", "INVALID_ARGUMENT", 0)] * 5 + [
        ("Rewind", "NOT_FOUND", 0),
        ("Generate", "INVALID_ARGUMENT", 7),
    ]
    assert server.calls("Generate", "INVALID_ARGUMENT") == 13  # the metric counts every one


def test_a_cancel_racing_a_stop_string_leaves_the_session_usable_wherever_it_lands(
    server: RunningServer,
) -> None:
    # A Decode whose stop string ends it after about six tokens, cancelled after 0, 1, ... 9 of its
    # events: before the stop, as it lands and after the stream ended. Each time the session is
    # left open and consistent: rewound to the prompt, it decodes the same text again.
    prompt = prompt_ids(24, seed=81)
    session_id = server.stub.Prefill(
        iter([pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=prompt)), last=True)])
    )
    session_id = list(session_id)[-1].done.session_id

    def decode(stop: list[str]) -> Any:
        return server.stub.Decode(
            pb.DecodeRequest(
                session_id=session_id,
                stopping=pb.StoppingOptions(max_new_tokens=12, ignore_eos=True, stop=stop),
            ),
            timeout=30,
        )

    def rewound() -> None:
        server.stub.Rewind(pb.RewindRequest(session_id=session_id, length=len(prompt)))

    free = [e for e in decode([]) if e.HasField("done")][0].done.text
    rewound()
    stop = next(free[i : i + 2] for i in range(4, len(free) - 1) if free[i : i + 2].strip())
    for cancel_after in range(10):
        stream = decode([stop])
        try:
            for seen, _ in enumerate(stream, start=1):
                if seen == cancel_after:
                    stream.cancel()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.CANCELLED
        wait_for(lambda: server.scheduler.depth == 0, what="the Decode's job to end")
        rewound()
        again = [e for e in decode([]) if e.HasField("done")][0].done.text
        assert again == free, cancel_after
        rewound()
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))
    assert server.stats().sessions_open == 0
