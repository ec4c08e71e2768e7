// Attention kernels (see attention.cu for the plan).
#pragma once
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/sizing.h"
#include "runtime/cuda/tensor_core.cuh"

namespace qinfer::cuda {

struct AttnArgs {
    const float* q;          // q row of (token t, head h) at q + t*q_t + h*q_h
    int64_t q_h, q_t;
    const void* K;           // {d, n_kv, n_ctx, n_slots}: float, half or q8_0 blocks
    const void* V;
    int n_kv;
    int64_t n_ctx;
    int group;               // query heads per kv head
    const int32_t* pos;
    const int32_t* slot;
    float scale;
    float* out;              // [T][n_head][d]
    float* work;             // split partials [T][n_head][n_split][d + ATTN_PART_HDR]: m, l, -, -, acc[d]
    int n_split;             // splits launched (from the cache capacity)
    // A token at position p may find rows at p + 1 - fresh and above written by
    // the kernels before this one (this step's kv_store); rows below were written
    // before the kernel chain began (cuda::attention in kernels.h). 0: any row may be.
    int fresh;
    // The split kernel lets the next kernel be scheduled only after its tile
    // loop (1, QINFER_CUDA_ATTN_LATE_TRIGGER's default) or as the other kernels
    // do (0): blocks of the kernels after it, scheduled early, wait on SMs that
    // its later blocks need (decode at 32k keys: 0.905 x decode at 512 against
    // 0.879 on an H100, tg128 +2%; bench/results).
    int trigger_late;
};

constexpr int ATTN_THREADS = 128;
// A split's key range is a multiple of this (but the last). Steps longer than
// the split kernel's token limit (attention.cu) take one pass over the keys,
// and every extra split rounds a little differently from that pass; 64 keys
// give a 512-key context 8 splits per kv head (32 blocks, not 8 as with 256:
// 13 vs 30 us on an H200; 128 keys: 18 us).
constexpr int ATTN_SPLIT_ALIGN = kAttnSplitAlign;
constexpr int ATTN_MAX_SPLITS = kAttnMaxSplits;  // <= ATTN_THREADS: the combine gives each split one thread
constexpr int ATTN_PART_HDR = kAttnPartHeader;   // m, l and padding, so acc[] stays 16-byte aligned
constexpr int ATTN_COMBINE_COLS = 64;

// Keys per tile: K and V tiles of 32 KB each in shared memory (64 keys of a
// 256-wide f16 head), at most ATTN_THREADS (one key per thread in the
// softmax). Tiles of 16 KB took twice as long at 512 keys on an H200 (40 vs
// 18 us) and were 10% faster only at 32k keys.
template <int D, typename KT> __host__ __device__ constexpr int attn_tile_keys() {
    constexpr int k = 32768 / (D * int(sizeof(KT)));
    return k > ATTN_THREADS ? ATTN_THREADS : k;
}
template <int D, typename KT> __host__ __device__ constexpr size_t attn_smem_bytes() {
    return size_t(2) * attn_tile_keys<D, KT>() * D * sizeof(KT);
}

// Keys per split for a context of n keys over ns launched splits: the splits
// in use are the first ceil(n / chunk); the rest have nothing to do. Both
// kernels derive it from pos on the device, so a captured launch (whose grid
// depends on the capacity only) adapts to the length at every replay.
__device__ __forceinline__ int attn_chunk(int n, int ns) {
    const int c = (n + ns - 1) / ns;
    return (c + ATTN_SPLIT_ALIGN - 1) / ATTN_SPLIT_ALIGN * ATTN_SPLIT_ALIGN;
}
__device__ __forceinline__ int attn_splits_used(int n, int ns) {
    const int c = attn_chunk(n, ns);
    return (n + c - 1) / c;
}

// What a split block (kv head g = blockIdx.x, token t = blockIdx.y, split =
// blockIdx.z) works on: keys [j0, j1) of its token's sequence (empty past the
// context), how many splits are in use (nu == 1: it writes the output itself),
// and its kv head's first K and V rows (row stride n_kv * D elements).
// ROW: bytes of one kv head's cached row (row stride n_kv * ROW bytes).
struct AttnSplitWork {
    int n, j0, j1, nu;
    const unsigned char* K;
    const unsigned char* V;
};
template <int ROW> __device__ __forceinline__ AttnSplitWork attn_split_work(const AttnArgs& a) {
    const int g = blockIdx.x, t = blockIdx.y, split = blockIdx.z;
    const int n = a.pos[t] + 1;
    const int chunk = attn_chunk(n, a.n_split);
    AttnSplitWork w;
    w.n = n;
    w.nu = (n + chunk - 1) / chunk;
    w.j0 = split * chunk;
    w.j1 = min(n, w.j0 + chunk);
    const int64_t first = (int64_t(a.slot[t]) * a.n_ctx * a.n_kv + g) * ROW;
    w.K = static_cast<const unsigned char*>(a.K) + first;
    w.V = static_cast<const unsigned char*>(a.V) + first;
    return w;
}

// 16 bytes of K/V as floats.
template <typename KT> __device__ __forceinline__ void to_floats(const int4& v, float (&f)[16 / sizeof(KT)]);
template <> __device__ __forceinline__ void to_floats<__half>(const int4& v, float (&f)[8]) {
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 x = __half22float2(h[i]);
        f[2 * i] = x.x;
        f[2 * i + 1] = x.y;
    }
}
template <> __device__ __forceinline__ void to_floats<float>(const int4& v, float (&f)[4]) {
    f[0] = __int_as_float(v.x);
    f[1] = __int_as_float(v.y);
    f[2] = __int_as_float(v.z);
    f[3] = __int_as_float(v.w);
}

