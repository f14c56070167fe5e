"""The engine's bookkeeping, checked after every step (`Engine.check_invariants`): what must hold
between pool rows, open and parked sessions, held prefixes and the attention masks, as sentences a
failing check names. Read-only: it reports problems, the engine raises EngineFault for them."""

from __future__ import annotations

from collections.abc import Container, Mapping

from engine.executor.parking import Parking
from engine.executor.session import Session
from engine.runtime.pool import KvPool


def bookkeeping_problems(
    pool: KvPool,
    held: Container[int],
    in_flight: bool,
    open_rows: Mapping[int, Session],
    free: set[int],
    parking: Parking,
) -> list[str]:
    """Every pool row is free or owned by one open session, on its own row; a held prefix sits on a
        free row; a session holds no more tokens and fresh rows than its length; unless a forward is in
        flight (a lookahead), each open row's mask says its session's length; a session parked since the
        last check holds no row and a copy of exactly its length (a parked session cannot change until
        its next touch brings it back, so each is checked once: thousands may be parked). `held`: the rows
    held prefixes sit on; `in_flight`: whether a decode forward runs ahead."""
    rows = set(range(pool.rows))
    owned = set(open_rows)
    problems = []
    if owned & free or owned | free != rows:
        problems.append(f"rows owned {sorted(owned)} and free {sorted(free)} do not split the pool")
    problems += [f"row {r} holds a session of row {s.row}" for r, s in open_rows.items() if s.row != r]
    problems += [f"held prefix on row {r}, which a session owns" for r in owned if r in held]
    for s in open_rows.values():
        if len(s.tokens) > s.length or s.fresh > s.length or s.closed:
            problems.append(
                f"row {s.row}: {len(s.tokens)} tokens, {s.fresh} fresh, length {s.length}, closed {s.closed}"
            )
    for s in parking.unchecked:
        if (
            s not in parking.sessions
            or s.parked is None
            or s.row != -1
            or s.closed
            or int(s.parked.kv.shape[3]) != s.length
        ):
            problems.append(f"a parked session of length {s.length} holds row {s.row}, closed {s.closed}")
    parking.unchecked.clear()
    problems += [f"row {r} holds a parked session" for r, s in open_rows.items() if s.parked is not None]
    if not in_flight:
        lengths = pool.mask_lengths
        problems += [
            f"row {r}: mask {lengths[r]}, length {s.length}"
            for r, s in open_rows.items()
            if lengths[r] != s.length
        ]
    return problems
