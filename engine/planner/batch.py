"""Decode batches: which pool rows a decode forward binds, and at what batch width.

A decode forward binds the first B rows of the KV pool. B rounds up onto a
short ladder of its own (1, 2, 4, ... capped by the pool's rows), so the set of
decode shapes stays bounded whatever the arrival pattern. Rows inside [0, B)
that are not part of the step ride along: their outputs are dropped and their
length does not move, and they must write only where nothing is ever read.

New prompts' first chunks can share a prefill forward too (`prompt_groups`): B prompts of one
ladder width in one forward of B rows, B on a ladder of its own (`prompt_batches`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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


def prompt_batches(limit: int) -> tuple[int, ...]:
    """How many new prompts one prefill forward may take: powers of two from 2 up to `limit` (none
    below 2: every prompt prefills alone). A bounded set, as the decode widths are."""
    sizes = []
    size = 2
    while size <= limit:
        sizes.append(size)
        size *= 2
    return tuple(sizes)


@dataclass(frozen=True)
class PromptGroup:
    """New prompts' first chunks that run as one prefill forward of `size` prompts at `width`."""

    width: int
    size: int
    items: tuple[int, ...]  # the round's prefill items, in arrival order


def prompt_groups(widths: Sequence[int | None], sizes: Sequence[int]) -> tuple[PromptGroup, ...]:
    """Which prefill forwards of a round run together: `widths[i]` is item i's forward width when
    it may share a forward (a new prompt's first chunk on the ladder), else None. Items of one width
    go together in arrival order, as many as the widest size takes; a group's size is the smallest
    of `sizes` that holds it (the rest of its rows are empty). A lone item is left out: it runs
    as it always has, on its own."""
    if not sizes:
        return ()
    widest = max(sizes)
    by_width: dict[int, list[int]] = {}
    for i, width in enumerate(widths):
        if width is not None:
            by_width.setdefault(width, []).append(i)
    groups = []
    for width, items in by_width.items():
        for start in range(0, len(items), widest):
            part = tuple(items[start : start + widest])
            if len(part) > 1:
                groups.append(PromptGroup(width, next(s for s in sizes if s >= len(part)), part))
    return tuple(sorted(groups, key=lambda group: group.items[0]))