// Copies rows jt .. jt + nk of one kv head (row stride `stride` elements) into
// a [TK][D] shared tile, 16 bytes per copy, all threads.
template <int D, typename KT>
__device__ __forceinline__ void attn_load_tile(KT* tile, const KT* src, int64_t stride, int jt, int nk) {
    constexpr int VEC = 16 / sizeof(KT), CPR = D / VEC;  // copies per row
    for (int c = threadIdx.x; c < nk * CPR; c += ATTN_THREADS) {
        const int r = c / CPR, col = (c % CPR) * VEC;
        cp_async16(tile + r * D + col, src + int64_t(jt + r) * stride + col);
    }
}

// One block per (kv head, token, split) serves all query heads of the group,
// so every cached K/V byte is read once per token. GT >= group (compile-time
// bound of the per-head register arrays); D the head dim.
//
// K and V come in tiles of TK keys through shared memory (cp.async): one tile's
// loads are all in flight at once, and the next tile's K is loaded during this
// one's softmax and P V, its V during the next scores, so a block waits on
// memory about once per tile (the register-staged loads of before waited ~13
// times per 128 keys). On an H200 (16 q / 4 kv heads, d 256): 512 keys 30 ->
// 13 us, 4096 keys 35 -> 19 us; 32k keys not faster (76 -> 88 us, 1.5 TB/s,
// not understood yet: scripts/gpu-steps.d/34-ncu-attention.sh).
// Per tile:
//  - scores: TPK threads share a key, each dotting 4 x 16 bytes of it with the
//    group's q, then a shuffle sum;
//  - softmax: thread i takes key i of the tile (online max / sum per head);
//  - P V: groups of TPR threads read whole V rows.
// A split that is the only one in use writes the normalized output; otherwise
// its partial state (m, l, acc) for attn_combine_kernel.
template <int D, int GT, typename KT>
__global__ void __launch_bounds__(ATTN_THREADS) attn_split_kernel(AttnArgs a) {
    pdl_enter();
    constexpr int VEC = 16 / sizeof(KT);  // elements per 16-byte load
    constexpr int KL = 4;                 // 16-byte loads per thread per key (score phase)
    constexpr int TPK = D / (VEC * KL);   // threads per key
    constexpr int KPP = ATTN_THREADS / TPK;  // keys per pass
    constexpr int TPR = D / VEC;          // threads per V row in the PV phase
    constexpr int NG = ATTN_THREADS / TPR;   // V rows in flight per block
    constexpr int TK = attn_tile_keys<D, KT>();
    constexpr int PS = D + ATTN_PART_HDR;
    static_assert(TPK >= 1 && TPK <= WARP && WARP % TPK == 0 && TK % KPP == 0, "head dim");
    static_assert(NG >= 1 && ATTN_THREADS % TPR == 0, "head dim too large for the block");
    static_assert(GT * D * sizeof(float) <= attn_smem_bytes<D, KT>(), "accs overlays the tiles");
    __shared__ __align__(16) float qs[GT][D];
    __shared__ float ps[GT][TK];
    __shared__ float red[GT][ATTN_THREADS / WARP];
    extern __shared__ __align__(16) unsigned char attn_smem[];
    KT* ks = reinterpret_cast<KT*>(attn_smem);  // [TK][D]
    KT* vs = ks + TK * D;                       // [TK][D]

    const int g = blockIdx.x, t = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % WARP, wid = tid / WARP;
    const int G = a.group;
    const int n_head = a.n_kv * G;
    const int ns = a.n_split;
    const AttnSplitWork sw = attn_split_work<D * int(sizeof(KT))>(a);
    const int j0 = sw.j0, j1 = sw.j1, nu = sw.nu;
    if (j0 >= j1) return;  // a split past the context (block-uniform): nothing to write either
    const KT* Kb = reinterpret_cast<const KT*>(sw.K);
    const KT* Vb = reinterpret_cast<const KT*>(sw.V);
    const int64_t row_stride = int64_t(a.n_kv) * D;
    // the first tile's loads go out before q is staged
    attn_load_tile<D, KT>(ks, Kb, row_stride, j0, min(TK, j1 - j0));
    cp_async_commit();
    attn_load_tile<D, KT>(vs, Vb, row_stride, j0, min(TK, j1 - j0));
    cp_async_commit();
    for (int i = tid; i < GT * D; i += ATTN_THREADS) {
        const int h = i / D, e = i % D;
        qs[h][e] = h < G ? a.q[int64_t(t) * a.q_t + int64_t(g * G + h) * a.q_h + e] * a.scale : 0.f;
    }

    float m[GT], l[GT], acc[GT][VEC];
#pragma unroll
    for (int h = 0; h < GT; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[h][v] = 0.f;
    }
    const int kk = tid / TPK, kr = tid % TPK;  // score phase: key kk of a pass, quarter kr of it
    const int vg = tid / TPR, vc = tid % TPR;  // PV phase: row group, 16-byte column

    for (int jt = j0; jt < j1; jt += TK) {
        const int nk = min(TK, j1 - jt);  // keys in this tile
        const int jn = jt + TK, nn = min(TK, j1 - jn);  // the next tile (nn <= 0: none)
        cp_async_wait<1>();  // this tile's K (its V may still be in flight)
        __syncthreads();

        // scores -> ps
        for (int p0 = 0; p0 < nk; p0 += KPP) {
            const int jl = p0 + kk;
            float s[GT];
#pragma unroll
            for (int h = 0; h < GT; ++h) s[h] = 0.f;
            if (jl < nk) {
                const KT* row = ks + jl * D;
#pragma unroll
                for (int i = 0; i < KL; ++i) {
                    float kf[VEC];
                    const int e0 = (i * TPK + kr) * VEC;
                    to_floats<KT>(*reinterpret_cast<const int4*>(row + e0), kf);
#pragma unroll
                    for (int h = 0; h < GT; ++h) {
                        if (h < G) {
#pragma unroll
                            for (int v = 0; v < VEC; ++v) s[h] = fmaf(qs[h][e0 + v], kf[v], s[h]);
                        }
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < GT; ++h) {
#pragma unroll
                for (int o = TPK / 2; o > 0; o >>= 1) s[h] += __shfl_xor_sync(0xffffffffu, s[h], o);
            }
            if (kr == 0 && jl < nk) {
#pragma unroll
                for (int h = 0; h < GT; ++h) ps[h][jl] = s[h];
            }
        }
        __syncthreads();  // ps complete, ks free
        if (nn > 0) attn_load_tile<D, KT>(ks, Kb, row_stride, jn, nn);
        cp_async_commit();  // (an empty group when there is no next tile)

        // online softmax over the tile, per head (thread tid: key tid)
        const bool valid = tid < nk;
        float s[GT];
#pragma unroll
        for (int h = 0; h < GT; ++h) s[h] = valid ? ps[h][tid] : -INFINITY;
        float mt[GT];
#pragma unroll
        for (int h = 0; h < GT; ++h) {
            mt[h] = warp_max(s[h]);
            if (lane == 0) red[h][wid] = mt[h];
        }
        __syncthreads();
        float corr[GT];
#pragma unroll
        for (int h = 0; h < GT; ++h) {
            float tm = red[h][0];
#pragma unroll
            for (int w = 1; w < ATTN_THREADS / WARP; ++w) tm = fmaxf(tm, red[h][w]);
            const float mn = fmaxf(m[h], tm);
            corr[h] = expf(m[h] - mn);  // exp(-inf) = 0 on the first tile
            m[h] = mn;
            s[h] = valid ? expf(s[h] - mn) : 0.f;
        }
        __syncthreads();  // everyone has read red and ps
        float ts[GT];
#pragma unroll
        for (int h = 0; h < GT; ++h) {
            if (valid) ps[h][tid] = s[h];
            ts[h] = warp_sum(s[h]);
            if (lane == 0) red[h][wid] = ts[h];
        }
        cp_async_wait<1>();  // this tile's V (the next K may still be in flight)
        __syncthreads();
#pragma unroll
        for (int h = 0; h < GT; ++h) {
            float sum = 0.f;
#pragma unroll
            for (int w = 0; w < ATTN_THREADS / WARP; ++w) sum += red[h][w];
            l[h] = l[h] * corr[h] + sum;
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[h][v] *= corr[h];
        }

        // P V: group vg takes keys vg, vg + NG, ... of the tile, columns vc*VEC..
#pragma unroll 4
        for (int jj = vg; jj < nk; jj += NG) {
            float vf[VEC];
            to_floats<KT>(*reinterpret_cast<const int4*>(vs + jj * D + vc * VEC), vf);
#pragma unroll
            for (int h = 0; h < GT; ++h) {
                const float p = ps[h][jj];
#pragma unroll
                for (int v = 0; v < VEC; ++v) acc[h][v] = fmaf(p, vf[v], acc[h][v]);
            }
        }
        __syncthreads();  // ps, red and vs are rewritten by the next tile
        if (nn > 0) attn_load_tile<D, KT>(vs, Vb, row_stride, jn, nn);
        cp_async_commit();
    }
    cp_async_wait<0>();  // (only empty groups are left)

    // merge the NG row groups, in group order: the result must not depend on
    // which warps arrive first (shared-memory atomics summed in arrival order,
    // so the same step could round differently from run to run). accs overlays
    // the tiles, which are no longer read.
    float (*accs)[D] = reinterpret_cast<float (*)[D]>(attn_smem);
    for (int i = tid; i < GT * D; i += ATTN_THREADS) accs[i / D][i % D] = 0.f;
    __syncthreads();
#pragma unroll
    for (int grp = 0; grp < NG; ++grp) {
        if (vg == grp) {
#pragma unroll
            for (int h = 0; h < GT; ++h)
                if (h < G) {
#pragma unroll
                    for (int v = 0; v < VEC; ++v) accs[h][vc * VEC + v] += acc[h][v];
                }
        }
        __syncthreads();
    }
    for (int i = tid; i < G * D; i += ATTN_THREADS) {
        const int h = i / D, e = i % D;
        float lh = 0.f, mh = 0.f;
#pragma unroll
        for (int hh = 0; hh < GT; ++hh)
            if (hh == h) {
                lh = l[hh];
                mh = m[hh];
            }
        if (nu == 1) {
            a.out[(int64_t(t) * n_head + g * G + h) * D + e] = accs[h][e] / lh;
        } else {
            float* w = a.work + ((int64_t(t) * n_head + g * G + h) * ns + split) * PS;
            if (e == 0) {
                w[0] = mh;
                w[1] = lh;
            }
            w[ATTN_PART_HDR + e] = accs[h][e];
        }
    }
}

// How the tensor-core split kernel reads one cache type: its rows in a shared
// tile of TK keys (TILE bytes, loaded with cp.async, rows at or past nk
// zero-filled so that a 16-key mma step over a partial tile multiplies zeros,
// never stale or poisoned bytes), the scores of 16 keys, and P V over 16 keys.
// Accumulator layouts as in attn_split_mma_kernel below.

// f16 rows in a swizzled [TK][D] tile (see swz), read with ldmatrix.
template <int D> struct MmaKvF16 {
    static constexpr int TK = attn_tile_keys<D, __half>();
    static constexpr int ROW = D * 2;
    static constexpr int TILE = TK * ROW;
    static constexpr int KSTEPS = D / 16;

    // Keys [jt + r0, jt + r1) of one kv head (`src`: its row 0, `stride` bytes
    // apart) into tile rows [r0, r1) by a block of THREADS; rows at or past nk
    // are zero-filled.
    template <int THREADS>
    __device__ static void load(unsigned char* tile, const unsigned char* src, int64_t stride, int jt, int nk,
                                int r0 = 0, int r1 = TK) {
        constexpr int CPR = D / 8;  // 16-byte chunks per row
        __half* t = reinterpret_cast<__half*>(tile);
        for (int i = threadIdx.x + r0 * CPR; i < r1 * CPR; i += THREADS) {
            const int r = i / CPR, c = i % CPR;
            const bool valid = r < nk;
            cp_async16(t + swz<D>(r, c), src + int64_t(jt + (valid ? r : 0)) * stride + c * 16, valid);
        }
    }
    // c += K [keys kb ..][d] . Q^T [d][head] over the whole head dim (q: a
    // QFrags source).
    template <class Q>
    __device__ static void scores(float (&c)[4], const unsigned char* tile, int kb, int lane, const Q& q) {
        const uint32_t addr = smem_addr(tile);
        const int r = kb + lane % 16;  // ldmatrix: key tile row lane % 16, chunk 2 k + lane / 16
#pragma unroll
        for (int k = 0; k < KSTEPS; ++k) {
            uint32_t ka[4];
            ldsm_x4(addr + 2 * uint32_t(swz<D>(r, 2 * k + lane / 16)), ka);
            const uint4 f = q.get(k);
            mma_16816(c, ka, f.x, f.y);
            mma_16816(c, ka, f.z, f.w);
        }
    }
    // o[i] += V^T [cols 16 (w OM + i) ..][keys 16 kp ..] . P^T [keys][head]; p:
    // this lane's P[head grp][keys 16 kp + 2 quad, +1] (p[0]) and + 8 (p[1]).
    template <int OM>
    __device__ static void pv(float (&o)[OM][4], const unsigned char* tile, const float2 (&p)[2], int kp, int wid,
                              int lane) {
        uint32_t bh[2], bl[2];
        split_half2(p[0].x, p[0].y, bh[0], bl[0]);
        split_half2(p[1].x, p[1].y, bh[1], bl[1]);
        const uint32_t addr = smem_addr(tile);
        const int r = 16 * kp + lane % 8 + 8 * (lane / 16);  // ldmatrix.trans: key row, chunk 2 cm + (lane / 8) % 2
#pragma unroll
        for (int i = 0; i < OM; ++i) {
            const int cm = wid * OM + i;
            uint32_t va[4];
            ldsm_x4_trans(addr + 2 * uint32_t(swz<D>(r, 2 * cm + (lane / 8) % 2)), va);
            mma_16816(o[i], va, bh[0], bh[1]);
            mma_16816(o[i], va, bl[0], bl[1]);
        }
    }
    // The head-dim column of accumulator row grp + 8 r8 in 16-column tile cm.
    __device__ static int col(int cm, int grp, int r8) { return 16 * cm + grp + 8 * r8; }
};

// q8_0 rows (the GGUF block: an f16 scale, 32 int8 values; D / 32 blocks, 34
// bytes each) as they are in the cache, [TK][ROW] bytes. The int8 values go
// into the mma as exact f16 and the block scales outside it: a score is
// sum over blocks b of d_k[key, b] x (q . k_int over b's two k-steps), and P V
// takes P scaled by d_v[key, b] for the output columns in block b. q and P
// still go in as two f16 terms, so the result keeps f32 precision against the
// dequantized cache (as the CPU backend computes it). Half the bytes of f16.
template <int D> struct MmaKvQ8 {
    static constexpr int NB = D / 32;
    static constexpr int ROW = NB * 34;
    static constexpr int TK = 128;             // a tile of ~ the f16 tile's bytes at d 256
    static constexpr int TILE = TK * ROW;
    static constexpr int KSTEPS = D / 16;
    static constexpr int CP = ROW % 16 == 0 ? 16 : (ROW % 8 == 0 ? 8 : 4);  // cp.async size (272, 136, 68 B)
    static_assert(D % 32 == 0 && TILE % 16 == 0, "q8_0 tile");

    template <int THREADS>
    __device__ static void load(unsigned char* tile, const unsigned char* src, int64_t stride, int jt, int nk,
                                int r0 = 0, int r1 = TK) {
        constexpr int CPR = ROW / CP;
        for (int i = threadIdx.x + r0 * CPR; i < r1 * CPR; i += THREADS) {
            const int r = i / CPR, c = i % CPR;
            const bool valid = r < nk;
            const unsigned char* from = src + int64_t(jt + (valid ? r : 0)) * stride + c * CP;
            if constexpr (CP == 16)
                cp_async16(tile + r * ROW + c * CP, from, valid);
            else
                cp_async_small<CP>(tile + r * ROW + c * CP, from, valid);
        }
    }
    __device__ static float scale_at(const unsigned char* block) {
        return __half2float(*reinterpret_cast<const __half*>(block));
    }
    // Two int8 of a row as the half2 of an A fragment (2-byte aligned).
    __device__ static uint32_t pair_at(const unsigned char* p) {
        return i8x2_to_half2(*reinterpret_cast<const uint16_t*>(p));
    }
    // A fragment rows: keys kb + grp (a0, a2) and + 8 (a1, a3); columns 2 quad, +1
    // (a0, a1) and + 8 (a2, a3) of k-step k.
    template <class Q>
    __device__ static void scores(float (&c)[4], const unsigned char* tile, int kb, int lane, const Q& q) {
        const int grp = lane / 4, quad = lane % 4;
        const unsigned char* r0 = tile + (kb + grp) * ROW;
        const unsigned char* r1 = r0 + 8 * ROW;
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            float t[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int k = 2 * b + h, e = 34 * b + 2 + 16 * h + 2 * quad;
                const uint32_t ka[4] = {pair_at(r0 + e), pair_at(r1 + e), pair_at(r0 + e + 8), pair_at(r1 + e + 8)};
                const uint4 f = q.get(k);
                mma_16816(t, ka, f.x, f.y);
                mma_16816(t, ka, f.z, f.w);
            }
            const float d0 = scale_at(r0 + 34 * b), d1 = scale_at(r1 + 34 * b);
            c[0] = fmaf(d0, t[0], c[0]);
            c[1] = fmaf(d0, t[1], c[1]);
            c[2] = fmaf(d1, t[2], c[2]);
            c[3] = fmaf(d1, t[3], c[3]);
        }
    }
    // A fragment (V^T): k = keys 16 kp + 2 quad, +1 (a0, a1) and + 8 (a2, a3);
    // its rows grp and grp + 8 are the adjacent columns 2 grp and 2 grp + 1 of
    // the 16-column tile (a permutation of the mma's rows, undone by col()), so
    // one 2-byte load per key serves both: the blocks' 2-byte alignment allows
    // no wider load, and single bytes of two keys per register took twice the
    // loads and conversions (32k keys: 37.8 -> 35.4 us per layer on an H200).
    // A warp's 16-column tiles lie in one block each (OM even, or OM = 1 and
    // 16 columns); P is scaled per block, recomputed when it changes.
    template <int OM>
    __device__ static void pv(float (&o)[OM][4], const unsigned char* tile, const float2 (&p)[2], int kp, int wid,
                              int lane) {
        static_assert(OM == 1 || OM % 2 == 0, "16-column tiles within 32-column blocks");
        const int grp = lane / 4, quad = lane % 4;
        const unsigned char* k0 = tile + (16 * kp + 2 * quad) * ROW;  // keys 16 kp + 2 quad, +1, +8, +9
        uint32_t bh[2], bl[2];
#pragma unroll
        for (int i = 0; i < OM; ++i) {
            const int cm = wid * OM + i, b = cm / 2;
            if (i % 2 == 0) {
#pragma unroll
                for (int h8 = 0; h8 < 2; ++h8) {
                    const unsigned char* kr = k0 + 8 * h8 * ROW + 34 * b;
                    split_half2(p[h8].x * scale_at(kr), p[h8].y * scale_at(kr + ROW), bh[h8], bl[h8]);
                }
            }
            const unsigned char* v = k0 + 34 * b + 2 + 16 * (cm % 2) + 2 * grp;
            uint32_t va[4];
#pragma unroll
            for (int h8 = 0; h8 < 2; ++h8) {  // keys + 8 h8 and + 1: columns 2 grp (va[2 h8]) and + 1
                const unsigned char* x = v + 8 * h8 * ROW;
                const uint32_t w = __byte_perm(*reinterpret_cast<const uint16_t*>(x),
                                               *reinterpret_cast<const uint16_t*>(x + ROW), 0x5410) ^ 0x80808080u;
                const __half2 c0 = bytes_to_half2(w, 0x4240, 1152.f), c1 = bytes_to_half2(w, 0x4341, 1152.f);
                va[2 * h8] = *reinterpret_cast<const uint32_t*>(&c0);
                va[2 * h8 + 1] = *reinterpret_cast<const uint32_t*>(&c1);
            }
            mma_16816(o[i], va, bh[0], bh[1]);
            mma_16816(o[i], va, bl[0], bl[1]);
        }
    }
    __device__ static int col(int cm, int grp, int r8) { return 16 * cm + 2 * grp + r8; }
};

// q of one head as the scores' B fragments of k-step k, scaled, in two f16
// terms: {hi b0, hi b1, lo b0, lo b1} (b0: d = 16 k + 2 quad, +1; b1: the same
// + 8). A null row gives zeros (heads past the group).
__device__ __forceinline__ uint4 q_frag(const float* qrow, float scale, int k, int quad) {
    uint4 f = make_uint4(0u, 0u, 0u, 0u);
    if (qrow) {
        const int e = 16 * k + 2 * quad;
        split_half2(qrow[e] * scale, qrow[e + 1] * scale, f.x, f.z);
        split_half2(qrow[e + 8] * scale, qrow[e + 9] * scale, f.y, f.w);
    }
    return f;
}
__device__ __forceinline__ const float* q_row(const AttnArgs& a, int g, int t, int h) {
    return h < a.group ? a.q + int64_t(t) * a.q_t + int64_t(g * a.group + h) * a.q_h : nullptr;
}

// Where the split kernel's warps find q's fragments (get(k): this lane's, of
// head lane / 4): registers, or a [KSTEPS][4 GT lanes] table in shared memory
// (`smem`, KSTEPS * GT * 64 bytes) that the block fills.
template <bool SMEM, int KSTEPS, int GT> struct QFrags {
    uint4 f[KSTEPS];
    __device__ void init(const AttnArgs& a, int g, int t, unsigned char*, int, int lane, int) {
        const float* qrow = q_row(a, g, t, lane / 4);
#pragma unroll
        for (int k = 0; k < KSTEPS; ++k) f[k] = q_frag(qrow, a.scale, k, lane % 4);
    }
    __device__ uint4 get(int k) const { return f[k]; }
};
template <int KSTEPS, int GT> struct QFrags<true, KSTEPS, GT> {
    static constexpr int LANES = 4 * GT;
    static constexpr size_t BYTES = size_t(KSTEPS) * LANES * sizeof(uint4);
    const uint4* f;
    __device__ void init(const AttnArgs& a, int g, int t, unsigned char* smem, int tid, int lane, int threads) {
        uint4* table = reinterpret_cast<uint4*>(smem);
        for (int i = tid; i < KSTEPS * LANES; i += threads)
            table[i] = q_frag(q_row(a, g, t, (i % LANES) / 4), a.scale, i / LANES, i % 4);
        f = lane < LANES ? table + lane : nullptr;
    }
    __device__ uint4 get(int k) const { return f ? f[k * LANES] : make_uint4(0u, 0u, 0u, 0u); }
};

// The split kernel on the tensor cores (sm_80+) for an f16 or q8_0 cache (Fmt
// above): the same blocks, splits and partials as attn_split_kernel, with both
// products as mma.sync m16n8k16 (f16 inputs, f32 accumulators). The group's
// heads are the mma's n = 8 columns, so keys and head-dim columns fill the
// m = 16 rows:
//   scores  S^T [key][head] = K [key][d] . Q^T [d][head]
//   P V     O^T [col][head] += V^T [col][key] . P^T [key][head]
// q and P go in as two f16 terms each (x = hi + lo, lo = f16(x - hi)). K and V
// are exact in f16 (f16 cache, or the int8 of q8_0 with the scales applied in
// f32), so both products keep ~22 bits of their f32 operand: the result agrees
// with the f32 CUDA-core kernel to ~1e-6 relative, not the ~1e-3 of f16 q and
// P, and decode stays within the CPU backend's rounding.
//
// Why: the CUDA-core kernel spent ~1,500 instructions per thread and 64-key
// tile (d 256) on the two products and ran at 1.5 TB/s at 32k keys, issue-bound
// at 15% occupancy (three 70 KB blocks per SM); here they take ~150.
//
// Per tile of TK keys (K and V through shared memory with cp.async; the next
// K loads during this tile's softmax and P V, the next V during the next
// scores):
//  - warp w computes the scores of its 16-key row tiles in registers;
//  - online softmax in those registers: the per-head tile max over the warps
//    goes through shared memory once; a thread holds heads 2 quad and
//    2 quad + 1 of the scores' accumulator layout, which is also the output's,
//    so the rescaling of O needs no exchange; row sums stay per thread until
//    the end;
//  - P goes through shared memory (the mma's B layout has the keys where the
//    scores' accumulators have them in the other dimension);
//  - warp w accumulates O for its D / 4 columns over all keys of the tile, so
//    the warps need no merge at the end.
// Heads >= G get q = 0 and are not written.
//
// NW warps per block: 4, with q's fragments in registers (64 of them at d 256),
// or 8 (q8_0 at d >= 128), with the fragments in shared memory and one 16-key
// score tile and one 32-column block of the output per warp. The q8_0 kernel
// is bound by instruction latency, not bytes (the int8 -> f16 conversions; 2.6
// warps per scheduler at 4 warps, registers and shared memory both allowing 3
// blocks per SM): 8 warps under 80 registers fit 3 blocks per SM, twice the
// warps to hide the latencies with.
template <int D, int GT, typename Fmt, int NW>
__global__ void __launch_bounds__(NW * WARP, 3) attn_split_mma_kernel(AttnArgs a) {
    if (!a.trigger_late) pdl_trigger_at_top();
    constexpr int TK = Fmt::TK;
    constexpr int THREADS = NW * WARP;
    constexpr int KSTEPS = D / 16;             // score k-steps over the head dim
    constexpr int SM_PER_WARP = TK / 16 / NW;  // 16-key score row tiles per warp
    constexpr int OM_PER_WARP = D / 16 / NW;   // 16-column output row tiles per warp
    constexpr int PS = D + ATTN_PART_HDR;
    static_assert(SM_PER_WARP >= 1 && TK % (16 * NW) == 0 && OM_PER_WARP >= 1 && D % (16 * NW) == 0, "shape");
    static_assert(GT <= 8, "the group's heads fill the mma's 8 columns");
    __shared__ __align__(16) float ps[GT][TK];  // probabilities [head][key]
    __shared__ float red[8][NW];               // per head and warp: tile max, then the final sums
    __shared__ float lsum[8];
    extern __shared__ __align__(128) unsigned char attn_smem[];
    unsigned char* ks = attn_smem;  // Fmt's K tile, then its V tile
    unsigned char* vs = attn_smem + Fmt::TILE;

    const int g = blockIdx.x, t = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % WARP, wid = tid / WARP;
    const int grp = lane / 4, quad = lane % 4;  // mma fragment coordinates
    const int h0 = 2 * quad, h1 = 2 * quad + 1;  // this thread's heads in the accumulators
    const int G = a.group;
    const int n_head = a.n_kv * G;
    const int ns = a.n_split;
    // pos and slot are copied in before the step's kernels: readable before the wait
    const AttnSplitWork sw = attn_split_work<Fmt::ROW>(a);
    const int j0 = sw.j0, j1 = sw.j1, nu = sw.nu;
    if (j0 >= j1) return;  // a split past the context (block-uniform)
    const int64_t row_stride = int64_t(a.n_kv) * Fmt::ROW;  // bytes
    // The first tile's rows that earlier steps wrote start loading before the
    // wait, while the kernels before this one (q / k norms, rope, the store of
    // this step's rows) finish: the cache stream starts without waiting for
    // them. The rest follows the wait. K's group holds the early V rows too.
    const int nk0 = min(TK, j1 - j0);
    const int early = a.fresh > 0 ? max(0, min(nk0, sw.n - a.fresh - j0)) : 0;
    if (early > 0) {
        Fmt::template load<THREADS>(ks, sw.K, row_stride, j0, nk0, 0, early);
        Fmt::template load<THREADS>(vs, sw.V, row_stride, j0, nk0, 0, early);
    }
    if (a.trigger_late) pdl_wait();
    else pdl_wait_inputs();
    Fmt::template load<THREADS>(ks, sw.K, row_stride, j0, nk0, early, TK);
    cp_async_commit();
    Fmt::template load<THREADS>(vs, sw.V, row_stride, j0, nk0, early, TK);
    cp_async_commit();

    QFrags<(NW > 4), KSTEPS, GT> q;  // published by the first tile's barrier
    q.init(a, g, t, attn_smem + 2 * Fmt::TILE, tid, lane, THREADS);

    float m0 = -INFINITY, m1 = -INFINITY;  // running max of heads h0, h1 (block-uniform per head)
    float l0 = 0.f, l1 = 0.f;              // this thread's share of their running sums
    float o[OM_PER_WARP][4];
#pragma unroll
    for (int i = 0; i < OM_PER_WARP; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

    for (int jt = j0; jt < j1; jt += TK) {
        const int nk = min(TK, j1 - jt);
        const int jn = jt + TK, nn = min(TK, j1 - jn);
        cp_async_wait<1>();  // this tile's K
        __syncthreads();

        // scores of the warp's key tiles; c[i]: keys 16 (w SM + i) + grp (c0, c1) and
        // + 8 (c2, c3), heads h0 (c0, c2) and h1 (c1, c3); keys past the tile: -inf
        float c[SM_PER_WARP][4];
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int i = 0; i < SM_PER_WARP; ++i) {
            const int kb = (wid * SM_PER_WARP + i) * 16;
            c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.f;
            if (kb < nk) Fmt::scores(c[i], ks, kb, lane, q);  // warp-uniform
            if (kb + grp >= nk) c[i][0] = c[i][1] = -INFINITY;
            if (kb + grp + 8 >= nk) c[i][2] = c[i][3] = -INFINITY;
            mx0 = fmaxf(mx0, fmaxf(c[i][0], c[i][2]));
            mx1 = fmaxf(mx1, fmaxf(c[i][1], c[i][3]));
        }
        // the tile max per head: over the 8 lanes of a quad, then over the warps
#pragma unroll
        for (int o2 = 4; o2 < WARP; o2 <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
        }
        if (grp == 0) {
            red[h0][wid] = mx0;
            red[h1][wid] = mx1;
        }
        __syncthreads();  // red complete; every warp is done with ks
        if (nn > 0) Fmt::template load<THREADS>(ks, sw.K, row_stride, jn, nn);
        cp_async_commit();

        float tm0 = red[h0][0], tm1 = red[h1][0];
#pragma unroll
        for (int w = 1; w < NW; ++w) {
            tm0 = fmaxf(tm0, red[h0][w]);
            tm1 = fmaxf(tm1, red[h1][w]);
        }
        const float mn0 = fmaxf(m0, tm0), mn1 = fmaxf(m1, tm1);  // finite: the tile has a key
        const float corr0 = expf(m0 - mn0), corr1 = expf(m1 - mn1);  // 0 on the first tile
        m0 = mn0;
        m1 = mn1;
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int i = 0; i < SM_PER_WARP; ++i) {
            const int kb = (wid * SM_PER_WARP + i) * 16;
            const float p0 = expf(c[i][0] - mn0), p1 = expf(c[i][1] - mn1);  // exp(-inf) = 0
            const float p2 = expf(c[i][2] - mn0), p3 = expf(c[i][3] - mn1);
            sum0 += p0 + p2;
            sum1 += p1 + p3;
            if (h0 < GT) {
                ps[h0][kb + grp] = p0;
                ps[h0][kb + grp + 8] = p2;
            }
            if (h1 < GT) {
                ps[h1][kb + grp] = p1;
                ps[h1][kb + grp + 8] = p3;
            }
        }
        l0 = l0 * corr0 + sum0;
        l1 = l1 * corr1 + sum1;
#pragma unroll
        for (int i = 0; i < OM_PER_WARP; ++i) {
            o[i][0] *= corr0;
            o[i][1] *= corr1;
            o[i][2] *= corr0;
            o[i][3] *= corr1;
        }
        cp_async_wait<1>();  // this tile's V (the next K may still be in flight)
        __syncthreads();     // ps complete

        // P V for the warp's columns, 16 keys per step
#pragma unroll
        for (int kp = 0; kp < TK / 16; ++kp) {
            if (16 * kp >= nk) break;  // block-uniform
            // P[head grp][keys 16 kp + 2 quad, +1] and the same + 8 (heads >= GT: 0)
            float2 p[2] = {make_float2(0.f, 0.f), make_float2(0.f, 0.f)};
            if (grp < GT)
#pragma unroll
                for (int h8 = 0; h8 < 2; ++h8)
                    p[h8] = *reinterpret_cast<const float2*>(&ps[grp][16 * kp + 8 * h8 + 2 * quad]);
            Fmt::template pv<OM_PER_WARP>(o, vs, p, kp, wid, lane);
        }
        __syncthreads();  // ps, red and vs are rewritten by the next tile
        if (nn > 0) Fmt::template load<THREADS>(vs, sw.V, row_stride, jn, nn);
        cp_async_commit();
    }
    cp_async_wait<0>();  // (only empty groups are left)
    if (a.trigger_late) pdl_launch_dependents();

    // the row sums: over the 8 lanes of a quad, then over the warps (in warp order)
#pragma unroll
    for (int o2 = 4; o2 < WARP; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    if (grp == 0) {
        red[h0][wid] = l0;
        red[h1][wid] = l1;
    }
    __syncthreads();
    if (tid < 8) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) sum += red[tid][w];
        lsum[tid] = sum;
    }
    __syncthreads();
    // o[i]: accumulator rows grp (o0, o1) and + 8 (o2, o3) of column tile cm (columns: Fmt::col); heads
    // h0 (o0, o2) and h1 (o1, o3)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int h = hh ? h1 : h0;
        if (h >= G) continue;
        const int64_t row = int64_t(t) * n_head + g * G + h;
        const float lh = lsum[h];
