"""Every failure carries google.rpc.Status details a client can act on, read with grpc_status.rpc_status.

ErrorInfo names a stable reason per case; RetryInfo comes with RESOURCE_EXHAUSTED and UNAVAILABLE;
BadRequest names the request field at fault for INVALID_ARGUMENT and OUT_OF_RANGE.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.rich_errors import Details
from tests.support.rich_errors import details_of as shared_details_of
from tests.support.servers import FRONTENDS, FRONTENDS_IDS, RunningServer, server_config
from tests.support.waiting import wait_for

Code = grpc.StatusCode


def details_of(call: Callable[[], Any]) -> Details:
    """Make the call, which must fail; what its status details say (the trailer agrees with the
    call's own code and message, and ErrorInfo comes first, each kind once)."""
    got = shared_details_of(call)
    assert got.trailer_code == got.code.value[0] and got.trailer_message == got.message
    assert got.kinds[0] == "ErrorInfo" and len(got.kinds) == len(set(got.kinds))
    return got


def tokens(ids: list[int]) -> pb.Prompt:
    return pb.Prompt(tokens=pb.TokenIds(ids=ids))


def open_session(
    running: RunningServer, ids: list[int] | None = None, metadata: tuple[tuple[str, str], ...] = ()
) -> str:
    first = pb.PrefillRequest(prompt=tokens(ids or [5, 6]))
    return str(list(running.stub.Prefill(iter([first]), metadata=metadata))[-1].done.session_id)


@pytest.fixture(scope="module", params=FRONTENDS, ids=FRONTENDS_IDS)
def plain(served_model: Path, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    running = RunningServer(server_config(served_model, max_sessions=4, frontends=request.param))
    yield running
    running.close()


@pytest.mark.parametrize(
    ("request_", "reason", "field"),
    [
        (greedy_request([5, 100000], 2), "TOKEN_OUT_OF_VOCABULARY", "prompt.tokens.ids"),
        (greedy_request([], 2), "EMPTY_PROMPT", "prompt"),
        (
            pb.GenerateRequest(prompt=tokens([5]), sampling=pb.SamplingOptions(temperature=-1)),
            "INVALID_SAMPLING",
            "sampling.temperature",
        ),
        (
            pb.GenerateRequest(prompt=tokens([5]), sampling=pb.SamplingOptions(top_p=2)),
            "INVALID_SAMPLING",
            "sampling.top_p",
        ),
        (
            pb.GenerateRequest(prompt=tokens([5]), sampling=pb.SamplingOptions(min_p=2)),
            "INVALID_SAMPLING",
            "sampling.min_p",
        ),
        (
            pb.GenerateRequest(prompt=tokens([5]), sampling=pb.SamplingOptions(presence_penalty=3)),
            "INVALID_SAMPLING",
            "sampling.presence_penalty",
        ),
        (
            pb.GenerateRequest(prompt=tokens([5]), sampling=pb.SamplingOptions(frequency_penalty=-3)),
            "INVALID_SAMPLING",
            "sampling.frequency_penalty",
        ),
        (greedy_request([5], 2, stop=["x"] * 17), "TOO_MANY_STOPS", "stopping.stop"),
        (
            pb.GenerateRequest(prompt=tokens([5]), logprobs=pb.LogprobOptions(top=21)),
            "INVALID_LOGPROBS",
            "logprobs.top",
        ),
    ],
)
def test_invalid_argument_names_its_reason_and_the_field_at_fault(
    plain: RunningServer, request_: pb.GenerateRequest, reason: str, field: str
) -> None:
    got = details_of(lambda: plain.stub.Generate(request_))
    assert (got.code, got.reason, got.fields) == (Code.INVALID_ARGUMENT, reason, [field])
    assert got.domain == "ladder.v1"
    assert got.retry_seconds is None, "retrying the same bad request cannot help"


def test_out_of_range_names_the_limit_it_is_over(plain: RunningServer) -> None:
    over = details_of(lambda: plain.stub.Generate(greedy_request([5], 257)))
    assert (over.code, over.reason, over.fields) == (
        Code.OUT_OF_RANGE,
        "MAX_NEW_TOKENS_OVER_LIMIT",
        ["stopping.max_new_tokens"],
    )
    full = details_of(lambda: plain.stub.Generate(greedy_request(prompt_ids(1020), 10)))
    assert (full.code, full.reason) == (Code.OUT_OF_RANGE, "CAPACITY_EXCEEDED")


def test_session_errors_have_their_own_reasons(plain: RunningServer) -> None:
    missing = details_of(lambda: plain.stub.Rewind(pb.RewindRequest(session_id="pod-a.nope")))
    assert (missing.code, missing.reason) == (Code.NOT_FOUND, "SESSION_NOT_FOUND")
    elsewhere = details_of(lambda: plain.stub.Rewind(pb.RewindRequest(session_id="pod-b.abc")))
    assert (elsewhere.code, elsewhere.reason) == (Code.FAILED_PRECONDITION, "WRONG_POD")
    assert elsewhere.metadata == {"owner_pod": "pod-b"}
    session = open_session(plain)
    try:
        past_end = details_of(lambda: plain.stub.Rewind(pb.RewindRequest(session_id=session, length=9)))
        assert (past_end.code, past_end.reason, past_end.fields) == (
            Code.INVALID_ARGUMENT,
            "LENGTH_PAST_END",
            ["length"],
        )
    finally:
        plain.stub.CloseSession(pb.CloseSessionRequest(session_id=session))


def test_a_session_id_on_a_later_prefill_message_is_refused_and_the_prefill_undone(
    plain: RunningServer,
) -> None:
    session = open_session(plain, [5, 6, 7])
    try:
        parts = [
            pb.PrefillRequest(session_id=session, prompt=tokens([8, 9])),
            pb.PrefillRequest(session_id=session, prompt=tokens([10])),
        ]
        got = details_of(lambda: list(plain.stub.Prefill(iter(parts))))
        assert (got.code, got.reason, got.fields) == (
            Code.INVALID_ARGUMENT,
            "SESSION_ID_NOT_FIRST",
            ["session_id"],
        )
        # The refused Prefill had run its first part ([8, 9]); the session is back at 3 tokens.
        past_end = details_of(lambda: plain.stub.Rewind(pb.RewindRequest(session_id=session, length=4)))
        assert past_end.reason == "LENGTH_PAST_END" and "holds 3" in past_end.message
    finally:
        plain.stub.CloseSession(pb.CloseSessionRequest(session_id=session))


def test_a_full_queue_full_slots_and_a_callers_quota_are_three_reasons_each_with_a_retry_delay(
    served_model: Path,
) -> None:
    # One slot, one queue place: a session holds the slot, one Generate waits for it in the queue.
    running = RunningServer(
        server_config(served_model, max_sessions=1, max_queue=1, sessions_per_caller=1, session_memory_mb=0)
    )  # sessions hold their slots
    try:
        held = open_session(running)
        waiting = running.stub.Generate.future(greedy_request([5, 6], 2))
        wait_for(lambda: running.scheduler.waiting == 1)
        slots = details_of(lambda: running.stub.Generate(greedy_request([5, 6], 2)))
        quota = details_of(lambda: open_session(running))
        # The same load as a burst the worker has not reached yet: the same reason.
        waiting.cancel()
        wait_for(lambda: running.scheduler.depth == 0)
        with running.frozen() as scheduler:
            burst = [running.stub.Generate.future(greedy_request([5, 6], 2), timeout=30) for _ in range(4)]
            wait_for(lambda: sum(f.done() for f in burst) == 3, what="three of the burst refused")
            refused = [details_of(f.result) for f in burst if f.done()]
            waiting = next(f for f in burst if not f.done())
        running.stub.CloseSession(pb.CloseSessionRequest(session_id=held))
        assert len(waiting.result(timeout=30).token_ids) == 2
        # The slot is free, but a stream the (held) worker has taken fills the one queue place.
        with running.frozen() as scheduler:
            stream = running.stub.GenerateStream(greedy_request(prompt_ids(20), 200))
            wait_for(lambda: scheduler.depth == 1)
            queue = details_of(lambda: running.stub.Generate(greedy_request([5, 6], 2)))
        stream.cancel()
    finally:
        running.close()
    assert (slots.code, slots.reason) == (Code.RESOURCE_EXHAUSTED, "SESSIONS_FULL")
    assert slots.metadata == {"max_queue": "1", "waiting_for_slot": "1", "free_slots": "0"}
    assert [(r.code, r.reason) for r in refused] == [(Code.RESOURCE_EXHAUSTED, "SESSIONS_FULL")] * 3
    assert (queue.code, queue.reason) == (Code.RESOURCE_EXHAUSTED, "QUEUE_FULL")
    assert queue.metadata == {"max_queue": "1", "waiting_for_slot": "0", "free_slots": "1"}
    assert (quota.code, quota.reason) == (Code.RESOURCE_EXHAUSTED, "CALLER_QUOTA")
    assert slots.retry_seconds == queue.retry_seconds == 1.0 and quota.retry_seconds == 5.0


def test_a_draining_server_says_unavailable_draining_with_a_retry_delay(served_model: Path) -> None:
    running = RunningServer(server_config(served_model))
    try:
        finish = threading.Event()

        def parts() -> Iterator[pb.PrefillRequest]:
            yield pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=prompt_ids(20))))
            finish.wait(60)  # the prompt stays unfinished, so the call stays in flight

        stream = running.stub.Prefill(parts())
        next(stream)  # in flight: the drain waits for it
        draining = asyncio.run_coroutine_threadsafe(running.server.drain(grace=20), running.loop)
        wait_for(lambda: running.server.draining)
        got = details_of(lambda: running.stub.GetModelInfo(pb.GetModelInfoRequest()))
        stream.cancel()
        finish.set()
        draining.result(timeout=30)
    finally:
        running.close()
    assert (got.code, got.reason, got.retry_seconds) == (Code.UNAVAILABLE, "DRAINING", 0.1)


def test_a_missing_or_unknown_token_is_told_apart(served_model: Path) -> None:
    running = RunningServer(server_config(served_model, auth_tokens=("alice=secret",)))
    try:
        missing = details_of(lambda: running.stub.GetModelInfo(pb.GetModelInfoRequest()))
        unknown = details_of(
            lambda: running.stub.GetModelInfo(
                pb.GetModelInfoRequest(), metadata=(("authorization", "Bearer guess"),)
            )
        )
    finally:
        running.close()
    assert (missing.code, missing.reason) == (Code.UNAUTHENTICATED, "TOKEN_MISSING")
    assert (unknown.code, unknown.reason) == (Code.UNAUTHENTICATED, "TOKEN_UNKNOWN")


def test_bytes_that_are_not_the_message_are_malformed_request_of_the_request_as_a_whole(
    plain: RunningServer,
) -> None:
    call = plain.channel.unary_unary("/ladder.v1.Ladder/Generate")
    got = details_of(lambda: call(b"\xff\xff\xff\xff", timeout=10))
    assert (got.code, got.reason, got.fields) == (Code.INVALID_ARGUMENT, "MALFORMED_REQUEST", [""])
