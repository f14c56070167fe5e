"""Who gets free KV slots (service.worker.rounds.slot_grants, grant_sizes): pure values, then the cases on a
real server — n samples start as slots free (more samples than slots, beside idle sessions), and a
one-sample Generate is not held behind a large n."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from service.worker.rounds import grant_sizes, slot_grants, slot_need
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config
from tests.support.sessions import part
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


def test_granted_requests_take_their_least_then_the_rest_goes_oldest_first_up_to_their_most() -> None:
    assert grant_sizes([(1, 9), (1, 1)], free=8) == (7, 1)  # a large n beside a one-sample request
    assert grant_sizes([(1, 3), (1, 9)], free=8) == (3, 5)
    assert grant_sizes([(1, 9)], free=1) == (1,)


def test_grant_sizes_never_exceed_the_free_slots_nor_a_request_s_most() -> None:
    for wants in itertools.product([(1, 1), (1, 3), (2, 2), (1, 9)], repeat=3):
        for free in range(sum(least for least, _ in wants), 14):
            sizes = grant_sizes(list(wants), free)
            assert sum(sizes) <= free
            assert all(least <= size <= most for size, (least, most) in zip(sizes, wants, strict=True))
            assert sum(sizes) == min(free, sum(most for _, most in wants)), "a free slot left unused"


@pytest.fixture
def running(served_model: Path) -> Iterator[RunningServer]:
    # Every slot may be one caller's: the test is about the queue, not the per-caller share.
    with RunningServer(server_config(served_model, max_sessions=8, sessions_per_caller=8)) as server:
        yield server


def sampled(tokens: list[int], new: int, n: int = 1, seed: int = 7) -> pb.GenerateRequest:
    request = greedy_request(tokens, new)
    request.n, request.sampling.temperature, request.sampling.seed = n, 1.5, seed
    return request


def singles(running: RunningServer, tokens: list[int], new: int, n: int) -> list[list[int]]:
    """Each sample as the one-sample request with its seed (7 + i) would write it."""
    return [list(running.stub.Generate(sampled(tokens, new, seed=7 + i)).token_ids) for i in range(n)]


def test_an_n_7_request_starts_in_the_free_slots_beside_idle_sessions_and_a_one_sample_one_too(
    served_model: Path,
) -> None:
    config = server_config(
        served_model, max_sessions=8, auth_tokens=("alice=a", "bob=b", "carol=c"), session_memory_mb=0
    )
    with RunningServer(config) as running:

        def as_(token: str) -> tuple[tuple[str, str]]:
            return (("authorization", f"Bearer {token}"),)

        # Alice holds two idle sessions; Bob's n = 7 starts in the six free slots, its samples as
        # slots free; Carol's one-sample request, sent meanwhile, gets the first slot a sample gives back.
        idle = [
            list(running.stub.Prefill(iter([part(prompt_ids(10, seed=s), last=True)]), metadata=as_("a")))[
                -1
            ].done.session_id
            for s in range(2)
        ]
        tokens = prompt_ids(20, seed=3)
        with running.frozen():
            seven = running.stub.Generate.future(sampled(tokens, 8, n=7), timeout=60, metadata=as_("b"))
            wait_for(lambda: running.scheduler.depth == 1, what="the n = 7 request is queued")
            small = running.stub.Generate.future(
                greedy_request(prompt_ids(20, seed=4), 4), timeout=30, metadata=as_("c")
            )
            wait_for(lambda: running.scheduler.depth == 2, what="the one-sample request is queued")
        assert len(small.result(timeout=30).token_ids) == 4
        alone = [
            list(running.stub.Generate(sampled(tokens, 8, seed=7 + i), metadata=as_("b")).token_ids)
            for i in range(7)
        ]
        assert [list(s.token_ids) for s in seven.result(timeout=60).samples] == alone
        for session_id in idle:
            running.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), metadata=as_("a"))
        stats = running.stub.GetEngineStats(pb.GetEngineStatsRequest(), metadata=as_("a"))
        assert stats.sessions_open == 0


def test_n_32_on_8_slots_each_sample_the_single_request_with_its_seed(running: RunningServer) -> None:
    tokens = prompt_ids(20, seed=9)
    before = running.stats()
    reply = running.stub.Generate(sampled(tokens, 5, n=32), timeout=120)
    after = running.stats()
    assert [s.index for s in reply.samples] == list(range(32))
    assert [list(s.token_ids) for s in reply.samples] == singles(running, tokens, 5, 32)
    assert after.prompt_tokens - before.prompt_tokens == len(tokens), "one prefill for all 32"
    assert after.sessions_open == 0 and running.stats().waiting_for_slot == 0


def test_a_one_sample_request_passes_an_n_9_one_whose_samples_wait_for_slots(running: RunningServer) -> None:
    tokens = prompt_ids(20, seed=11)
    with running.frozen():  # arrivals in a known order, while nothing runs
        nine = running.stub.Generate.future(sampled(tokens, 24, n=9), timeout=60)
        wait_for(lambda: running.scheduler.depth == 1, what="the n = 9 request is queued")
        one = running.stub.Generate.future(greedy_request(prompt_ids(20, seed=12), 4), timeout=60)
        wait_for(lambda: running.scheduler.depth == 2, what="the one-sample request is queued")
    # 8 slots free: the n = 9 request takes 7 (its prompt's holder and six samples), the one-sample
    # request, behind it, the eighth; the n = 9's last samples start as slots free.
    order: list[str] = []
    nine.add_done_callback(lambda _: order.append("nine"))
    one.add_done_callback(lambda _: order.append("one"))
    assert len(one.result(timeout=60).token_ids) == 4
    assert [list(s.token_ids) for s in nine.result(timeout=60).samples] == singles(running, tokens, 24, 9)
    assert order == ["one", "nine"]
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
        assert all(slot_need(job.want) is None for job in list(scheduler._running)), (
            "a job waiting for a slot is walked by every round"
        )
        queued[7].cancel()
        wait_for(lambda: running.scheduler.waiting == 39, what="the cancelled request leaves the queue")
        for session_id in idle:
            running.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))
        finished = [f.result(timeout=60) for i, f in enumerate(queued) if i != 7]
        assert all(len(c.token_ids) == 3 for c in finished), "every queued request was served in turn"
        wait_for(lambda: running.scheduler.waiting == 0 and running.scheduler.depth == 0, what="all done")
