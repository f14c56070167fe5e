"""The decode batch planner's promises, stated as invariants over pure values."""

from __future__ import annotations

import pytest

from engine.planner import batch_widths, decode_batch_width, ride_along_length

POOLS = range(1, 130)


def test_every_decode_batch_width_is_on_the_batch_ladder() -> None:
    for rows in POOLS:
        ladder = set(batch_widths(rows))
        for highest in range(rows):
            assert decode_batch_width(highest, rows) in ladder


def test_a_batch_width_binds_the_highest_row() -> None:
    for rows in POOLS:
        ladder = batch_widths(rows)
        for highest in range(rows):
            width = decode_batch_width(highest, rows)
            assert highest < width <= rows
            # ...and is the narrowest ladder width that does.
            assert all(w <= highest for w in ladder if w < width)


def test_a_batch_width_binds_fewer_than_twice_the_rows_it_needs() -> None:
    for rows in POOLS:
        for highest in range(rows):
            assert decode_batch_width(highest, rows) < 2 * (highest + 1)


def test_the_batch_ladder_ends_at_the_pool_size() -> None:
    for rows in POOLS:
        ladder = batch_widths(rows)
        assert ladder[0] == 1 and ladder[-1] == rows
        assert list(ladder) == sorted(set(ladder))
        # Powers of two below the pool size: at most log2(rows) + 1 decode shapes.
        assert all(w & (w - 1) == 0 for w in ladder[:-1])
        assert len(ladder) <= rows.bit_length() + 1
    assert batch_widths(8) == (1, 2, 4, 8)
    assert batch_widths(6) == (1, 2, 4, 6)
    assert batch_widths(1) == (1,)


def test_an_empty_pool_has_no_batch_ladder() -> None:
    assert batch_widths(0) == ()


@pytest.mark.parametrize("highest", [-1, 8, 9])
def test_a_row_outside_the_pool_is_refused(highest: int) -> None:
    with pytest.raises(ValueError):
        decode_batch_width(highest, 8)


def test_a_ride_along_row_writes_past_its_length_unless_it_is_full() -> None:
    for reach in (1, 2, 128, 4096):
        for length in range(min(reach, 300)):
            # The forward writes at mask length - 1 == length: a position never read.
            assert ride_along_length(length, reach) == length + 1
        # A full row has no such position: it keeps its own length (rewrites its last position).
        assert ride_along_length(reach, reach) == reach


def test_a_ride_along_row_never_reaches_past_the_capacity() -> None:
    for reach in (1, 2, 128):
        for length in range(reach + 1):
            assert 1 <= ride_along_length(length, reach) <= reach
