// Attention kernels (see attention.cu for the plan).
#pragma once
#include "runtime/cuda/cuda_common.cuh"

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
    float* work;             // split partials [T][n_head][n_split][d + 2]: m, l, acc
    int n_split;
};

constexpr int ATTN_THREADS = 128;
constexpr int ATTN_TILE = 128;  // keys per tile: one per thread in the score phase

template <typename KT> __device__ __forceinline__ void load_vec(const KT* p, float (&f)[16 / sizeof(KT)]);
template <> __device__ __forceinline__ void load_vec<__half>(const __half* p, float (&f)[8]) {
    const int4 v = ld16(p);
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 x = __half22float2(h[i]);
        f[2 * i] = x.x;
        f[2 * i + 1] = x.y;
    }
}
template <> __device__ __forceinline__ void load_vec<float>(const float* p, float (&f)[4]) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
}

// One block per (kv head, token, split). GT >= group (compile-time bound of the
// per-head register arrays); D the head dim.
template <int D, int GT, typename KT>
__global__ void __launch_bounds__(ATTN_THREADS) attn_split_kernel(AttnArgs a) {
    constexpr int VEC = 16 / sizeof(KT);  // elements per 16-byte load
    constexpr int TPR = D / VEC;          // threads per V row in the PV phase
    constexpr int NG = ATTN_THREADS / TPR;
    static_assert(NG >= 1 && ATTN_THREADS % TPR == 0, "head dim too large for the block");
    __shared__ __align__(16) float qs[GT][D];
    __shared__ float ps[GT][ATTN_TILE];
    __shared__ float red[GT][ATTN_THREADS / WARP];
    __shared__ float accs[GT][D];

    const int g = blockIdx.x, t = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % WARP, wid = tid / WARP;
    const int G = a.group;
    const int n = a.pos[t] + 1;
    const int64_t slot = a.slot[t];
    const int ns = a.n_split;
    int chunk = (n + ns - 1) / ns;
    chunk = (chunk + ATTN_TILE - 1) / ATTN_TILE * ATTN_TILE;
    const int j0 = split * chunk;
    const int j1 = min(n, j0 + chunk);
    const int n_head = a.n_kv * G;

    if (j0 >= j1) {  // empty split (only with ns > 1): neutral partial state
        for (int i = tid; i < G * (D + 2); i += ATTN_THREADS) {
            const int h = i / (D + 2), e = i % (D + 2);
            float* w = a.work + ((int64_t(t) * n_head + g * G + h) * ns + split) * (D + 2);
            w[e] = e == 0 ? -INFINITY : 0.f;
        }
        return;
    }

    for (int i = tid; i < GT * D; i += ATTN_THREADS) {
        const int h = i / D, e = i % D;
        qs[h][e] = h < G ? a.q[int64_t(t) * a.q_t + int64_t(g * G + h) * a.q_h + e] * a.scale : 0.f;
        accs[h][e] = 0.f;
    }
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
    const int vg = tid / TPR, vc = tid % TPR;

    for (int jt = j0; jt < j1; jt += ATTN_TILE) {
        // scores: thread tid takes key jt + tid
        const int j = jt + tid;
        float s[GT];
#pragma unroll
        for (int h = 0; h < GT; ++h) s[h] = 0.f;
        if (j < j1) {
            const KT* kr = Kb + int64_t(j) * row_stride;
#pragma unroll 4
            for (int c = 0; c < D / VEC; ++c) {
                float kf[VEC];
                load_vec<KT>(kr + c * VEC, kf);
#pragma unroll
                for (int h = 0; h < GT; ++h) {
                    if (h < G) {
#pragma unroll
                        for (int v = 0; v < VEC; ++v) s[h] = fmaf(qs[h][c * VEC + v], kf[v], s[h]);
                    }
                }
            }
        }
        // online softmax over the tile, per head
        float mt[GT];
#pragma unroll
        for (int h = 0; h < GT; ++h) {
            mt[h] = warp_max(j < j1 ? s[h] : -INFINITY);
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
            ps[h][tid] = j < j1 ? expf(s[h] - mn) : 0.f;
        }
        __syncthreads();
        float ts[GT];
#pragma unroll
        for (int h = 0; h < GT; ++h) {
            ts[h] = warp_sum(ps[h][tid]);
        }
        __syncthreads();  // red reused
#pragma unroll
        for (int h = 0; h < GT; ++h)
            if (lane == 0) red[h][wid] = ts[h];
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
        // P V: thread group vg takes keys vg, vg + NG, ... of the tile, columns vc*VEC..
        const int nk = min(ATTN_TILE, j1 - jt);
        for (int jj = vg; jj < nk; jj += NG) {
            float vf[VEC];
            load_vec<KT>(Vb + int64_t(jt + jj) * row_stride + vc * VEC, vf);
#pragma unroll
            for (int h = 0; h < GT; ++h) {
                const float p = ps[h][jj];
#pragma unroll
                for (int v = 0; v < VEC; ++v) acc[h][v] = fmaf(p, vf[v], acc[h][v]);
            }
        }
        __syncthreads();  // ps and red are rewritten by the next tile
    }

    // merge the NG key groups
#pragma unroll
    for (int h = 0; h < GT; ++h)
        if (h < G) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) atomicAdd(&accs[h][vc * VEC + v], acc[h][v]);
        }
    __syncthreads();
    for (int i = tid; i < G * D; i += ATTN_THREADS) {
        const int h = i / D, e = i % D;
        float lh = 0.f, mh = 0.f;
#pragma unroll
        for (int hh = 0; hh < GT; ++hh)
            if (hh == h) { lh = l[hh]; mh = m[hh]; }
        if (ns == 1) {
            a.out[(int64_t(t) * n_head + g * G + h) * D + e] = accs[h][e] / lh;
        } else {
            float* w = a.work + ((int64_t(t) * n_head + g * G + h) * ns + split) * (D + 2);
            if (e == 0) {
                w[0] = mh;
                w[1] = lh;
            }
            w[2 + e] = accs[h][e];
        }
    }
}

// Merges the split partials of one (head, token): grid (n_head, T).
__global__ void attn_combine_kernel(const float* __restrict__ work, int D, int ns, float* __restrict__ out) {
    const int h = blockIdx.x, t = blockIdx.y, n_head = gridDim.x;
    const float* w = work + (int64_t(t) * n_head + h) * ns * (D + 2);
    float mt = -INFINITY;
    for (int s = 0; s < ns; ++s) mt = fmaxf(mt, w[s * (D + 2)]);
    float lt = 0.f;
    for (int s = 0; s < ns; ++s) lt += w[s * (D + 2) + 1] * expf(w[s * (D + 2)] - mt);
    for (int e = threadIdx.x; e < D; e += blockDim.x) {
        float acc = 0.f;
        for (int s = 0; s < ns; ++s) acc += w[s * (D + 2) + 2 + e] * expf(w[s * (D + 2)] - mt);
        out[(int64_t(t) * n_head + h) * D + e] = acc / lt;
    }
}

}  // namespace qinfer::cuda