#pragma unroll
        for (int i = 0; i < OM_PER_WARP; ++i) {
            const int cm = wid * OM_PER_WARP + i;
            const int e0 = Fmt::col(cm, grp, 0), e1 = Fmt::col(cm, grp, 1);
            if (nu == 1) {
                a.out[row * D + e0] = o[i][hh] / lh;
                a.out[row * D + e1] = o[i][2 + hh] / lh;
            } else {
                float* w = a.work + (row * ns + split) * PS;
                if (i == 0 && grp == 0 && wid == 0) {
                    w[0] = hh ? m1 : m0;
                    w[1] = lh;
                }
                w[ATTN_PART_HDR + e0] = o[i][hh];
                w[ATTN_PART_HDR + e1] = o[i][2 + hh];
            }
        }
    }
}

// block_max / block_sum of one group of ATTN_THREADS threads (gtid: the
// thread's index in its group; red: the group's ATTN_THREADS / WARP floats), in
// their order, so a group of a larger block gives a one-group block's bits.
// Every thread of the block calls (barriers).
template <bool MAX> __device__ __forceinline__ float attn_group_reduce(float v, float* red, int gtid) {
    const int lane = gtid % WARP, wid = gtid / WARP;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();  // red may still be read by a previous call
    if (lane == 0) red[wid] = v;
    __syncthreads();
    v = lane < ATTN_THREADS / WARP ? red[lane] : (MAX ? -INFINITY : 0.f);
    return MAX ? warp_max(v) : warp_sum(v);
}

