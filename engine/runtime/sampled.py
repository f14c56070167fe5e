"""Sampled tokens of a step's rows in one kernel on the device: for each row, its constraint's mask,
temperature, top-k, min-p and top-p, then a draw from a counter-based generator (engine.sampling's
Philox4x64-10, keyed by the row's seed, counted by the token's position), a cluster of blocks per
row: up to 8 when few rows leave processors idle (compute capability 9.0+), so one row's passes over
its vocabulary run on 8 processors, not 1 (the kernel is on a one-stream step's critical path).

Only token ids cross to the host. A row's token depends on nothing but its own logits, parameters,
key and position: no other row, no batch width, no thread timing. Every sum a choice depends on is
an integer sum (each kept token's weight in fixed point, 2^-(62 - ceil(log2 vocab)) of the most
likely token's), so the kernel gives the same token on every run.

The semantics are engine.sampling's, computed another way:
- the weight of a token is exp((logit - max) / temperature) in float32 (the host: float64);
- top-k keeps every token at least as large as the k-th largest scaled logit, ties included;
- min-p keeps the tokens whose weight is at least min_p (the most likely token's weight is 1);
- top-p keeps the shortest prefix of the kept tokens by falling weight (ties: the lower id first)
  whose mass reaches top_p of theirs. The cut is found by a radix select over the weights' bits
  (four passes of 256-bin histograms of mass, each warp's own, equal bins summed in the warp
  before one write: no atomics), not by a sort;
- the draw is the inverse CDF in id order at the row's uniform, as the host's `draw`.
So the host and the device draw the same token except where float32 and float64 round a weight, a
cut or the draw's edge differently: the same seed gives the same tokens on one backend at any
load, and CPU and CUDA agree on most tokens, not all (docs/api.md). Tokens whose weight is below
one unit of the fixed point (< 2^-45 of the most likely on a 128k vocabulary) are never drawn.

Greedy rows (temperature 0 or top-k 1) take engine.runtime.greedy's argmax in the same launch, so a
step that mixes them costs one kernel. Chained (decode.py's chain), the kernel also writes each
row's token into the next forward's inputs, as the greedy kernel does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import structlog

from engine.runtime.cuda_runtime import Placement
from engine.runtime.sampled_source import SOURCE

# A chained launch's pool rows, their next positions, and the next forward's ids, mask and positions.
Chain = tuple[Sequence[int], Sequence[int], np.ndarray, np.ndarray, "np.ndarray | None"]

THREADS = 512  # 16 warps per block; warp w of block r owns the (16r + w)-th chunk of a row's ids
CLUSTERS = (8, 4, 2, 1)  # blocks per row the kernel is built for (8: the portable cluster limit)

_KERNELS: dict[tuple[int, int], Any] = {}
log = structlog.get_logger("ladder.engine")


def _kernel(xp: Any, cluster: int = 1) -> Any:
    kernel = _KERNELS.get((id(xp), cluster))
    if kernel is None:
        kernel = _KERNELS[(id(xp), cluster)] = xp.RawKernel(
            f"#define CLUSTER {cluster}\n{SOURCE}", "sample_rows"
        )
    return kernel


def cluster_size(rows: int, processors: int, sizes: Sequence[int] = CLUSTERS) -> int:
    """Blocks per row for a launch of `rows` rows: the largest of `sizes` whose blocks all fit the
    device's processors at once (one row: 8), else the smallest (many rows fill the device alone)."""
    for size in sorted(sizes, reverse=True):
        if rows * size <= processors:
            return size
    return min(sizes)


def cluster_sizes(xp: Any) -> tuple[int, ...]:
    """The cluster sizes this device can launch: 8, 4, 2 and 1 from compute capability 9.0 (thread
    block clusters with distributed shared memory), else 1."""
    return CLUSTERS if int(xp.cuda.Device().compute_capability) >= 90 else (1,)


def fixed_point_scale(vocab: int) -> float:
    """Units per weight 1.0: the whole vocabulary's weights sum below 2^62 (no u64 overflow)."""
    return math.ldexp(1.0, 62 - max(1, math.ceil(math.log2(max(vocab, 2)))))


def built(xp: Any, sizes: Sequence[int]) -> tuple[int, ...]:
    """The kernels of `sizes` blocks per row, compiled: those NVRTC builds (a cluster kernel a
    toolkit cannot build leaves the launches to one block per row, as before clusters, and says so)."""
    made = []
    for size in sizes:
        try:
            _ = _kernel(xp, size).kernel
            made.append(size)
        except Exception as exc:  # NVRTC's CompileException, or a driver without clusters
            if size == 1:
                raise
            log.warning("sampling_cluster_unavailable", blocks_per_row=size, error=str(exc)[:200])
    return tuple(made)


