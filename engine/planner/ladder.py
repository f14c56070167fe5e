"""The query-width ladder: every prefill forward runs at one of three widths.

For a chunk width (cap) of 512 the ladder is {171, 342, 512}. The variant cache holds
these three widths and the decode forward's batch widths (engine/planner/batch.py), so a
server prepares every shape it will ever run once, whatever its traffic.
"""

MIN_STEP = 16
STEPS = 3


def step_for(cap: int) -> int:
    """The ladder step for a chunk width: ceil(cap / 3), never below 16."""
    # Round the step up so the top rung lands exactly on the chunk width.
    return max(-(-cap // STEPS), MIN_STEP)


def prefill_query_width(rows: int, cap: int) -> int:
    """The padded query width for a forward of `rows` real rows under chunk width `cap`.

    Single rows, a zero cap and rows beyond the cap run exact; anything else
    rounds up to the next multiple of the step, clamped to the cap.
    """
    if rows <= 1 or cap <= 0 or rows > cap:
        return rows
    step = step_for(cap)
    width = min(-(-rows // step) * step, cap)
    return max(width, rows)


def ladder_widths(cap: int) -> tuple[int, ...]:
    """Every width `prefill_query_width` can return for rows in 2..cap, ascending."""
    if cap <= 1:
        return ()
    step = step_for(cap)
    rungs = {min(k * step, cap) for k in range(1, -(-cap // step) + 1)}
    return tuple(sorted(w for w in rungs if w >= 2))


DEFAULT_CHUNK = 512


def chunk_width(declared: int | None, override: int | None, capacity: int) -> int:
    """The chunk width in effect: the server's override (0 = no chunking) wins, then the
    model's own declaration; a model that declares none gets DEFAULT_CHUNK, clamped to the
    capacity, so its prefill shapes stay bounded like any other model's."""
    if override is not None:
        return override
    if declared is not None:
        return declared
    return min(DEFAULT_CHUNK, capacity) if capacity > 0 else DEFAULT_CHUNK


def prefix_unit(cap: int) -> int:
    """The unit a held prompt prefix is shared in: the ladder step of chunk width `cap` (171 for 512).

    A shared prefix ends on a multiple of it, so it falls short of what a later prompt repeats by less
    than one step (a whole chunk would leave up to 511 tokens of a repeated system prompt to prefill
    again); the rest is planned from there like any prefill, its widths on the ladder. 0: no sharing.
    """
    return step_for(cap) if cap > 0 else 0
