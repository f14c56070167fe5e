"""How many KV slots the pool gets: `--max-sessions`, or fewer where a memory budget cannot hold the
weights, that many slots' KV and the variants the engine plans beside them. Pure values."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.errors import Exhausted
from engine.executor.stats import kv_position_bytes, variant_bytes_estimate
from engine.model import ModelInfo
from engine.planner import batch_widths, prompt_batches


def variant_reserve(
    info: ModelInfo,
    ladder: Sequence[int],
    rows: int,
    batched: bool,
    prompts: Sequence[int] = (),
    padded: Sequence[int] = (),
) -> int:
    """Bytes the planned variants take: each prefill width, each decode batch width over `rows`,
    and where new prompts share a prefill forward (`prompts`: how many, at each `padded` width)
    those variants and the staging block they run in."""
    batches = batch_widths(rows) if batched else ()
    reserve = (
        sum(variant_bytes_estimate(info, w) for w in ladder)
        + sum(variant_bytes_estimate(info, 1, b) for b in batches)
        + prompt_reserve(info, padded, prompts)
    )
    return reserve or variant_bytes_estimate(info, 1)


def prompt_reserve(info: ModelInfo, ladder: Sequence[int], prompts: Sequence[int]) -> int:
    """Bytes prompts sharing a prefill forward take: a variant for each count of `prompts` at each
    `ladder` width, and the staging block of the most prompts at the widest width (`run_prompts`
    writes their KV there before it is copied into their rows)."""
    if not prompts or not ladder:
        return 0
    variants = sum(variant_bytes_estimate(info, w, p) for w in ladder for p in prompts)
    return variants + prompt_staging_bytes(info, max(prompts), max(ladder))


def prompt_staging_bytes(info: ModelInfo, prompts: int, positions: int) -> int:
    """The staging block of `prompts` rows of `positions` each: every layer's key and value."""
    return prompts * positions * kv_position_bytes(info)


def pool_rows(
    max_sessions: int, budget: int, weights: int, slot_bytes: int, reserve: Callable[[int], int]
) -> int:
    """The most rows up to `max_sessions` whose weights + KV + `reserve(rows)` fit `budget` (0: no
    budget); Exhausted when not even one does."""
    rows = max_sessions
    while budget and rows and weights + rows * slot_bytes + reserve(rows) > budget:
        rows -= 1
    if rows < 1:
        raise Exhausted(
            f"memory budget: {budget >> 20} MiB holds the weights ({weights >> 20} MiB) but "
            f"not one session's KV ({slot_bytes >> 20} MiB) and the variants"
        )
    return rows


def prompt_sizes(limit: int, rows: int, ladder: Sequence[int], batchable: bool) -> tuple[int, ...]:
    """How many new prompts one prefill forward may take (none: each prefills alone): up to the
    backend's `limit` and the pool's rows, where the model allows it (`batchable`: not the
    deterministic mode, whose rows follow the forward; a head that reads chosen rows) and padding
    puts widths on a `ladder` (else widths, and shapes, would be unbounded)."""
    if not batchable or not ladder:
        return ()
    return prompt_batches(min(limit, rows))
