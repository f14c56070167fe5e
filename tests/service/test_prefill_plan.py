"""How a round shares the device between prompts and decoding streams: pure values."""

from __future__ import annotations

from service.worker.rounds import MAX_PREFILLS_PER_ROUND, prefill_plan


def test_with_nothing_decoding_the_oldest_prompt_runs_one_whole_chunk() -> None:
    assert prefill_plan(1, False, 342) == (0,)
    assert prefill_plan(9, False, 342) == (0,)


def test_one_prompt_beside_decoding_streams_advances_by_the_shared_span() -> None:
    assert prefill_plan(1, True, 342) == (342,)


def test_a_burst_of_prompts_beside_decoding_streams_runs_whole_chunks_for_the_oldest_few() -> None:
    assert prefill_plan(2, True, 342) == (0, 0)
    assert prefill_plan(40, True, 342) == (0,) * MAX_PREFILLS_PER_ROUND


def test_no_prompt_waiting_runs_no_prefill() -> None:
    assert prefill_plan(0, True, 342) == () == prefill_plan(0, False, 342)


def test_an_engine_that_batches_prompts_is_offered_a_forwards_worth_of_them() -> None:
    assert prefill_plan(12, False, 342, prompt_batch=8) == (0,) * 8  # nothing decoding: one forward's worth
    assert prefill_plan(3, False, 342, prompt_batch=8) == (0,) * 3
    assert prefill_plan(12, True, 342, prompt_batch=8) == (0,) * 8
    assert prefill_plan(1, True, 342, prompt_batch=8) == (342,)  # one prompt beside streams: as before
    assert prefill_plan(12, True, 342, prompt_batch=2) == (0,) * MAX_PREFILLS_PER_ROUND
