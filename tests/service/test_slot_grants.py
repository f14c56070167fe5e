"""Who gets free KV slots (service.rounds.slot_grants): pure values, then the issue's case on a
real server — a one-sample Generate is not held behind an n = 7 one that must wait for sessions."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from service.rounds import opening, slot_grants
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config
from tests.support.sessions import part, prefill
from tests.support.waiting import wait_for


def test_requests_that_fit_start_oldest_first() -> None:
    assert slot_grants([1, 2, 1], free=4, returning=0) == (0, 1, 2)
    assert slot_grants([1, 2, 1], free=3, returning=0) == (0, 1)


def test_a_request_that_fits_once_running_jobs_end_holds_the_line() -> None:
    assert slot_grants([7, 1], free=6, returning=1) == ()
    assert slot_grants([1, 7, 1], free=7, returning=0) == (0,)


def test_a_request_waiting_for_sessions_to_close_does_not_block_the_ones_behind_it() -> None:
    assert slot_grants([7, 1, 1], free=6, returning=0) == (1, 2)
    assert slot_grants([7, 1, 1], free=6, returning=1) == ()  # 7 <= 6 + 1: the line closes
    assert slot_grants([9, 1, 2], free=8, returning=0) == (1, 2)


def test_grants_never_exceed_the_free_slots_and_a_passed_request_cannot_start_even_with_returns() -> None:
    for needs in itertools.product(range(1, 5), repeat=3):
        for free, returning in itertools.product(range(6), range(4)):
            granted = slot_grants(list(needs), free, returning)
            assert sum(needs[i] for i in granted) <= free
            left, back = free, returning  # free and returning slots as each request's turn comes
            for i, need in enumerate(needs):
                if i in granted:
                    left, back = left - need, back + need
                elif any(j > i for j in granted):
                    assert need > left + back, (needs, free, returning)


@pytest.fixture
def running(served_model: Path) -> Iterator[RunningServer]:
    # Every slot may be one caller's: the test is about the queue, not the per-caller share.
    with RunningServer(server_config(served_model, max_sessions=8, sessions_per_caller=8)) as server:
        yield server


def test_a_one_sample_generate_passes_an_n_7_one_that_waits_for_idle_sessions(served_model: Path) -> None:
    config = server_config(
        served_model, max_sessions=8, auth_tokens=("alice=a", "bob=b", "carol=c"), session_memory_mb=0
    )
    with RunningServer(config) as running:

        def as_(token: str) -> tuple[tuple[str, str]]:
            return (("authorization", f"Bearer {token}"),)

        # Alice holds two idle sessions; Bob's n = 7 needs seven of the six free slots.
        idle = [
            list(running.stub.Prefill(iter([part(prompt_ids(10, seed=s), last=True)]), metadata=as_("a")))[
                -1
            ].done.session_id
            for s in range(2)
        ]
        large = greedy_request(prompt_ids(20, seed=3), 4)
        large.n, large.sampling.temperature = 7, 1.0
        waiting: Future[pb.Completion] = running.stub.Generate.future(large, timeout=60, metadata=as_("b"))

        def stats() -> pb.EngineStats:
            return running.stub.GetEngineStats(pb.GetEngineStatsRequest(), metadata=as_("a"))

        wait_for(lambda: stats().waiting_for_slot == 1, what="the n = 7 request waits")
        small = running.stub.Generate(
            greedy_request(prompt_ids(20, seed=4), 4), timeout=30, metadata=as_("c")
        )
        assert len(small.token_ids) == 4, "6 of 8 slots are free: Carol's request did not wait"
        assert not waiting.done()
        running.stub.CloseSession(pb.CloseSessionRequest(session_id=idle[0]), metadata=as_("a"))
        assert len(waiting.result(timeout=30).samples) == 7, "Bob's turn came when a session closed"
        running.stub.CloseSession(pb.CloseSessionRequest(session_id=idle[1]), metadata=as_("a"))
        assert stats().sessions_open == 0


def test_an_n_7_request_that_running_jobs_will_make_room_for_is_not_passed(running: RunningServer) -> None:
    idle = prefill(running, part(prompt_ids(10, seed=5), last=True))[-1].done.session_id
    with running.frozen():  # arrivals in a known order, while nothing runs
        first = running.stub.GenerateStream(greedy_request(prompt_ids(20, seed=6), 40), timeout=60)
        wait_for(lambda: running.scheduler.depth == 1, what="the first stream is queued")
        large = greedy_request(prompt_ids(20, seed=7), 4)
        large.n, large.sampling.temperature = 7, 1.0
        seven = running.stub.Generate.future(large, timeout=60)
        wait_for(lambda: running.scheduler.depth == 2, what="the n = 7 request is queued")
        late = running.stub.Generate.future(greedy_request(prompt_ids(20, seed=8), 4), timeout=60)
        wait_for(lambda: running.scheduler.depth == 3, what="the late request is queued")
    # 1 slot idle, the stream takes 1, 6 free: the n = 7 request fits once the stream ends, so the
    # late one waits behind it and ends after it.
    order: list[str] = []
    seven.add_done_callback(lambda _: order.append("seven"))
    late.add_done_callback(lambda _: order.append("late"))
    assert len(list(first)) == 41  # 40 tokens and done
    assert len(seven.result(timeout=60).samples) == 7
    assert len(late.result(timeout=60).token_ids) == 4
    assert order == ["seven", "late"]
    running.stub.CloseSession(pb.CloseSessionRequest(session_id=idle))
    assert running.stats().sessions_open == 0


def test_requests_waiting_for_a_slot_wait_in_a_queue_rounds_do_not_walk_and_a_cancel_leaves_it(
    served_model: Path,
) -> None:
    config = server_config(served_model, max_sessions=2, sessions_per_caller=2, session_memory_mb=0)
    with RunningServer(config) as running:
        idle = [
            list(running.stub.Prefill(iter([part(prompt_ids(10, seed=s), last=True)])))[-1].done.session_id
            for s in range(2)
        ]
        queued = [
            running.stub.Generate.future(greedy_request(prompt_ids(12, seed=10 + i), 3), timeout=60)
            for i in range(40)
        ]
        wait_for(lambda: running.scheduler.waiting == 40, what="every request waits for a slot")
        scheduler = running.scheduler
        assert all(opening(job.want) is None for job in list(scheduler._running)), (
            "a job waiting for a slot is walked by every round"
        )
        queued[7].cancel()
        wait_for(lambda: running.scheduler.waiting == 39, what="the cancelled request leaves the queue")
        for session_id in idle:
            running.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))
        finished = [f.result(timeout=60) for i, f in enumerate(queued) if i != 7]
        assert all(len(c.token_ids) == 3 for c in finished), "every queued request was served in turn"
        wait_for(lambda: running.scheduler.waiting == 0 and running.scheduler.depth == 0, what="all done")
