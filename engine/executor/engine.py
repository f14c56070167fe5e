"""The engine: one model, one backend, a pool of KV slots and the variant cache.

Not thread-safe by design: the service runs every forward on one worker,
which is what lets it interleave one request's prefill with others' decode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from engine.errors import Exhausted
from engine.executor.cpu import CpuBackend, _dtype
from engine.executor.options import EngineOptions
from engine.executor.sampling import Sampler
from engine.executor.session import Session
from engine.executor.variants import VariantCache, VariantKey, VariantStats
from engine.model import ModelInfo, load_model_info
from engine.planner import Limits, ladder_widths

log = structlog.get_logger("ladder.engine")


@dataclass(frozen=True)
class MemoryUse:
    """What the memory budget adds up: weights, KV slots allocated, variants held."""

    weights: int
    kv: int
    variants: int
    budget: int  # 0 = no budget

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.variants


@dataclass(frozen=True)
class EngineStats:
    variants: VariantStats
    eager_forwards: int
    sessions_open: int
    sessions_padding_off: int
    slots_allocated: int
    slot_bytes: int
    memory: MemoryUse


def kv_slot_bytes(info: ModelInfo, capacity: int) -> int:
    """One session's KV (every layer's key and value at capacity) and its mask."""
    itemsize = _dtype(info.kv_dtype).itemsize
    return 2 * info.num_layers * info.num_kv_heads * capacity * info.head_size * itemsize + capacity * 8


def variant_bytes_estimate(info: ModelInfo, width: int) -> int:
    """The input and logits buffers of one variant (a capture's workspace comes on top on CUDA)."""
    return width * (8 + info.vocab_size * _dtype(info.logits.dtype).itemsize)


def model_file_bytes(info: ModelInfo) -> int:
    """Weights on disk: the graph file and its external data."""
    name = info.config["model"]["decoder"].get("filename", "model.onnx")
    return sum(p.stat().st_size for p in info.path.glob(name + "*") if p.is_file())


def make_backend(info: ModelInfo, options: EngineOptions) -> Any:
    """The backend for `options.provider`; "cuda" falls back to CPU, with a log line, when unusable."""
    if options.provider == "cuda":
        from engine.executor.cuda import CudaBackend, CudaUnavailable  # imports cupy only when built

        try:
            return CudaBackend(info, options)
        except CudaUnavailable as exc:
            log.warning("cuda_unavailable_falling_back_to_cpu", reason=str(exc))
    return CpuBackend(info, options)


class Engine:
    def __init__(self, info: ModelInfo, options: EngineOptions, backend: Any) -> None:
        self.info = info
        self.options = options
        self.backend = backend
        self.chunk_size = info.chunk_size if options.chunk_size is None else options.chunk_size
        wanted = options.capacity or info.max_length
        self.limits = Limits(capacity=wanted, rotary_rows=info.rotary_rows)
        self.capacity = self.limits.reach
        self.ladder = ladder_widths(self.chunk_size)
        self.feed_dtype = _dtype(info.feed.dtype)
        self.port_dtypes = {p.name: _dtype(p.dtype) for p in info.supplied_ports}
        self.variants: VariantCache[Any] = VariantCache(
            options.variant_capacity, evictable=getattr(backend, "evictable", True))
        self._slots: list[Any] = []
        self._free: list[int] = []
        self._in_use: set[int] = set()
        self.eager_forwards = 0
        self.sessions_padding_off = 0
        self.slot_bytes = kv_slot_bytes(info, self.capacity)
        self.weights_bytes = getattr(backend, "weights_bytes", 0) or model_file_bytes(info)

    @classmethod
    def load(cls, path: Path | str, options: EngineOptions | None = None) -> Engine:
        options = options or EngineOptions()
        info = load_model_info(Path(path))
        engine = cls(info, options, make_backend(info, options))
        log.info("engine_loaded", model=str(path), provider=engine.backend.name,
                 capacity=engine.capacity, chunk=engine.chunk_size, ladder=engine.ladder,
                 padding=options.padding, recurrent=info.recurrent_state)
        return engine

    # -- sessions and slots -----------------------------------------------------
    def open_session(self) -> Session:
        if self._free:
            index = self._free.pop()
        elif len(self._slots) < self.options.max_sessions:
            self._admit_slot()
            self._slots.append(self.backend.new_slot(self.capacity))
            index = len(self._slots) - 1
        else:
            raise Exhausted(f"all {self.options.max_sessions} sessions are in use")
        self._in_use.add(index)
        slot = self._slots[index]
        slot.set_length(0)
        slot.clear_state()
        return Session(self, index)

    def _admit_slot(self) -> None:
        """Refuse a new KV slot the memory budget cannot hold next to a full variant cache."""
        budget = self.options.memory_budget_bytes
        if not budget:
            return
        use = self.memory()
        # Variants still to come are bounded: reserve what the rest of the ladder would take.
        full_cache = sum(variant_bytes_estimate(self.info, w) for w in (*self.ladder, 1))
        needed = use.total + self.slot_bytes + max(0, full_cache - use.variants)
        if needed > budget:
            raise Exhausted(
                f"memory budget: a new session needs {needed >> 20} MiB of {budget >> 20} MiB "
                f"(weights {use.weights >> 20}, KV {use.kv >> 20}, variants {use.variants >> 20})")

    def memory(self) -> MemoryUse:
        return MemoryUse(weights=self.weights_bytes, kv=len(self._slots) * self.slot_bytes,
                         variants=self.variants.stats().nbytes, budget=self.options.memory_budget_bytes)

    def slot(self, index: int) -> Any:
        return self._slots[index]

    def release_slot(self, index: int) -> None:
        if index in self._in_use:
            self._in_use.remove(index)
            self._free.append(index)

    @property
    def sessions_open(self) -> int:
        return len(self._in_use)

    def note_padding_off(self) -> None:
        self.sessions_padding_off += 1

    # -- forwards -----------------------------------------------------------------
    def run_forward(self, slot: Any, past: int, feed: np.ndarray,
                    ports: Mapping[str, np.ndarray],
                    constants: Mapping[str, np.ndarray]) -> np.ndarray:
        key = VariantKey(feed.shape[1], tuple(sorted(ports)))
        variant = self.variants.get(key, self.backend.prepare)
        if variant is None:
            # A backend that cannot release variants runs uncached shapes eagerly.
            self.eager_forwards += 1
            return self.backend.run_eager(slot, past, feed, ports, constants)  # type: ignore[no-any-return]
        return self.backend.run(variant, slot, past, feed, ports, constants)  # type: ignore[no-any-return]

    def to_host(self, logits: Any) -> np.ndarray:
        """A host copy of logits the backend returned (device arrays on CUDA)."""
        to_host = getattr(self.backend, "to_host", None)
        return np.array(logits, copy=True) if to_host is None else to_host(logits)  # type: ignore[no-any-return]

    def choose(self, row: Any, sampler: Sampler, history: Sequence[int]) -> int:
        """The next token from one logits row, chosen where the row lives."""
        choose = getattr(self.backend, "choose", None)
        return sampler(row, history) if choose is None else int(choose(row, sampler, history))

    def stats(self) -> EngineStats:
        return EngineStats(
            variants=self.variants.stats(), eager_forwards=self.eager_forwards,
            sessions_open=self.sessions_open, sessions_padding_off=self.sessions_padding_off,
            slots_allocated=len(self._slots), slot_bytes=self.slot_bytes, memory=self.memory(),
        )

    def close(self) -> None:
        self.variants.clear()
        self._slots.clear()
