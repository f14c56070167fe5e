"""Sampled tokens of a step's rows in one kernel on the device: for each row, its constraint's mask,
temperature, top-k, min-p and top-p, then a draw from a counter-based generator (engine.sampling's
Philox4x64-10, keyed by the row's seed, counted by the token's position), one block per row.

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
  (four passes of 256-bin histograms of mass), not by a sort;
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

from engine.runtime.cuda_runtime import Placement

# A chained launch's pool rows, their next positions, and the next forward's ids, mask and positions.
Chain = tuple[Sequence[int], Sequence[int], np.ndarray, np.ndarray, "np.ndarray | None"]

THREADS = 512  # 16 warps; warp w owns the w-th sixteenth of the vocabulary (ids in order)

_SOURCE = r"""
typedef unsigned long long u64;
#define THREADS 512
#define WARPS (THREADS / 32)

__device__ __forceinline__ float load(const void* p, int f32, long long i) {
    if (f32) return ((const float*)p)[i];
    float f;
    unsigned short h = ((const unsigned short*)p)[i];
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// numpy's argmax order: NaN first, then larger, then earlier.
__device__ __forceinline__ bool before(float a, long long ai, float b, long long bi) {
    bool an = a != a, bn = b != b;
    if (an != bn) return an;
    if (!an && a != b) return a > b;
    return ai < bi;
}

// Philox4x64-10's first output word for key (key, 0) and counter (counter, 0, 0, 0).
__device__ u64 philox(u64 key, u64 counter) {
    u64 c0 = counter, c1 = 0, c2 = 0, c3 = 0, k0 = key, k1 = 0;
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B97F4A7C15ULL; k1 += 0xBB67AE8584CAA73BULL; }
        u64 hi0 = __umul64hi(0xD2E7470EE14C6C93ULL, c0), lo0 = 0xD2E7470EE14C6C93ULL * c0;
        u64 hi1 = __umul64hi(0xCA5A826395121157ULL, c2), lo1 = 0xCA5A826395121157ULL * c2;
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    }
    return c0;
}

