"""A session: one sequence's state. The engine carries out every forward; a Session only remembers.

It holds the pool row its KV lives in (or, parked, its KV off the pool), the tokens and length
the KV holds, how many leading rows were computed as a fresh run computes them,
whether its next-token logits are held (in the backend's logits store, row
`row`), whether padding is still on for it, and its forward counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SessionStats:
    forwards: int = 0
    real_rows: int = 0
    padded_rows: int = 0
    self_check_reruns: int = 0
    decode_steps: int = 0


@dataclass(eq=False)
class Session:
    row: int
    length: int = 0
    tokens: list[int] = field(default_factory=list)
    padding_on: bool = True  # turned off for good by a self-check trip
    has_logits: bool = False  # next-token logits of the tokens held are in the logits store
    fresh: int = 0  # leading rows written as a fresh run writes them (engine.planner.restore)
    closed: bool = False
    scope: str = ""  # who may share its prefixes ("" = anyone): the caller when auth keeps them apart
    stats: SessionStats = field(default_factory=SessionStats)
    # Parking (sessions beyond slots): `parked` holds its KV and logits while it has no pool row
    # (row -1); `parkable` says nobody is using it, so it may leave its row for one who needs it
    # (the service sets it between calls); `used` orders the parkable least recently used first.
    parked: Any = None
    parkable: bool = False
    used: int = 0
