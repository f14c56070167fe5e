"""The prefill plan: chunks of a prompt appended at any past length, and their widths.

A plan never runs past the KV capacity or the rotary cache: a forward whose
padded width would overrun either runs exact instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.planner.ladder import prefill_query_width
from engine.planner.padding import PaddingDecision, PaddingPolicy, PortShape, decide_padding


class CapacityExceeded(ValueError):
    """The prompt does not fit in the session's KV capacity."""

    def __init__(self, past: int, rows: int, capacity: int) -> None:
        super().__init__(f"{past} tokens in the session + {rows} new exceed the capacity of {capacity}")
        self.past, self.rows, self.capacity = past, rows, capacity


@dataclass(frozen=True)
class Limits:
    """How far a forward may reach: KV capacity and rotary cache rows (0 = no rotary limit)."""

    capacity: int
    rotary_rows: int = 0

    @property
    def reach(self) -> int:
        if self.rotary_rows <= 0:
            return self.capacity
        return min(self.capacity, self.rotary_rows)


@dataclass(frozen=True)
class Forward:
    """One forward: `rows` real rows taken from offset `start` of the appended tokens,
    run at query width `width` on top of `past` tokens already in the KV cache."""

    start: int
    rows: int
    width: int
    past: int

    @property
    def padded_rows(self) -> int:
        return self.width - self.rows


@dataclass(frozen=True)
class PrefillPlan:
    forwards: tuple[Forward, ...]
    padding: PaddingDecision

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(f.width for f in self.forwards)

    @property
    def real_rows(self) -> int:
        return sum(f.rows for f in self.forwards)

    @property
    def padded_rows(self) -> int:
        return sum(f.padded_rows for f in self.forwards)


def chunk_spans(rows: int, chunk: int) -> tuple[tuple[int, int], ...]:
    """(start, rows) of each chunk; chunk <= 0 means one whole-prompt forward.

    A one-row last chunk borrows the row before it (513 at 512: 511 + 2): a single row would
    run the decode shape, whose arithmetic differs (int4 MatMulNBits by up to 0.7 nats), so
    every row of a multi-row prompt is computed in a multi-row forward."""
    if rows <= 0:
        return ()
    if chunk <= 0:
        return ((0, rows),)
    spans = [(s, min(chunk, rows - s)) for s in range(0, rows, chunk)]
    if len(spans) > 1 and spans[-1][1] == 1 and chunk > 1:
        spans[-2:] = [(spans[-2][0], chunk - 1), (spans[-1][0] - 1, 2)]
    return tuple(spans)


def plan_prefill(
    past: int,
    rows: int,
    chunk: int,
    limits: Limits,
    policy: PaddingPolicy | None = None,
    ports: tuple[PortShape, ...] = (),
    span: int = 0,
) -> PrefillPlan:
    """Plan `rows` new tokens appended after `past` tokens.

    `span` (0 = the chunk) caps the real rows of each forward below the chunk width, so a
    prompt can advance in smaller steps between other sessions' decode forwards; widths
    still come from the chunk's ladder, so no new shape appears.
    """
    if rows <= 0:
        raise ValueError("a prefill needs at least one token")
    if past < 0 or past + rows > limits.reach:
        raise CapacityExceeded(past, rows, limits.reach)
    padding = decide_padding(policy or PaddingPolicy(), rows, ports)
    forwards = []
    step = min(span, chunk) if span > 0 and chunk > 0 else chunk
    for start, n in chunk_spans(rows, step):
        at = past + start
        width = prefill_query_width(n, chunk) if padding.allowed else n
        if at + width > limits.reach:
            # Padding must never write past the cache or the rotary table: run exact.
            width = n
        forwards.append(Forward(start=start, rows=n, width=width, past=at))
    return PrefillPlan(tuple(forwards), padding)
