"""The CUDA C++ of the sampling kernel (engine/runtime/sampled.py), compiled by NVRTC through cupy:
a cluster of CLUSTER blocks per row (1, or up to 8 on compute capability 9.0+, whose blocks read one
another's shared memory); the mask, temperature, top-k and top-p by radix select, min-p, the draw."""

SOURCE = r"""
// CLUSTER (defined before this source): blocks per row. Block r of a row's cluster owns the r-th
// CLUSTER-th of its ids; each block's counts and masses are summed over the cluster through
// distributed shared memory, in rank order, so every block takes the same decisions.
typedef unsigned long long u64;
#define THREADS 512
#define WARPS (THREADS / 32)
#define UNROLL 4  // tiles of 32 ids a warp loads before using them (loads in flight per lane)

__device__ __forceinline__ float load(const void* p, int f32, long long i) {
    if (f32) return ((const float*)p)[i];
    float f;
    unsigned short h = ((const unsigned short*)p)[i];
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// This block's rank in its row's cluster.
__device__ __forceinline__ unsigned int cluster_rank() {
#if CLUSTER > 1
    unsigned int rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
#else
    return 0;
#endif
}

// Every thread of the row's blocks arrives before any goes on (release, then acquire: what a block
// wrote to its shared memory before is visible to the others after). A block reads another's
// shared memory only between two of these, and no block leaves before the last one.
__device__ __forceinline__ void cluster_sync() {
#if CLUSTER > 1
    asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory");
#else
    __syncthreads();
#endif
}

// The same shared variable in block `rank` of this cluster.
template <typename T>
__device__ __forceinline__ const T* of_block(const T* p, unsigned int rank) {
#if CLUSTER > 1
    u64 there;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(there) : "l"((u64)p), "r"(rank));
    return (const T*)there;
#else
    return p;
#endif
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

// A float's bits as an unsigned key in the float's order (no NaN reaches it), and back.
__device__ __forceinline__ unsigned int order_key(float f) {
    unsigned int b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned int key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Each warp's own 256 bins, cleared before a histogram.
__device__ __forceinline__ void clear_bins(u64* warp_bins, int t) {
    for (int i = t; i < WARPS * 256; i += THREADS) warp_bins[i] = 0;
    __syncthreads();
}

// Add `amount` to this warp's bin `bin` for every lane that `takes` part (the whole warp calls it).
// Lanes with the same bin are summed first (__match_any_sync, then three 21-bit slices summed by
// __reduce_add_sync: exact for 32 amounts below 2^63) and one lane writes: a flat row, whose
// tokens crowd into a few bins, costs no contention and needs no atomics.
__device__ __forceinline__ void add_to_bins(u64* mine, bool takes, unsigned int bin, u64 amount) {
    unsigned int peers = __match_any_sync(0xffffffffu, takes ? bin : 0xffffffffu);
    if (takes) {
        const u64 slice = (1ULL << 21) - 1;
        u64 low = __reduce_add_sync(peers, (unsigned int)(amount & slice));
        u64 mid = __reduce_add_sync(peers, (unsigned int)((amount >> 21) & slice));
        u64 top = __reduce_add_sync(peers, (unsigned int)(amount >> 42));
        if ((threadIdx.x & 31) == __ffs(peers) - 1) mine[bin] += low + (mid << 21) + (top << 42);
    }
    __syncwarp();
}

// The warps' bins summed into `bins` (after a __syncthreads).
__device__ __forceinline__ void merge_bins(const u64* warp_bins, u64* bins, int t) {
    for (int i = t; i < 256; i += THREADS) {
        u64 sum = 0;
        for (int w = 0; w < WARPS; ++w) sum += warp_bins[w * 256 + i];
        bins[i] = sum;
    }
    __syncthreads();
}

// Warp 0: from bin 255 down, the first bin where base + the running total reaches `target` (bin 0
// when none does), and the total of the bins above it. Lane l holds bins 255 - 8l down to 248 - 8l.
__device__ void select_bin(const u64* bins, u64 base, double target, int lane, int* chosen, u64* above) {
    u64 own[8], sum = 0;
    for (int j = 0; j < 8; ++j) { own[j] = bins[255 - 8 * lane - j]; sum += own[j]; }
    u64 inclusive = sum;
    for (int offset = 1; offset < 32; offset <<= 1) {
        u64 other = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += other;
    }
    unsigned int reach = __ballot_sync(0xffffffffu, (double)(base + inclusive) >= target);
    int first = reach ? __ffs(reach) - 1 : 31;
    if (lane == first) {
        u64 acc = inclusive - sum;
        for (int j = 0; j < 8; ++j) {
            int bin = 255 - 8 * lane - j;
            if (bin == 0 || (double)(base + acc + own[j]) >= target) { *chosen = bin; *above = acc; break; }
            acc += own[j];
        }
    }
}

struct Row {
    const void* logits; int f32; const unsigned char* allowed; float temp;  // allowed: bit-packed
};

__device__ __forceinline__ float raw(const Row& r, long long v) {
    return (r.allowed && !((r.allowed[v >> 3] >> (7 - (v & 7))) & 1)) ? __int_as_float(0xff800000)
                                                                   : load(r.logits, r.f32, v);
}

__device__ __forceinline__ float scaled(const Row& r, float x) {
    return x != x ? __int_as_float(0xff800000) : x / r.temp;
}

// A kept weight's fixed-point mass (0: not kept).
__device__ __forceinline__ u64 mass_of(unsigned int bits, double scale) {
    return (u64)((double)__uint_as_float(bits) * scale);
}

// Radix select over the keys in `scratch` (this warp's ids [first, last)), most significant byte
// first: the key at which the running total of `amount`s from the largest key down reaches
// `target` (counts for top-k, masses for top-p). *above: the total of the larger keys.
// `mass`: amounts are the keys' masses (keys are weight bits), else 1 each. `total`: with `mass`,
// gets the total mass of every key and `target` is taken as a fraction of it.
__device__ unsigned int radix_select(const unsigned int* scratch, long long first, long long last, int lane,
                                     int warp, int t, bool mass, double scale, double target, u64* above,
                                     u64* warp_bins, u64* bins, u64* row_bins, int* chosen_bin,
                                     u64* chosen_above, double* shared_target) {
    unsigned int prefix = 0, high = 0;
    u64 sum_above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        clear_bins(warp_bins, t);
        for (long long base = first; base < last; base += 32 * UNROLL) {
            unsigned int keys[UNROLL];
            #pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                long long v = base + 32 * j + lane;
                keys[j] = v < last ? scratch[v] : 0;
            }
            #pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                bool inside = base + 32 * j + lane < last;
                u64 amount = mass ? mass_of(keys[j], scale) : 1;
                add_to_bins(warp_bins + warp * 256, inside && amount && (keys[j] & high) == prefix,
                            (keys[j] >> shift) & 255, amount);
            }
        }
        __syncthreads();
        merge_bins(warp_bins, bins, t);
        cluster_sync();
        for (int i = t; i < 256; i += THREADS) {  // the row's bins: the cluster's blocks', in rank order
            u64 sum = 0;
            for (unsigned int q = 0; q < CLUSTER; ++q) sum += *of_block(bins + i, q);
            row_bins[i] = sum;
        }
        __syncthreads();
        if (mass && shift == 24 && t == 0) {
            u64 total = 0;
            for (int i = 0; i < 256; ++i) total += row_bins[i];
            *shared_target = target * (double)total;
        }
        __syncthreads();
        double goal = mass ? *shared_target : target;
        if (warp == 0) select_bin(row_bins, sum_above, goal, lane, chosen_bin, chosen_above);
        __syncthreads();
        sum_above += *chosen_above;
        prefix |= (unsigned int)*chosen_bin << shift;
        high |= 255u << shift;
        cluster_sync();  // every block has read this one's bins before the next level rewrites them
    }
    *above = sum_above;
    return prefix;
}

#if CLUSTER > 1
#define ROW_BLOCKS __cluster_dims__(CLUSTER, 1, 1)
#else
#define ROW_BLOCKS
#endif

extern "C" __global__ void __launch_bounds__(THREADS) ROW_BLOCKS sample_rows(
        const u64* pointers, const int* f32, long long vocab, const long long* slots,
        const unsigned char* table,
        const float* temperature, const long long* top_k, const double* top_p, const double* min_p,
        const u64* keys, const u64* counters, double scale, long long* out, unsigned int* scratch_rows,
        const long long* rows, long long* next_ids, long long* mask, long long mask_width,
        const long long* grow, long long* positions) {
    __shared__ float best_value[THREADS];
    __shared__ long long best_index[THREADS];
    __shared__ float peak_value[THREADS];
    __shared__ u64 bins[256];
    __shared__ u64 row_bins[256];
    __shared__ u64 warp_bins[WARPS * 256];
    __shared__ u64 warp_mass[WARPS];
    __shared__ unsigned int warp_ties[WARPS];
    __shared__ int chosen_bin;
    __shared__ u64 chosen_above;
    __shared__ double mass_target;
    __shared__ long long token;
    __shared__ int draw_warp;
    __shared__ u64 draw_rest;
    __shared__ unsigned int draw_ties;
    __shared__ int owner;  // this block chose the row's token (it writes it)

    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const unsigned int rank = cluster_rank();
    const int b = blockIdx.x / CLUSTER;  // the row
    // Warp `warp` of block `rank` owns the row's (rank * WARPS + warp)-th chunk of ids, in id order.
    const long long chunk = ((vocab + WARPS * CLUSTER - 1) / (WARPS * CLUSTER) + 31) / 32 * 32;
    const long long first = min(vocab, (rank * WARPS + warp) * chunk), last = min(vocab, first + chunk);
    if (t == 0) owner = 0;
    // This row's scratch: first each token's scaled logit as an order key, then its kept weight's
    // bits (0: not kept). Each warp writes and reads only its own ids.
    unsigned int* scratch = scratch_rows + (long long)b * vocab;
    long long slot = slots[b];
    Row r;
    r.logits = (const void*)pointers[b];
    r.f32 = f32[b];
    // The row's mask, bit-packed (engine.runtime.masks): token v is bit 7 - v % 8 of byte v / 8.
    r.allowed = slot >= 0 ? table + slot * ((vocab + 7) >> 3) : (const unsigned char*)0;
    float temp = temperature[b];
    long long k = top_k[b];
    bool greedy = temp == 0.0f || k == 1;
    r.temp = greedy ? 1.0f : temp;

    // Pass 1: the argmax (greedy, or the fallback of a row with nothing finite), the largest scaled
    // logit, and each token's scaled logit into the scratch.
    float best = __int_as_float(0xff800000), peak = best;
    long long at = -1;
    for (long long v = first + lane; v < last; v += 32) {
        float x = raw(r, v);
        if (at < 0 || before(x, v, best, at)) { best = x; at = v; }
        float s = scaled(r, x);
        peak = fmaxf(peak, s);
        if (!greedy) scratch[v] = order_key(s);
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
    // The row's argmax and peak: the cluster's blocks', in rank (id) order.
    cluster_sync();
    float row_best_value = __int_as_float(0xff800000);
    long long row_best = -1;
    peak = __int_as_float(0xff800000);
    for (unsigned int q = 0; q < CLUSTER; ++q) {
        float value = *of_block(best_value, q);
        long long index = *of_block(best_index, q);
        if (index >= 0 && (row_best < 0 || before(value, index, row_best_value, row_best))) {
            row_best_value = value;
            row_best = index;
        }
        peak = fmaxf(peak, *of_block(peak_value, q));
    }
    if (greedy || peak == __int_as_float(0xff800000)) {
        if (t == 0 && rank == 0) { token = row_best; owner = 1; }
    } else {
        const bool infinite = peak == __int_as_float(0x7f800000);
        // Top-k: the k-th largest scaled logit's key, by counts.
        unsigned int kth = 0;
        u64 unused = 0;
        if (k > 0 && k < vocab)
            kth = radix_select(scratch, first, last, lane, warp, t, false, scale, (double)k, &unused,
                               warp_bins, bins, row_bins, &chosen_bin, &chosen_above, &mass_target);
        // The weights: exp(scaled - peak) of the tokens top-k and min-p keep (an infinite peak: 1 for
        // the infinite tokens, 0 for the rest), as bits; 0 for the others.
        double least = min_p[b];
        for (long long v = first + lane; v < last; v += 32) {
            unsigned int key = scratch[v];
            float w = 0.0f;
            if (key >= kth) {
                float s = key_value(key);
                w = infinite ? (s == peak ? 1.0f : 0.0f) : expf(s - peak);
                if ((double)w < least) w = 0.0f;
            }
            scratch[v] = __float_as_uint(w);
        }
        __syncwarp();
        // Top-p: the weight at the cut, by mass, over the kept tokens.
        double p = top_p[b];
        unsigned int edge = 0xffffffffu;  // no cut: every kept token
        u64 above = 0, edge_q = 0, ties_needed = 0;
        if (p < 1.0) {
            edge = radix_select(scratch, first, last, lane, warp, t, true, scale, p, &above,
                                warp_bins, bins, row_bins, &chosen_bin, &chosen_above, &mass_target);
            edge_q = mass_of(edge, scale);
            double need = (mass_target - (double)above) / (double)(edge_q ? edge_q : 1);
            ties_needed = need <= 1.0 ? 1 : (u64)ceil(need);
        }
        // The draw, phase 1: each warp's kept mass, its ties at the cut, in id order.
        u64 mass = 0;
        unsigned int ties = 0;
        for (long long base = first; base < last; base += 32 * UNROLL) {
            unsigned int bits[UNROLL];
            #pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                long long v = base + 32 * j + lane;
                bits[j] = v < last ? scratch[v] : 0;
            }
            #pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                u64 q = mass_of(bits[j], scale);
                if (!q) continue;
                if (edge == 0xffffffffu || bits[j] > edge) mass += q;
                else if (bits[j] == edge) ties += 1;
            }
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            mass += __shfl_down_sync(0xffffffffu, mass, offset);
            ties += __shfl_down_sync(0xffffffffu, ties, offset);
        }
        if (lane == 0) { warp_mass[warp] = mass; warp_ties[warp] = ties; }
        cluster_sync();
        if (t == 0) {  // the same walk in every block of the row: the chunks of all its warps, in id order
            u64 chunk_mass[WARPS * CLUSTER], total = 0;
            unsigned int chunk_ties[WARPS * CLUSTER], before_ties = 0;
            #pragma unroll 1
            for (int w = 0; w < WARPS * CLUSTER; ++w) {
                chunk_ties[w] = *of_block(warp_ties + w % WARPS, w / WARPS);
                u64 taken = 0;
                if (before_ties < ties_needed)
                    taken = min((u64)chunk_ties[w], ties_needed - before_ties);
                chunk_mass[w] = *of_block(warp_mass + w % WARPS, w / WARPS) + taken * edge_q;
                before_ties += chunk_ties[w];
                total += chunk_mass[w];
            }
            double u = (double)(philox(keys[b], counters[b]) >> 11) * 1.1102230246251565e-16;
            u64 x = (u64)(u * (double)total);
            if (x >= total) x = total - 1;
            unsigned int ties_so_far = 0;
            int w = 0;
            #pragma unroll 1
            for (; w < WARPS * CLUSTER - 1; ++w) {
                if (x < chunk_mass[w]) break;
                x -= chunk_mass[w];
                ties_so_far += chunk_ties[w];
            }
            draw_warp = w / WARPS == (int)rank ? w % WARPS : -1;  // -1: another block's warp draws
            draw_rest = x; draw_ties = ties_so_far;
        }
        __syncthreads();
        // Phase 2: the drawn warp walks its ids 32 at a time to the token at the draw.
        if (warp == draw_warp) {
            u64 rest = draw_rest;
            unsigned int tied = draw_ties;
            long long found = -1;
            for (long long base = first; base < last && found < 0; base += 32) {
                long long v = base + lane;
                unsigned int bits = v < last ? scratch[v] : 0;
                u64 q = mass_of(bits, scale);
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
            if (lane == 0) { token = found >= 0 ? found : row_best; owner = 1; }
        }
    }
    __syncthreads();
    if (t == 0 && owner) {
        out[b] = token;
        if (next_ids) {  // chained: the next forward feeds this token at position grow[b]
            long long row = rows[b], position = grow[b];
            next_ids[row] = token;
            mask[row * mask_width + position] = 1;
            if (positions) positions[row] = position;
        }
    }
    cluster_sync();  // no block leaves while another may still read its shared memory
}
"""
