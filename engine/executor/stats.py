"""What the engine reports and the memory budget adds up: plain values and the byte estimates."""

from __future__ import annotations

from dataclasses import dataclass

from engine.executor.decode import DecodeCounters
from engine.executor.exactness import KernelRules
from engine.model import ModelInfo, decoder_file
from engine.runtime.cpu import _dtype
from engine.runtime.variants import VariantStats


@dataclass(frozen=True)
class MemoryUse:
    """What the memory budget adds up: weights, the KV pool, variants held."""

    weights: int
    kv: int
    variants: int
    budget: int  # 0 = no budget

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.variants


@dataclass(frozen=True)
class DecodeStats:
    steps: int  # decode forwards run
    rows: int  # session rows they advanced
    ride_along_rows: int  # rows bound without being part of the step
    widths: tuple[tuple[int, int], ...]  # (batch width, forwards run at it)
    lookahead_hits: int = 0  # forwards launched ahead that the next step took
    lookahead_misses: int = 0  # ... and dropped (rows left, joined, or fed other tokens)
    lookahead_launched: int = 0  # every forward launched ahead (taken, dropped, or still pending)
    chained: int = 0  # hits whose next forward the device queued behind its own greedy choice
    rows_moved: int = 0  # sessions moved to a lower row so a forward's width follows the rows decoding
    verify_forwards: int = 0  # forwards that verified a drafted row (speculative decoding)
    drafted: int = 0  # drafted tokens they checked
    accepted: int = 0  # ... and kept (each forward also yields one token of its own)
    accepted_per_forward: tuple[tuple[int, int], ...] = ()  # (drafted tokens kept, forwards)


@dataclass(frozen=True)
class PrefixStats:
    """Prefix reuse since start: prompts that started from a held prefix, forks, and the free rows
    that keep a finished session's KV for the next prompt that starts with it."""

    enabled: bool = False
    lookups: int = 0  # prompts looked up (prompts appended to an empty session)
    hits: int = 0  # ... that started from a held prefix
    tokens_saved: int = 0  # prompt tokens copied instead of prefilled
    forks: int = 0
    rows_held: int = 0  # free pool rows keeping a prefix now
    bytes_held: int = 0  # the KV of those prefixes (inside the pool: no memory beyond the budget)
    evictions: int = 0  # held prefixes dropped because a session needed their row


@dataclass(frozen=True)
class ParkingStats:
    """Sessions beyond slots: those parked off the pool now, their bytes, and the moves so far."""

    sessions_parked: int = 0
    parked_bytes: int = 0
    parks: int = 0
    unparks: int = 0
    park_seconds: float = 0.0
    unpark_seconds: float = 0.0
    released_bytes: int = 0  # KV pages of free rows handed back to the system (CPU)
    device_bytes: int = 0  # of parked_bytes, those in device memory (CUDA; the rest is host memory)
    spills: int = 0  # parked copies moved from device to host memory


@dataclass(frozen=True)
class EngineStats:
    variants: VariantStats
    eager_forwards: int
    sessions_open: int
    sessions_padding_off: int
    slots_allocated: int
    slot_bytes: int
    memory: MemoryUse
    decode: DecodeStats
    batch_widths: tuple[int, ...]
    unbatched_reason: str  # why decode runs one session per forward ("" when it batches)
    prefix: PrefixStats = PrefixStats()
    parking: ParkingStats = ParkingStats()
    prompt_forwards: int = 0  # prefill forwards that ran several new prompts at once
    prompts_batched: int = 0  # the prompts they ran
    prompt_batch: int = 1  # most new prompts one prefill forward takes (1: each prefills alone)
    kernels: KernelRules | None = None  # the exactness rules measured at load (kernels.py)


def kv_slot_bytes(info: ModelInfo, capacity: int) -> int:
    """One pool row: every layer's key and value at capacity, its mask and its next-token logits."""
    itemsize = _dtype(info.kv_dtype).itemsize
    kv = 2 * info.num_layers * info.num_kv_heads * capacity * info.head_size * itemsize
    return kv + capacity * 8 + info.vocab_size * _dtype(info.logits.dtype).itemsize


def kv_position_bytes(info: ModelInfo) -> int:
    """The KV of one token position in one pool row: every layer's key and value."""
    return 2 * info.num_layers * info.num_kv_heads * info.head_size * _dtype(info.kv_dtype).itemsize


def variant_bytes_estimate(info: ModelInfo, width: int, batch: int = 0) -> int:
    """The input and logits buffers of one variant of `width` rows over `batch` pool rows (0: a
    prefill on one row); a capture's workspace comes on top. A graph that gathers the rows it
    reads before its head returns one logits row per pool row, not one per query row."""
    rows = max(batch, 1) * width
    if not info.logits_rows:
        return rows * (8 + info.vocab_size * _dtype(info.logits.dtype).itemsize)
    read_and_seen = 3 * 8
    return rows * 8 + read_and_seen + max(batch, 1) * info.vocab_size * _dtype(info.logits.dtype).itemsize


def model_file_bytes(info: ModelInfo) -> int:
    """Weights on disk: the graph file and its external data."""
    graph = decoder_file(info.path, info.config)  # the user's file, not a rewritten copy (info.graph)
    return sum(p.stat().st_size for p in graph.parent.glob(graph.name + "*") if p.is_file())


def decode_stats(c: DecodeCounters) -> DecodeStats:
    """The decoder's counters as the engine's stats report them."""
    return DecodeStats(
        c.steps,
        c.rows,
        c.ride_along_rows,
        tuple(sorted(c.batch_use.items())),
        c.lookahead_hits,
        c.lookahead_misses,
        c.lookahead_launched,
        c.chained,
        c.rows_moved,
        c.verify_forwards,
        c.drafted,
        c.accepted,
        tuple(sorted(c.accepted_use.items())),
    )