// What one group of ATTN_THREADS threads needs in shared memory to merge.
struct AttnCombineSmem {
    static constexpr int CQ = ATTN_COMBINE_COLS / 4;  // float4 columns
    static constexpr int SL = ATTN_THREADS / CQ;      // split slices
    float f[ATTN_MAX_SPLITS];
    float red[ATTN_THREADS / WARP];
    float4 part[SL][CQ];
};

// Merges the partials w (one head and token: nu splits in use, stride D +
// ATTN_PART_HDR) for columns [c0, c0 + ATTN_COMBINE_COLS), one group of
// ATTN_THREADS threads = 16 float4 columns x 8 split slices. Threads gtid < 16
// get columns c0 + 4 gtid .. + 3 of the output. Every thread of the block calls.
template <int D>
__device__ __forceinline__ float4 attn_combine_cols(const float* __restrict__ w, int nu, int c0, int gtid,
                                                    AttnCombineSmem& sm) {
    constexpr int PS = D + ATTN_PART_HDR;
    constexpr int CQ = AttnCombineSmem::CQ, SL = AttnCombineSmem::SL;
    static_assert(D % ATTN_COMBINE_COLS == 0 && ATTN_MAX_SPLITS <= ATTN_THREADS, "combine shape");
    // Every load goes out before the reductions: the thread's columns of each
    // of its splits (up to ATTN_MAX_SPLITS / SL), then m and l. Loaded after the
    // reductions in groups of four, 96 splits (32k keys) took three L2 round
    // trips behind the reductions' barriers. Plain (not read-only) loads: the
    // compiler sinks read-only ones below the barriers to save registers, and
    // may not move these across them.
    constexpr int XS = ATTN_MAX_SPLITS / SL;
    const int cq = gtid % CQ, sl = gtid / CQ;
    const float* wc = w + ATTN_PART_HDR + c0 + cq * 4;
    float4 x[XS];
#pragma unroll
    for (int i = 0; i < XS; ++i)
        if (sl + i * SL < nu) x[i] = __ldcg(reinterpret_cast<const float4*>(wc + int64_t(sl + i * SL) * PS));
    const float ms = gtid < nu ? w[gtid * PS] : -INFINITY;
    const float ls = gtid < nu ? w[gtid * PS + 1] : 0.f;
    const float mt = attn_group_reduce<true>(ms, sm.red, gtid);
    const float fs = gtid < nu ? expf(ms - mt) : 0.f;
    if (gtid < ATTN_MAX_SPLITS) sm.f[gtid] = fs;
    const float lt = attn_group_reduce<false>(ls * fs, sm.red, gtid);  // its barriers also publish f
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < XS; ++i) {  // splits sl, sl + SL, ... in order, as before
        if (sl + i * SL >= nu) break;
        const float fw = sm.f[sl + i * SL];
        acc.x = fmaf(fw, x[i].x, acc.x);
        acc.y = fmaf(fw, x[i].y, acc.y);
        acc.z = fmaf(fw, x[i].z, acc.z);
        acc.w = fmaf(fw, x[i].w, acc.w);
    }
    sm.part[sl][cq] = acc;
    __syncthreads();
    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
    if (gtid < CQ) {
        r = sm.part[0][gtid];
#pragma unroll
        for (int s = 1; s < SL; ++s) {
            r.x += sm.part[s][gtid].x;
            r.y += sm.part[s][gtid].y;
            r.z += sm.part[s][gtid].z;
            r.w += sm.part[s][gtid].w;
        }
        const float inv = 1.f / lt;
        r = make_float4(r.x * inv, r.y * inv, r.z * inv, r.w * inv);
    }
    return r;
}

