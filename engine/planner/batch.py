"""Decode batches: which pool rows a decode forward binds, and at what batch width.

A decode forward binds the first B rows of the KV pool. B rounds up onto a
short ladder of its own (1, 2, 4, ... capped by the pool's rows), so the set of
decode shapes stays bounded whatever the arrival pattern. Rows inside [0, B)
that are not part of the step ride along: their outputs are dropped and their
length does not move, and they must write only where nothing is ever read.
"""

from __future__ import annotations


def batch_widths(rows: int) -> tuple[int, ...]:
    """The decode batch ladder for a pool of `rows`: powers of two below it, then `rows` itself."""
    if rows < 1:
        return ()
    widths = []
    width = 1
    while width < rows:
        widths.append(width)
        width *= 2
    widths.append(rows)
    return tuple(widths)


def decode_batch_width(highest_row: int, rows: int) -> int:
    """The smallest batch width on the ladder that binds pool rows 0..highest_row."""
    if not 0 <= highest_row < rows:
        raise ValueError(f"row {highest_row} is outside a pool of {rows} rows")
    return next(w for w in batch_widths(rows) if w > highest_row)


def ride_along_length(length: int, reach: int) -> int:
    """The mask length a row that rides along in a decode forward is given for that forward.

    GQA writes a row's new KV at position mask_length - 1. One past the row's
    real length is never read (the same argument as rewinding after padded rows).
    A full row has no such position: it is given its own length, so the forward
    rewrites its last position. A full row is never extended, and any rewind
    re-runs its last kept token, so that position is overwritten before it is read.
    """
    return length + 1 if length < reach else length