class SampledRows:
    """Chooses up to `rows` tokens per call on the device, each row sampled with its own parameters
    (a greedy row takes the argmax), from logits wherever they lie: a pool row of the logits store
    (`dtype`) or a float32 row the caller made (a penalized one)."""

    def __init__(self, rt: Placement, rows: int, dtype: Any, vocab: int) -> None:
        self.rt = rt
        self.vocab = vocab
        self.dtype = np.dtype(dtype)
        self.scale = fixed_point_scale(vocab)
        zeros = rt.host_zeros
        self.pointers = zeros((rows,), np.uint64)
        self.f32 = zeros((rows,), np.int32)
        self.slots = zeros((rows,), np.int64)
        self.temperature = zeros((rows,), np.float32)
        self.top_k = zeros((rows,), np.int64)
        self.top_p = zeros((rows,), np.float64)
        self.min_p = zeros((rows,), np.float64)
        self.keys = zeros((rows,), np.uint64)
        self.counters = zeros((rows,), np.uint64)
        self.out = zeros((rows,), np.int64)
        self.rows = zeros((rows,), np.int64)
        self.grow = zeros((rows,), np.int64)
        # Each row's per-token scratch on the device (a scaled logit's key, then a kept weight's bits):
        # the kernel computes a token's weight once, not in each of its ~10 passes.
        with rt.enter():
            self.scratch = rt.xp.zeros((rows, vocab), np.uint32)
            self.processors = int(rt.xp.cuda.Device().attributes["MultiProcessorCount"])
        self.sizes = built(rt.xp, cluster_sizes(rt.xp))  # compiled (or read from disk) now, not mid-step
        self.cluster: int | None = None  # None: chosen per launch by cluster_size; else this one

    def set(self, i: int, logits: Any, params: Any, key: int, position: int, slot: int = -1) -> None:
        """Row i of the next launch: its logits (a device row), parameters (SamplingParams), key,
        the position of the token it chooses, and its constraint's mask-table slot (-1: none)."""
        self.fill(i, [logits.data.ptr], [logits.dtype == np.float32], [params], [key], [position], [slot])

    def fill(
        self,
        start: int,
        pointers: Sequence[int],
        wide: Sequence[bool],
        params: Sequence[Any],
        keys: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int] | None = None,
    ) -> None:
        """Rows start, start + 1, ... of the next launch at once (one store per field, not per row
        and field: a 64-row step's parameters cost ~30 us here, not ~0.5 ms): each row's logits
        address, whether they are float32 (else float16), SamplingParams, key, the position of the
        token it chooses, and its mask-table slot (None: no row constrained)."""
        end = start + len(pointers)
        self.pointers[start:end] = pointers
        self.f32[start:end] = wide
        self.slots[start:end] = -1 if slots is None else slots
        self.temperature[start:end] = [p.temperature for p in params]
        self.top_k[start:end] = [p.top_k for p in params]
        self.top_p[start:end] = [p.top_p for p in params]
        self.min_p[start:end] = [p.min_p for p in params]
        self.keys[start:end] = keys
        self.counters[start:end] = positions

    def launch(self, n: int, table: Any = None, chain: Chain | None = None) -> Any:
        """Queue the kernel over the n rows set, on the backend's stream. With `chain` (pool rows,
        next positions, next ids, mask, positions), also write each token into the next forward's
        inputs. Returns an event the tokens are ready at (`chosen`)."""
        tail: tuple[Any, ...] = (
            np.uint64(0),
            np.uint64(0),
            np.uint64(0),
            np.int64(0),
            np.uint64(0),
            np.uint64(0),
        )
        if chain is not None:
            rows, grow, next_ids, mask, positions = chain
            self.rows[:n] = rows
            self.grow[:n] = grow
            tail = (
                np.uint64(self.rows.ctypes.data),
                np.uint64(next_ids.ctypes.data),
                np.uint64(mask.ctypes.data),
                np.int64(mask.shape[-1]),
                np.uint64(self.grow.ctypes.data),
                np.uint64(0 if positions is None else positions.ctypes.data),
            )
        ptr = self.rt.ptr
        cluster = self.cluster or cluster_size(n, self.processors, self.sizes)
        with self.rt.enter():
            _kernel(self.rt.xp, cluster)(
                (n * cluster,),
                (THREADS,),
                (
                    np.uint64(self.pointers.ctypes.data),
                    np.uint64(self.f32.ctypes.data),
                    np.int64(self.vocab),
                    np.uint64(self.slots.ctypes.data),
                    np.uint64(0 if table is None else ptr(table)),
                    np.uint64(self.temperature.ctypes.data),
                    np.uint64(self.top_k.ctypes.data),
                    np.uint64(self.top_p.ctypes.data),
                    np.uint64(self.min_p.ctypes.data),
                    np.uint64(self.keys.ctypes.data),
                    np.uint64(self.counters.ctypes.data),
                    np.float64(self.scale),
                    np.uint64(self.out.ctypes.data),
                    self.scratch,
                    *tail,
                ),
            )
            return self.rt.mark()

    def chosen(self, n: int, event: Any) -> list[int]:
        """The tokens of the launch `event` marks, once the device has chosen them."""
        event.synchronize()
        return [int(t) for t in self.out[:n]]