// A float's bits as an unsigned key in the float's order (no NaN reaches it).
__device__ __forceinline__ unsigned int order_key(float f) {
    unsigned int b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

struct Row {
    const void* logits; int f32; const bool* allowed; float temp; float peak; int infinite;
    int topk; unsigned int kth; double min_p; double scale;
};

__device__ __forceinline__ float raw(const Row& r, long long v) {
    return (r.allowed && !r.allowed[v]) ? __int_as_float(0xff800000) : load(r.logits, r.f32, v);
}

__device__ __forceinline__ float scaled(const Row& r, float x) {
    return x != x ? __int_as_float(0xff800000) : x / r.temp;
}

__device__ __forceinline__ float weight(const Row& r, float s) {
    if (r.infinite) return s == __int_as_float(0x7f800000) ? 1.0f : 0.0f;
    return expf(s - r.peak);
}

// The kept weight of token v in fixed point (top-p aside), and its weight's bits.
__device__ __forceinline__ u64 kept(const Row& r, long long v, unsigned int* bits) {
    float s = scaled(r, raw(r, v));
    if (r.topk && order_key(s) < r.kth) return 0;
    float w = weight(r, s);
    if ((double)w < r.min_p) return 0;
    *bits = __float_as_uint(w);
    return (u64)((double)w * r.scale);
}

extern "C" __global__ void sample_rows(
        const u64* pointers, const int* f32, long long vocab, const long long* slots, const bool* table,
        const float* temperature, const long long* top_k, const double* top_p, const double* min_p,
        const u64* keys, const u64* counters, double scale, long long* out,
        const long long* rows, long long* next_ids, long long* mask, long long mask_width,
        const long long* grow, long long* positions) {
    __shared__ float best_value[THREADS];
    __shared__ long long best_index[THREADS];
    __shared__ float peak_value[THREADS];
    __shared__ u64 bins[256];
    __shared__ u64 warp_mass[WARPS];
    __shared__ unsigned int warp_ties[WARPS];
    __shared__ int chosen_bin;
    __shared__ double mass_target;
    __shared__ u64 chosen_above;
    __shared__ long long token;
    __shared__ int draw_warp;
    __shared__ u64 draw_rest;
    __shared__ unsigned int draw_ties;

    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int b = blockIdx.x;
    const long long chunk = ((vocab + WARPS - 1) / WARPS + 31) / 32 * 32;
    const long long first = warp * chunk, last = min(vocab, first + chunk);
    long long slot = slots[b];
    Row r;
    r.logits = (const void*)pointers[b];
    r.f32 = f32[b];
    r.allowed = slot >= 0 ? table + slot * vocab : (const bool*)0;
    float temp = temperature[b];
    long long k = top_k[b];
    bool greedy = temp == 0.0f || k == 1;
    r.temp = greedy ? 1.0f : temp;
    r.peak = 0.0f; r.infinite = 0; r.topk = 0; r.kth = 0; r.min_p = min_p[b]; r.scale = scale;

    // Pass 1: the argmax (greedy, or the fallback of a row with nothing finite) and the largest
    // scaled logit.
    float best = __int_as_float(0xff800000), peak = best;
    long long at = -1;
    for (long long v = first + lane; v < last; v += 32) {
        float x = raw(r, v);
        if (at < 0 || before(x, v, best, at)) { best = x; at = v; }
        peak = fmaxf(peak, scaled(r, x));
    }
    best_value[t] = best; best_index[t] = at; peak_value[t] = peak;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) {
            if (best_index[t + stride] >= 0
                && (best_index[t] < 0 || before(best_value[t + stride], best_index[t + stride],
                                                best_value[t], best_index[t]))) {
                best_value[t] = best_value[t + stride];
                best_index[t] = best_index[t + stride];
            }
            peak_value[t] = fmaxf(peak_value[t], peak_value[t + stride]);
        }
        __syncthreads();
    }
    peak = peak_value[0];
    if (greedy || peak == __int_as_float(0xff800000)) {
        if (t == 0) token = best_index[0];
    } else {
        r.peak = peak;
        r.infinite = peak == __int_as_float(0x7f800000);
        // Top-k: the k-th largest scaled logit, by counts.
        if (k > 0 && k < vocab) {
            unsigned int prefix = 0, high = 0;
            long long rest = k;
            for (int shift = 24; shift >= 0; shift -= 8) {
                for (int i = t; i < 256; i += THREADS) bins[i] = 0;
                __syncthreads();
                for (long long v = first + lane; v < last; v += 32) {
                    unsigned int key = order_key(scaled(r, raw(r, v)));
                    if ((key & high) == prefix) atomicAdd(&bins[(key >> shift) & 255], 1ULL);
                }
                __syncthreads();
                if (t == 0) {
                    long long acc = 0;
                    int bin = 255;
                    for (; bin > 0; --bin) {
                        if (acc + (long long)bins[bin] >= rest) break;
                        acc += (long long)bins[bin];
                    }
                    chosen_bin = bin;
                    chosen_above = (u64)acc;
                }
                __syncthreads();
                rest -= (long long)chosen_above;
                prefix |= (unsigned int)chosen_bin << shift;
                high |= 255u << shift;
                __syncthreads();
            }
            r.topk = 1;
            r.kth = prefix;
        }
        // Top-p: the weight at the cut, by mass, over the tokens top-k and min-p kept.
        double p = top_p[b];
        unsigned int edge = 0xffffffffu;  // no cut: every kept token
        u64 above = 0, edge_q = 0, ties_needed = 0;
        if (p < 1.0) {
            unsigned int prefix = 0, high = 0;
            double target = 0.0;
            for (int shift = 24; shift >= 0; shift -= 8) {
                for (int i = t; i < 256; i += THREADS) bins[i] = 0;
                __syncthreads();
                for (long long v = first + lane; v < last; v += 32) {
                    unsigned int bits = 0;
                    u64 q = kept(r, v, &bits);
                    if (q && (bits & high) == prefix) atomicAdd(&bins[(bits >> shift) & 255], q);
                }
                __syncthreads();
                if (t == 0) {
                    if (shift == 24) {
                        u64 total = 0;
                        for (int i = 0; i < 256; ++i) total += bins[i];
                        mass_target = p * (double)total;
                    }
                    target = mass_target;
                    u64 acc = 0;
                    int bin = 255;
                    for (; bin > 0; --bin) {
                        if ((double)(above + acc + bins[bin]) >= target) break;
                        acc += bins[bin];
                    }
                    chosen_bin = bin;
                    chosen_above = above + acc;
                }
                __syncthreads();
                above = chosen_above;
                target = mass_target;
                prefix |= (unsigned int)chosen_bin << shift;
                high |= 255u << shift;
                __syncthreads();
            }
            edge = prefix;
            edge_q = (u64)((double)__uint_as_float(edge) * scale);
            double need = (target - (double)above) / (double)(edge_q ? edge_q : 1);
            ties_needed = need <= 1.0 ? 1 : (u64)ceil(need);
        }
        // The draw, phase 1: each warp's kept mass, its ties at the cut, in id order.
        u64 mass = 0;
        unsigned int ties = 0;
        for (long long v = first + lane; v < last; v += 32) {
            unsigned int bits = 0;
            u64 q = kept(r, v, &bits);
            if (!q) continue;
            if (edge == 0xffffffffu || bits > edge) mass += q;
            else if (bits == edge) ties += 1;
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            mass += __shfl_down_sync(0xffffffffu, mass, offset);
            ties += __shfl_down_sync(0xffffffffu, ties, offset);
        }
        if (lane == 0) { warp_mass[warp] = mass; warp_ties[warp] = ties; }
        __syncthreads();
        if (t == 0) {
            u64 chunk_mass[WARPS], total = 0;
            unsigned int before_ties = 0;
            for (int w = 0; w < WARPS; ++w) {
                u64 taken = 0;
                if (before_ties < ties_needed)
                    taken = min((u64)warp_ties[w], ties_needed - before_ties);
                chunk_mass[w] = warp_mass[w] + taken * edge_q;
                before_ties += warp_ties[w];
                total += chunk_mass[w];
            }
            double u = (double)(philox(keys[b], counters[b]) >> 11) * 1.1102230246251565e-16;
            u64 x = (u64)(u * (double)total);
            if (x >= total) x = total - 1;
            unsigned int ties_so_far = 0;
            int w = 0;
            for (; w < WARPS - 1; ++w) {
                if (x < chunk_mass[w]) break;
                x -= chunk_mass[w];
                ties_so_far += warp_ties[w];
            }
            draw_warp = w; draw_rest = x; draw_ties = ties_so_far;
        }
        __syncthreads();
        // Phase 2: the drawn warp walks its ids 32 at a time to the token at the draw.
        if (warp == draw_warp) {
            u64 rest = draw_rest;
            unsigned int tied = draw_ties;
            long long found = -1;
            for (long long base = first; base < last && found < 0; base += 32) {
                long long v = base + lane;
                unsigned int bits = 0;
                u64 q = v < last ? kept(r, v, &bits) : 0;
                bool tie = q && edge != 0xffffffffu && bits == edge;
                unsigned int tie_mask = __ballot_sync(0xffffffffu, tie);
                if (edge != 0xffffffffu && q && bits < edge) q = 0;
                if (tie && (u64)(tied + __popc(tie_mask & ((1u << lane) - 1))) >= ties_needed) q = 0;
                u64 sum = q;
                for (int offset = 1; offset < 32; offset <<= 1) {
                    u64 other = __shfl_up_sync(0xffffffffu, sum, offset);
                    if (lane >= offset) sum += other;
                }
                unsigned int past = __ballot_sync(0xffffffffu, sum > rest);
                if (past) {
                    found = base + __ffs(past) - 1;
                } else {
                    rest -= __shfl_sync(0xffffffffu, sum, 31);
                    tied += __popc(tie_mask);
                }
            }
            if (lane == 0) token = found >= 0 ? found : best_index[0];
        }
    }
    __syncthreads();
    if (t == 0) {
        out[b] = token;
        if (next_ids) {  // chained: the next forward feeds this token at position grow[b]
            long long row = rows[b], position = grow[b];
            next_ids[row] = token;
            mask[row * mask_width + position] = 1;
            if (positions) positions[row] = position;
        }
    }
}
"""
_KERNELS: dict[int, Any] = {}


def _kernel(xp: Any) -> Any:
    kernel = _KERNELS.get(id(xp))
    if kernel is None:
        kernel = _KERNELS[id(xp)] = xp.RawKernel(_SOURCE, "sample_rows")
    return kernel


def fixed_point_scale(vocab: int) -> float:
    """Units per weight 1.0: the whole vocabulary's weights sum below 2^62 (no u64 overflow)."""
    return math.ldexp(1.0, 62 - max(1, math.ceil(math.log2(max(vocab, 2)))))


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
        _ = _kernel(rt.xp).kernel  # compiled (or read from disk) now, not mid-step

    def set(self, i: int, logits: Any, params: Any, key: int, position: int, slot: int = -1) -> None:
        """Row i of the next launch: its logits (a device row), parameters (SamplingParams), key,
        the position of the token it chooses, and its constraint's mask-table slot (-1: none)."""
        self.fill(i, [logits.data.ptr], [logits.dtype == np.float32], [params], [key], [position], [slot])

    def fill(self, start: int, pointers: Sequence[int], wide: Sequence[bool], params: Sequence[Any],
             keys: Sequence[int], positions: Sequence[int], slots: Sequence[int] | None = None) -> None:
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
        tail: tuple[Any, ...] = (np.uint64(0), np.uint64(0), np.uint64(0), np.int64(0), np.uint64(0),
                                 np.uint64(0))
        if chain is not None:
            rows, grow, next_ids, mask, positions = chain
            self.rows[:n] = rows
            self.grow[:n] = grow
            tail = (np.uint64(self.rows.ctypes.data), np.uint64(next_ids.ctypes.data),
                    np.uint64(mask.ctypes.data), np.int64(mask.shape[-1]), np.uint64(self.grow.ctypes.data),
                    np.uint64(0 if positions is None else positions.ctypes.data))
        ptr = self.rt.ptr
        with self.rt.enter():
            _kernel(self.rt.xp)(
                (n,), (THREADS,),
                (np.uint64(self.pointers.ctypes.data), np.uint64(self.f32.ctypes.data), np.int64(self.vocab),
                 np.uint64(self.slots.ctypes.data), np.uint64(0 if table is None else ptr(table)),
                 np.uint64(self.temperature.ctypes.data), np.uint64(self.top_k.ctypes.data),
                 np.uint64(self.top_p.ctypes.data), np.uint64(self.min_p.ctypes.data),
                 np.uint64(self.keys.ctypes.data), np.uint64(self.counters.ctypes.data),
                 np.float64(self.scale), np.uint64(self.out.ctypes.data), *tail))
            event = self.rt.xp.cuda.Event(block=False, disable_timing=True)
            event.record(self.rt.stream)
        return event

    def chosen(self, n: int, event: Any) -> list[int]:
        """The tokens of the launch `event` marks, once the device has chosen them."""
        event.synchronize()
        return [int(t) for t in self.out[:n]]
