"""The planner's exactness rules: which rows a session computes again, and when its rows count as fresh.

A fresh run of a prompt is `plan_prefill(0, length, ...)`. These tests state, over many lengths,
that the rules keep every kept row in the shape class a fresh run computes it in, and in the
deterministic mode that the forwards are the fresh run's own.
"""

from __future__ import annotations

import itertools

from engine.planner import (
    Limits,
    chunk_spans,
    fresh_after,
    last_span_start,
    plan_prefill,
    recompute_from,
)

ROOMY = Limits(capacity=8192)
CHUNK = 64


def fresh_run(length: int, chunk: int = CHUNK) -> list[tuple[int, int, int]]:
    """(past, rows, width) of each forward of a fresh run of `length` tokens."""
    return [(f.past, f.rows, f.width) for f in plan_prefill(0, length, chunk, ROOMY).forwards]


def fresh_of(forwards: list[tuple[int, int, int]], deterministic: bool, chunk: int = CHUNK) -> int:
    fresh = 0
    for past, rows, width in forwards:
        fresh = fresh_after(fresh, past, rows, width, chunk, deterministic)
    return fresh


def test_no_multi_row_prompt_computes_a_row_in_a_one_row_forward() -> None:
    for length in range(2, 5 * CHUNK):
        assert all(rows >= 2 for _, rows in chunk_spans(length, CHUNK)), length
        assert sum(rows for _, rows in chunk_spans(length, CHUNK)) == length


def test_a_one_row_last_chunk_borrows_the_row_before_it() -> None:
    assert chunk_spans(513, 512) == ((0, 511), (511, 2))
    assert plan_prefill(0, 513, 512, ROOMY).widths == (512, 171)
    assert chunk_spans(512, 512) == ((0, 512),)
    assert chunk_spans(1, 512) == ((0, 1),)


def test_the_last_span_starts_where_a_fresh_runs_last_forward_does() -> None:
    for length in range(1, 4 * CHUNK):
        assert last_span_start(length, CHUNK) == fresh_run(length)[-1][0]


def test_a_default_restore_computes_at_least_two_rows_again() -> None:
    for length in range(2, 3 * CHUNK):
        start = recompute_from(length, length, length, CHUNK, deterministic=False)
        assert start == length - 2


def test_a_default_restore_computes_rows_a_decode_step_wrote_again() -> None:
    assert recompute_from(held=120, fresh=100, target=120, chunk=CHUNK, deterministic=False) == 100


def test_a_one_token_extension_computes_the_row_before_it_again() -> None:
    assert recompute_from(held=40, fresh=40, target=41, chunk=CHUNK, deterministic=False) == 39
    assert recompute_from(held=40, fresh=10, target=41, chunk=CHUNK, deterministic=False) == 39


def test_a_default_extension_of_several_tokens_continues_after_what_the_session_holds() -> None:
    assert recompute_from(held=120, fresh=100, target=130, chunk=CHUNK, deterministic=False) == 120


def test_a_one_token_prompt_runs_alone() -> None:
    assert recompute_from(0, 0, 1, CHUNK, deterministic=False) == 0
    assert recompute_from(1, 1, 1, CHUNK, deterministic=True) == 0


def test_fresh_rows_grow_only_with_multi_row_forwards_that_join_them() -> None:
    assert fresh_after(0, 0, 30, 43, CHUNK, deterministic=False) == 30
    assert fresh_after(30, 30, 1, 1, CHUNK, deterministic=False) == 30  # a decode-shaped row
    assert fresh_after(30, 31, 5, 22, CHUNK, deterministic=False) == 30  # after a decode-written row


def test_deterministic_fresh_rows_are_only_those_of_whole_chunk_forwards() -> None:
    assert fresh_of(fresh_run(100), deterministic=True) == 64
    assert fresh_of(fresh_run(129), deterministic=True) == 127  # 63 + 64 borrowed: still chunk width
    assert fresh_of(fresh_run(40), deterministic=True) == 0


def test_deterministic_forwards_from_any_held_state_are_a_fresh_runs_own() -> None:
    """From whatever a session holds of a fresh run (some rows fresh, the rest decode-written),
    extending or restoring it to `target` runs exactly the fresh run's forwards of `target`."""
    for first, target in itertools.product(range(1, 3 * CHUNK, 7), range(1, 3 * CHUNK, 5)):
        fresh = fresh_of(fresh_run(first), deterministic=True)
        for held in {min(first, target), min(first + 9, target)}:  # + rows a decode step wrote
            start = recompute_from(held, min(fresh, held), target, CHUNK, deterministic=True)
            assert start <= held
            plan = plan_prefill(start, target - start, CHUNK, ROOMY)
            ran = [(f.past, f.rows, f.width) for f in plan.forwards]
            assert ran == [f for f in fresh_run(target) if f[0] >= start], (first, held, target)


def test_default_forwards_keep_every_row_in_a_multi_row_forward() -> None:
    for held, target in itertools.product(range(0, 2 * CHUNK, 3), range(1, 2 * CHUNK, 4)):
        if target < held or target < 2:
            continue
        start = recompute_from(held, held, target, CHUNK, deterministic=False)
        plan = plan_prefill(start, target - start, CHUNK, ROOMY)
        assert all(f.rows >= 2 for f in plan.forwards), (held, target)
