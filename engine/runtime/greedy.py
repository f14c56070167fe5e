"""Greedy tokens of a step's rows in one kernel: for each row, the first index of the largest stored
logit among the tokens its constraint state allows (every token for a row without one).

One launch serves constrained and unconstrained rows alike, so a step costs the same whichever of
its rows carry a constraint: the row numbers and mask-table slots are host stores into pinned
memory the device reads in place, the kernel reads each row's logits and mask where they lie (no
gather, no masked copy of the logits) and writes the chosen ids straight into pinned host memory.
Ties and NaN go as numpy's argmax takes them (the first largest; a NaN counts as largest), so the
tokens equal the CPU backend's. On numpy (`host_runtime`, CI) the same values come from numpy.

Chained (`GreedyRows.chain`, decode.py's chain): the same kernel also writes each row's token into
the next decode forward's input ids, moves the row's mask one position and sets its position id,
all behind the forward that computed the logits on the backend's stream, so the next forward can be
queued before any of it has run and the device goes from one forward to the next without the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.runtime.cuda_runtime import Placement
from engine.runtime.masks import unpacked

THREADS = 256

_SOURCE = r"""
__device__ __forceinline__ float load(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float load(const unsigned short* p, long long i) {
    float f;
    unsigned short h = p[i];
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Whether (a, ai) goes before (b, bi) in numpy's argmax order: NaN first, then larger, then earlier.
__device__ __forceinline__ bool before(float a, long long ai, float b, long long bi) {
    bool an = a != a, bn = b != b;
    if (an != bn) return an;
    if (!an && a != b) return a > b;
    return ai < bi;
}

template <typename T>
__device__ void masked_argmax(const T* logits, long long vocab, const long long* rows,
                              const long long* slots, const unsigned char* table, long long* out,
                              long long* next_ids, long long* mask, long long mask_width,
                              const long long* grow, long long* positions) {
    __shared__ float value[256];
    __shared__ long long index[256];
    const float refused = __int_as_float(0xff800000);  // -inf, as a masked-out logit
    int t = threadIdx.x;
    const T* row = logits + rows[blockIdx.x] * vocab;
    long long slot = slots[blockIdx.x];
    // The row's mask, bit-packed (engine.runtime.masks): token v is bit 7 - v % 8 of byte v / 8.
    const unsigned char* allowed = slot >= 0 ? table + slot * ((vocab + 7) >> 3) : (const unsigned char*)0;
    float best = refused;
    long long at = -1;
    for (long long v = t; v < vocab; v += blockDim.x) {
        float x = (allowed && !((allowed[v >> 3] >> (7 - (v & 7))) & 1)) ? refused : load(row, v);
        if (at < 0 || before(x, v, best, at)) { best = x; at = v; }
    }
    value[t] = best;
    index[t] = at;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (t < stride && index[t + stride] >= 0
            && (index[t] < 0 || before(value[t + stride], index[t + stride], value[t], index[t]))) {
            value[t] = value[t + stride];
            index[t] = index[t + stride];
        }
        __syncthreads();
    }
    if (t == 0) {
        out[blockIdx.x] = index[0];
        if (next_ids) {  // chained: the next forward feeds this token at position grow[i]
            long long r = rows[blockIdx.x], p = grow[blockIdx.x];
            next_ids[r] = index[0];
            mask[r * mask_width + p] = 1;
            if (positions) positions[r] = p;
        }
    }
}

extern "C" __global__ void masked_argmax_f32(const float* logits, long long vocab, const long long* rows,
                                             const long long* slots, const unsigned char* table,
                                             long long* out,
                                             long long* next_ids, long long* mask, long long mask_width,
                                             const long long* grow, long long* positions) {
    masked_argmax<float>(logits, vocab, rows, slots, table, out, next_ids, mask, mask_width, grow, positions);
}

extern "C" __global__ void masked_argmax_f16(const unsigned short* logits, long long vocab,
                                             const long long* rows, const long long* slots,
                                             const unsigned char* table, long long* out,
                                             long long* next_ids, long long* mask, long long mask_width,
                                             const long long* grow, long long* positions) {
    masked_argmax<unsigned short>(logits, vocab, rows, slots, table, out, next_ids, mask, mask_width, grow,
                                  positions);
}
"""
_KERNELS: dict[tuple[int, str], Any] = {}


def _kernel(xp: Any, dtype: np.dtype[Any]) -> Any:
    name = {np.dtype(np.float32): "masked_argmax_f32", np.dtype(np.float16): "masked_argmax_f16"}[dtype]
    kernel = _KERNELS.get((id(xp), name))
    if kernel is None:
        kernel = _KERNELS[(id(xp), name)] = xp.RawKernel(_SOURCE, name)
    return kernel


class GreedyRows:
    """Chooses greedy tokens for up to `rows` pool rows per call (the pool's rows)."""

    def __init__(self, rt: Placement, rows: int, dtype: Any) -> None:
        self.rt = rt
        self.dtype = np.dtype(dtype)
        self.rows = rt.host_zeros((rows,), np.int64)
        self.slots = rt.host_zeros((rows,), np.int64)
        self.out = rt.host_zeros((rows,), np.int64)
        self.grow = rt.host_zeros((rows,), np.int64)  # a chain's next position per row
        if rt.device == "cuda":
            _ = _kernel(rt.xp, self.dtype).kernel  # compiled (or read from disk) now, not mid-step

    def __call__(self, store: Any, rows: Sequence[int], slots: Sequence[int], table: Any) -> list[int]:
        """Row i's token: the argmax of `store[rows[i]]` over the tokens `table[slots[i]]` allows
        (a bit-packed mask, engine.runtime.masks)
        (every token where `slots[i]` < 0)."""
        n = len(rows)
        if self.rt.device != "cuda":
            logits = store[np.asarray(rows, np.int64)]
            masked = [i for i, slot in enumerate(slots) if slot >= 0]
            if masked:
                logits = logits.copy()
                allowed = unpacked(
                    np, table[np.asarray([slots[i] for i in masked], np.int64)], logits.shape[-1]
                )
                logits[masked] = np.where(allowed, logits[masked], logits.dtype.type(-np.inf))
            return [int(t) for t in np.argmax(logits, axis=-1)]
        self.rows[:n] = rows
        self.slots[:n] = slots
        self._launch(store, n, 0 if table is None else self.rt.ptr(table))
        self.rt.stream.synchronize()
        return [int(t) for t in self.out[:n]]

    def chain(
        self,
        store: Any,
        rows: Sequence[int],
        grow: Sequence[int],
        next_ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray | None,
    ) -> Any:
        """Queue row i's greedy token (no constraint) behind what the stream holds, and write it
        into the next forward's inputs: `next_ids[rows[i]]`, one more mask position
        (`mask[rows[i], grow[i]]` = 1) and `positions[rows[i]]` = grow[i] (pinned host arrays the
        device writes in place). Nothing waits: `chosen` reads the tokens once they are there.
        The previous chain's tokens must have been read (its arrays are reused)."""
        n = len(rows)
        if self.rt.device != "cuda":
            index = np.asarray(rows, np.int64)
            tokens = np.argmax(store[index], axis=-1)
            self.out[:n] = tokens
            next_ids.reshape(-1)[index] = tokens
            mask[index, np.asarray(grow, np.int64)] = 1
            if positions is not None:
                positions.reshape(-1)[index] = grow
            return None
        self.rows[:n] = rows
        self.slots[:n] = -1
        self.grow[:n] = grow
        self._launch(store, n, 0, chain=(next_ids, mask, positions))
        return self.rt.mark()

    def chosen(self, n: int, event: Any) -> list[int]:
        """The tokens of the chain `event` marks, once the device has chosen them."""
        if event is not None:
            event.synchronize()
        return [int(t) for t in self.out[:n]]

    def _launch(
        self,
        store: Any,
        n: int,
        table_ptr: int,
        chain: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None,
    ) -> None:
        """The kernel over n rows on the backend's stream, after the stores of this step's logits."""
        extra: tuple[Any, ...] = (np.uint64(0), np.uint64(0), np.int64(0), np.uint64(0), np.uint64(0))
        if chain is not None:
            next_ids, mask, positions = chain
            extra = (
                np.uint64(next_ids.ctypes.data),
                np.uint64(mask.ctypes.data),
                np.int64(mask.shape[-1]),
                np.uint64(self.grow.ctypes.data),
                np.uint64(0 if positions is None else positions.ctypes.data),
            )
        with self.rt.enter():
            _kernel(self.rt.xp, self.dtype)(
                (n,),
                (THREADS,),
                (
                    store,
                    np.int64(store.shape[-1]),
                    np.uint64(self.rows.ctypes.data),
                    np.uint64(self.slots.ctypes.data),
                    np.uint64(table_ptr),
                    np.uint64(self.out.ctypes.data),
                    *extra,
                ),
            )