// Merges the partials of the splits in use for one (head, token, 64 columns):
// grid (n_head, T, D / 64), ATTN_THREADS threads. Exits at once when one split
// covered the context (it wrote out).
template <int D>
__global__ void __launch_bounds__(ATTN_THREADS) attn_combine_kernel(const float* __restrict__ work, int ns,
                                                                    const int32_t* __restrict__ pos,
                                                                    float* __restrict__ out) {
    pdl_enter();
    __shared__ AttnCombineSmem sm;
    const int h = blockIdx.x, t = blockIdx.y, c0 = blockIdx.z * ATTN_COMBINE_COLS, n_head = gridDim.x;
    const int nu = attn_splits_used(pos[t] + 1, ns);
    if (nu <= 1) return;
    const float* w = work + (int64_t(t) * n_head + h) * ns * (D + ATTN_PART_HDR);
    const float4 r = attn_combine_cols<D>(w, nu, c0, threadIdx.x, sm);
    if (threadIdx.x < AttnCombineSmem::CQ) {
        float* o = out + (int64_t(t) * n_head + h) * D + c0 + threadIdx.x * 4;
        o[0] = r.x;
        o[1] = r.y;
        o[2] = r.z;
        o[3] = r.w;
    }
}

}  // namespace qinfer::cuda
