// Attention kernels (see attention.cu for the plan).
#pragma once
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/launch.cuh"

namespace qinfer::cuda {

struct AttnArgs {
    const float* q;          // q row of (token t, head h) at q + t*q_t + h*q_h
    int64_t q_h, q_t;
    const void* K;           // {d, n_kv, n_ctx, n_slots}, half or float
    const void* V;
    int n_kv;
    int64_t n_ctx;
    int group;               // query heads per kv head
    const int32_t* pos;
    const int32_t* slot;
    float scale;
    float* out;              // [T][n_head][d]
    float* work;             // chunk partials [T][n_head][n_split][d + ATTN_PART_HDR]: m, l, -, -, acc[d]
    int chunk;               // keys per chunk (fixed by the cache capacity)
    int n_split;             // chunk blocks launched per token (from the capacity)
};

constexpr int ATTN_THREADS = 128;
// Keys per tile at most; a chunk is a multiple of this.
constexpr int ATTN_TILE_MAX = 64;
constexpr int ATTN_PASS_TILE = 128;  // keys per tile of the one-pass (prompt) kernel
constexpr int ATTN_MAX_SPLITS = 128; // chunks per cache at most
constexpr int ATTN_PART_HDR = 4;     // m, l and padding, so acc[] stays 16-byte aligned

// A softmax state over some keys: running max m, sum l (acc lives apart).
// Merging the state of the next chunk (mc, lc) returns the weights of the old
// and the new part. The combine folds chunks left to right, so a token's
// result depends on its keys and the chunk size only.
struct AttnFold {
    float a, b;
};
__device__ __forceinline__ AttnFold attn_fold(float& m, float& l, float mc, float lc) {
    const float mn = fmaxf(m, mc);
    AttnFold f;
    f.a = expf(m - mn);  // 0 on the first chunk (m = -inf; a chunk is never empty)
    f.b = expf(mc - mn);
    m = mn;
    l = l * f.a + lc * f.b;
    return f;
}
__device__ __forceinline__ float attn_fold_acc(float acc, float accc, const AttnFold& f) {
    return acc * f.a + accc * f.b;
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

// Tile shape for head dim D and cache element KT: a tile's K and V rows are
// loaded with all loads in flight at once (at most 16 16-byte loads per thread
// each), so a short context waits on memory about twice in all.
template <int D, typename KT> struct AttnShape {
    static constexpr int VEC = 16 / sizeof(KT);   // elements per 16-byte load
    static constexpr int ROW_LOADS = D / VEC;     // 16-byte loads per K / V row
    static constexpr int TILE = 16 * ATTN_THREADS / ROW_LOADS < ATTN_TILE_MAX
                                    ? 16 * ATTN_THREADS / ROW_LOADS : ATTN_TILE_MAX;  // keys per tile
    static constexpr int KL = 4;                  // score phase: loads per thread per key
    static constexpr int TPK = ROW_LOADS / KL;    // threads per key
    static constexpr int KPP = ATTN_THREADS / TPK;  // keys per pass
    static constexpr int NP = TILE / KPP;         // passes per tile
    static constexpr int TPR = ROW_LOADS;         // PV phase: threads per V row
    static constexpr int NG = ATTN_THREADS / TPR; // row groups
    static constexpr int RPG = TILE / NG;         // rows per group per tile
    static_assert(TPK >= 1 && TPK <= WARP && WARP % TPK == 0 && TILE % KPP == 0, "head dim");
    static_assert(NG >= 1 && ATTN_THREADS % TPR == 0 && TILE % NG == 0, "head dim");
    static_assert(TILE <= ATTN_THREADS && ATTN_TILE_MAX % TILE == 0, "tile");
};

// Decode steps: one block per (kv head, token, chunk) serves all query heads
// of the group, so every cached K/V byte is read once per token. GT >= group
// (compile-time bound of the per-head register arrays); D the head dim.
//
// A chunk is `a.chunk` keys (fixed by the cache capacity, never by the step),
// processed in tiles of up to TILE keys (AttnShape):
//  - all K and V loads of the tile are issued first;
//  - scores: TPK threads share a key, each dotting 4 x 16 bytes of it with the
//    group's q, then a shuffle sum;
//  - softmax: thread i takes key i of the tile (online max / sum per head);
//  - P V: groups of TPR threads hold whole V rows, RPG rows each; the groups
//    merge in group order at the end of the chunk.
// A context of one chunk writes the normalized output; otherwise each chunk's
// state (m, l, acc) goes to the work buffer and attn_combine_kernel folds them
// left to right. A token's result depends only on its own keys and the
// capacity, never on the other tokens of its (decode) step.
template <int D, int GT, typename KT>
__global__ void __launch_bounds__(ATTN_THREADS) attn_chunk_kernel(AttnArgs a) {
    pdl_enter();
    using S = AttnShape<D, KT>;
    constexpr int VEC = S::VEC, KL = S::KL, TPK = S::TPK, KPP = S::KPP, NP = S::NP, TILE = S::TILE;
    constexpr int TPR = S::TPR, NG = S::NG, RPG = S::RPG;
    constexpr int PS = D + ATTN_PART_HDR;
    __shared__ __align__(16) float qs[GT][D];
    __shared__ float ps[GT][TILE];
    __shared__ float red[GT][ATTN_THREADS / WARP];
    __shared__ float accs[GT][D];  // the chunk's P V

    const int g = blockIdx.x, t = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % WARP, wid = tid / WARP;
    const int G = a.group;
    const int n_head = a.n_kv * G;
    const int n = a.pos[t] + 1;
    const int64_t slot = a.slot[t];
    // q is loaded (and accs cleared) before the chunk is known to be in use, so
    // that these loads overlap the one of pos instead of following it.
    for (int i = tid; i < GT * D; i += ATTN_THREADS) {
        const int h = i / D, e = i % D;
        qs[h][e] = h < G ? a.q[int64_t(t) * a.q_t + int64_t(g * G + h) * a.q_h + e] * a.scale : 0.f;
        accs[h][e] = 0.f;
    }
    const int C = a.chunk;
    const int nu = (n + C - 1) / C;  // chunks in use
    if (split >= nu) return;  // a chunk past the context (block-uniform): nothing to write either
    __syncthreads();

    const KT* Kb = static_cast<const KT*>(a.K) + (slot * a.n_ctx * a.n_kv + g) * D;
    const KT* Vb = static_cast<const KT*>(a.V) + (slot * a.n_ctx * a.n_kv + g) * D;
    const int64_t row_stride = int64_t(a.n_kv) * D;
    const int kk = tid / TPK, kr = tid % TPK;  // score phase: key kk of a pass, quarter kr of it
    const int vg = tid / TPR, vc = tid % TPR;  // PV phase: row group, 16-byte column

    float m[GT], l[GT];  // the chunk's softmax state (block-uniform)
    {
        const int j0 = split * C, j1 = min(n, j0 + C);
        float acc[GT][VEC];
#pragma unroll
        for (int h = 0; h < GT; ++h) {
            m[h] = -INFINITY;
            l[h] = 0.f;
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[h][v] = 0.f;
        }
        for (int jt = j0; jt < j1; jt += TILE) {
            const int nk = min(TILE, j1 - jt);  // keys in this tile
            int4 kraw[NP][KL], vraw[RPG];
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                const int jl = p * KPP + kk;
                if (jl < nk) {
                    const KT* row = Kb + int64_t(jt + jl) * row_stride;
#pragma unroll
                    for (int i = 0; i < KL; ++i) kraw[p][i] = ld16(row + (i * TPK + kr) * VEC);
                }
            }
#pragma unroll
            for (int u = 0; u < RPG; ++u)
                if (vg + u * NG < nk) vraw[u] = ld16(Vb + int64_t(jt + vg + u * NG) * row_stride + vc * VEC);

            // scores -> ps
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                const int jl = p * KPP + kk;
                float s[GT];
#pragma unroll
                for (int h = 0; h < GT; ++h) s[h] = 0.f;
                if (jl < nk) {
#pragma unroll
                    for (int i = 0; i < KL; ++i) {
                        float kf[VEC];
                        to_floats<KT>(kraw[p][i], kf);
                        const int e0 = (i * TPK + kr) * VEC;
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
            __syncthreads();

            // online softmax over the tile, per head (thread tid: key tid)
            const bool valid = tid < nk;
            float s[GT];
#pragma unroll
            for (int h = 0; h < GT; ++h) s[h] = valid ? ps[h][tid] : -INFINITY;
#pragma unroll
            for (int h = 0; h < GT; ++h) {
                const float mt = warp_max(s[h]);
                if (lane == 0) red[h][wid] = mt;
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
#pragma unroll
            for (int h = 0; h < GT; ++h) {
                if (tid < TILE) ps[h][tid] = s[h];
                const float ts = warp_sum(s[h]);
                if (lane == 0) red[h][wid] = ts;
            }
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
#pragma unroll
            for (int u = 0; u < RPG; ++u) {
                const int jj = vg + u * NG;
                if (jj < nk) {
                    float vf[VEC];
                    to_floats<KT>(vraw[u], vf);
#pragma unroll
                    for (int h = 0; h < GT; ++h) {
                        const float p = ps[h][jj];
#pragma unroll
                        for (int v = 0; v < VEC; ++v) acc[h][v] = fmaf(p, vf[v], acc[h][v]);
                    }
                }
            }
            __syncthreads();  // ps and red are rewritten by the next tile
        }

        // merge the NG row groups, in group order: the result must not depend on
        // which warps arrive first (shared-memory atomics summed in arrival order,
        // so the same step could round differently from run to run)
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
            float* w = a.work + ((int64_t(t) * n_head + g * G + h) * a.n_split + split) * PS;
            if (e == 0) {
                w[0] = mh;
                w[1] = lh;
            }
            w[ATTN_PART_HDR + e] = accs[h][e];
        }
    }
}

// Prompt-sized steps: one block per (kv head, token) makes one pass over the
// keys in tiles of ATTN_PASS_TILE (one key per thread in the softmax); the V
// rows of a tile's first keys are loaded before its scores. Fewer registers
// than the chunk kernel (more blocks per SM) and no per-chunk fold: prompts of
// thousands of tokens run this. It rounds differently from the chunk kernel
// (decode steps), so a decode token that shares a step with a prompt chunk
// can differ in the last bits from one in a decode-only step.
template <int D, int GT, typename KT>
__global__ void __launch_bounds__(ATTN_THREADS) attn_pass_kernel(AttnArgs a) {
    pdl_enter();
    constexpr int VEC = 16 / sizeof(KT);  // elements per 16-byte load
    constexpr int KL = 4;                 // 16-byte loads per thread per key (score phase)
    constexpr int TPK = D / (VEC * KL);   // threads per key
    constexpr int KPP = ATTN_THREADS / TPK;  // keys per pass
    constexpr int TPR = D / VEC;          // threads per V row in the PV phase
    constexpr int NG = ATTN_THREADS / TPR;   // V rows in flight per block
    constexpr int PF = 2;                 // V rows per thread loaded ahead of the scores
    static_assert(TPK >= 1 && TPK <= WARP && WARP % TPK == 0 && ATTN_PASS_TILE % (2 * KPP) == 0, "head dim");
    static_assert(NG >= 1 && ATTN_THREADS % TPR == 0, "head dim too large for the block");
    __shared__ __align__(16) float qs[GT][D];
    __shared__ float ps[GT][ATTN_PASS_TILE];
    __shared__ float red[GT][ATTN_THREADS / WARP];
    __shared__ float accs[GT][D];

    const int g = blockIdx.x, t = blockIdx.y;
    const int tid = threadIdx.x, lane = tid % WARP, wid = tid / WARP;
    const int G = a.group;
    const int n_head = a.n_kv * G;
    const int n = a.pos[t] + 1;
    const int64_t slot = a.slot[t];
    // q is loaded (and accs cleared) while the load of pos is in flight.
    for (int i = tid; i < GT * D; i += ATTN_THREADS) {
        const int h = i / D, e = i % D;
        qs[h][e] = h < G ? a.q[int64_t(t) * a.q_t + int64_t(g * G + h) * a.q_h + e] * a.scale : 0.f;
        accs[h][e] = 0.f;
    }
    const int j0 = 0, j1 = n;  // all keys
    __syncthreads();

    const KT* Kb = static_cast<const KT*>(a.K) + (slot * a.n_ctx * a.n_kv + g) * D;
    const KT* Vb = static_cast<const KT*>(a.V) + (slot * a.n_ctx * a.n_kv + g) * D;
    const int64_t row_stride = int64_t(a.n_kv) * D;

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

    for (int jt = j0; jt < j1; jt += ATTN_PASS_TILE) {
        const int nk = min(ATTN_PASS_TILE, j1 - jt);  // keys in this tile
        int4 vpre[PF];
#pragma unroll
        for (int u = 0; u < PF; ++u)
            if (vg + u * NG < nk) vpre[u] = ld16(Vb + int64_t(jt + vg + u * NG) * row_stride + vc * VEC);

        // scores -> ps, two passes of KPP keys per round of loads
        for (int p0 = 0; p0 < nk; p0 += 2 * KPP) {
            int4 kraw[2][KL];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int jl = p0 + u * KPP + kk;
                if (jl < nk) {
                    const KT* row = Kb + int64_t(jt + jl) * row_stride;
#pragma unroll
                    for (int i = 0; i < KL; ++i) kraw[u][i] = ld16(row + (i * TPK + kr) * VEC);
                }
            }
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int jl = p0 + u * KPP + kk;
                float s[GT];
#pragma unroll
                for (int h = 0; h < GT; ++h) s[h] = 0.f;
                if (jl < nk) {
#pragma unroll
                    for (int i = 0; i < KL; ++i) {
                        float kf[VEC];
                        to_floats<KT>(kraw[u][i], kf);
                        const int e0 = (i * TPK + kr) * VEC;
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
        }
        __syncthreads();

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
            ps[h][tid] = s[h];
            ts[h] = warp_sum(s[h]);
            if (lane == 0) red[h][wid] = ts[h];
        }
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
#pragma unroll
        for (int u = 0; u < PF; ++u) {
            const int jj = vg + u * NG;
            if (jj < nk) {
                float vf[VEC];
                to_floats<KT>(vpre[u], vf);
#pragma unroll
                for (int h = 0; h < GT; ++h) {
                    const float p = ps[h][jj];
#pragma unroll
                    for (int v = 0; v < VEC; ++v) acc[h][v] = fmaf(p, vf[v], acc[h][v]);
                }
            }
        }
#pragma unroll 4
        for (int jj = vg + PF * NG; jj < nk; jj += NG) {
            float vf[VEC];
            to_floats<KT>(ld16(Vb + int64_t(jt + jj) * row_stride + vc * VEC), vf);
#pragma unroll
            for (int h = 0; h < GT; ++h) {
                const float p = ps[h][jj];
#pragma unroll
                for (int v = 0; v < VEC; ++v) acc[h][v] = fmaf(p, vf[v], acc[h][v]);
            }
        }
        __syncthreads();  // ps and red are rewritten by the next tile
    }

    // merge the NG row groups, in group order: the result must not depend on
    // which warps arrive first (shared-memory atomics summed in arrival order,
    // so the same step could round differently from run to run)
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
        float lh = 0.f;
#pragma unroll
        for (int hh = 0; hh < GT; ++hh)
            if (hh == h) lh = l[hh];
        a.out[(int64_t(t) * n_head + g * G + h) * D + e] = accs[h][e] / lh;
    }
}

// Folds the chunk partials of one (head, token) left to right (attn_fold):
// grid (n_head, T), D / 4 threads, one float4 column each. Exits at once when one chunk covered the context (its block
// wrote out).
template <int D>
__global__ void __launch_bounds__(D / 4) attn_combine_kernel(const float* __restrict__ work, int ns, int chunk,
                                                             const int32_t* __restrict__ pos, float* __restrict__ out) {
    pdl_enter();
    constexpr int PS = D + ATTN_PART_HDR;
    const int h = blockIdx.x, t = blockIdx.y, n_head = gridDim.x;
    const int col = threadIdx.x * 4;
    const int n = pos[t] + 1;
    const int nu = (n + chunk - 1) / chunk;
    if (nu <= 1) return;
    const float* w = work + (int64_t(t) * n_head + h) * ns * PS;
    float m = -INFINITY, l = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int c = 0; c < nu; ++c) {
        const float* wc = w + int64_t(c) * PS;
        const float4 x = *reinterpret_cast<const float4*>(wc + ATTN_PART_HDR + col);
        const AttnFold f = attn_fold(m, l, wc[0], wc[1]);
        acc.x = attn_fold_acc(acc.x, x.x, f);
        acc.y = attn_fold_acc(acc.y, x.y, f);
        acc.z = attn_fold_acc(acc.z, x.z, f);
        acc.w = attn_fold_acc(acc.w, x.w, f);
    }
    float* o = out + (int64_t(t) * n_head + h) * D + col;
    o[0] = acc.x / l;
    o[1] = acc.y / l;
    o[2] = acc.z / l;
    o[3] = acc.w / l;
}

}  // namespace qinfer::cuda
