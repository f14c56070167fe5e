"""Rounds, proved by the scheduler's step log: streams decode together, a long prompt's chunks fit between."""

from __future__ import annotations

from pathlib import Path

from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config
from tests.support.waiting import wait_for

LONG_PROMPT = 960  # fifteen chunk forwards at chunk 64; 22 forwards of the middle rung (44) under load
STREAMS = 3


def test_a_long_prompt_runs_one_rung_per_round_while_streams_decode_and_every_round_advances_them(
    served_model: Path,
) -> None:
    running = RunningServer(server_config(served_model, max_new_tokens=1000))
    try:
        streams = [
            running.stub.GenerateStream(greedy_request(prompt_ids(8 + 40 * i, seed=i), 900))
            for i in range(STREAMS)
        ]
        for stream in streams:
            next(stream)  # each is decoding now
        wait_for(lambda: any(len(r.decode) == STREAMS for r in running.steps()))
        reply = running.stub.Generate(greedy_request(prompt_ids(LONG_PROMPT, seed=30), 1))
        for stream in streams:
            stream.cancel()
    finally:
        running.close()
    # While others decode, the prompt advances by the middle ladder rung per round: still on the ladder.
    assert reply.prefill.forwards == 22 and set(reply.prefill.widths) == {44}
    steps = running.steps()
    chunk_rounds = [r for r in steps if r.prefill]
    long_job = chunk_rounds[-1].prefill[0][0]
    long_rounds = [r for r in chunk_rounds if r.prefill[0][0] == long_job]
    assert len(long_rounds) == 22, "one prefill forward of the long prompt per round"
    assert all(len(r.prefill) == 1 for r in long_rounds)
    streaming = {job for r in long_rounds for job, _row in r.decode}
    assert len(streaming) == STREAMS
    for record in long_rounds:
        # Every chunk of the long prompt shares its round with one decode forward of all the streams.
        assert {job for job, _row in record.decode} == streaming, record
        assert record.batch == 4  # three rows on the batch ladder (1, 2, 4, 8, ...)


def test_concurrent_streams_share_one_decode_forward_per_token(served_model: Path) -> None:
    running = RunningServer(server_config(served_model, max_sessions=8, max_new_tokens=1000))
    try:
        streams = [
            running.stub.GenerateStream(greedy_request(prompt_ids(5 + 17 * i, seed=i), 600)) for i in range(6)
        ]
        wait_for(lambda: any(len(r.decode) == 6 for r in running.steps()))
        for stream in streams:
            stream.cancel()
        stats = running.stats()
        steps = running.steps()
    finally:
        running.close()
    together = [r for r in steps if len(r.decode) == 6]
    # Six sessions of different lengths advance in one forward, bound at the batch width 8.
    assert {r.batch for r in together} == {8}
    assert len({row for r in together for _job, row in r.decode}) == 6
    assert {w.batch for w in stats.decode.widths} <= set(stats.decode.batch_widths)
    assert stats.decode.steps < stats.decode.rows


def test_a_cancelled_stream_leaves_the_next_round_and_frees_its_slot(served_model: Path) -> None:
    running = RunningServer(server_config(served_model, max_new_tokens=1000))
    try:
        kept = running.stub.GenerateStream(greedy_request(prompt_ids(9, seed=1), 900))
        dropped = running.stub.GenerateStream(greedy_request(prompt_ids(12, seed=2), 900))
        next(kept), next(dropped)
        wait_for(lambda: running.stats().sessions_open == 2)
        dropped.cancel()
        wait_for(lambda: running.stats().sessions_open == 1)
        wait_for(lambda: any(r.closed for r in running.steps()))  # the round is logged as it ends
        wait_for(lambda: len(running.steps()[-1].decode) == 1)
        steps = running.steps()
        kept.cancel()
    finally:
        running.close()
    closing = [r for r in steps if r.closed]
    assert len(closing) == 1
    gone = closing[0].closed[0]
    # From the round that closed it on, the cancelled stream is in no decode forward.
    assert all(gone not in {job for job, _row in r.decode} for r in steps if r.round >= closing[0].round)
    assert any(len(r.decode) == 1 for r in steps if r.round >= closing[0].round)
