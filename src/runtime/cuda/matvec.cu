// Matrix-vector (and matrix x few-vectors) products for decode: one warp per
// output row, lanes striding over 16-byte units of the row, so a warp reads
// its row's bytes once, fully coalesced, for up to 8 tokens at a time. One
// token of quantized weights runs "v3" (below): the same per-row arithmetic
// with persistent warps that keep several rows' loads in flight.
// Also the row gather of the embedding and the f16 dequantization.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/quant_dot.cuh"

namespace qinfer::cuda {

namespace {
std::atomic<int> g_variant_override{0};
}

int matvec_variant() {
    const int forced = g_variant_override.load(std::memory_order_relaxed);
    if (forced) return forced;
    static const int from_env = [] {
        const char* v = std::getenv("QINFER_CUDA_MATVEC");
        if (v && std::strcmp(v, "v1") == 0) return 1;
        if (v && std::strcmp(v, "v3") == 0) return 3;
        return 2;  // v3 measured slower on the H200 (tg128 374 vs 434 tok/s), see bench/results
    }();
    return from_env;
}

void set_matvec_variant(int v) { g_variant_override.store(v >= 1 && v <= 3 ? v : 0, std::memory_order_relaxed); }

bool q4k_pipelined() { return matvec_variant() >= 2; }

namespace {

constexpr int MMV_WARPS = 4;  // rows per block

void mv3_launch(const MatvecJob* jobs, int n_jobs, const ActQ& act, cudaStream_t s);

WArgs wargs(const DeviceWeight& w) {
    WArgs a;
    a.base = w.data;
    a.qh = w.layout.qh_bytes ? w.data + w.layout.off_qh : nullptr;
    a.d = w.layout.d_bytes ? w.data + w.layout.off_d : nullptr;
    a.bpr = w.K / traits(w.type).block_size;
    return a;
}

// Before pdl_wait a product may read only weights: the main section of a
// warp's row (layout.cpp: bytes per block there) is pulled into L2 while the
// kernel before it finishes.
__device__ __forceinline__ void prefetch_row_l2(const WArgs& w, GgmlType type, int64_t row, int lane) {
    int bb = 0;
    switch (type) {
        case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: bb = 16; break;
        case GgmlType::Q8_0: bb = 32; break;
        case GgmlType::Q4_K: bb = 144; break;
        case GgmlType::Q5_K: bb = 176; break;
        case GgmlType::Q6_K: bb = 208; break;
        default: return;
    }
    const int64_t bytes = w.bpr * bb;
    const uint8_t* p = w.base + row * bytes;
    for (int64_t off = int64_t(lane) * 128; off < bytes; off += WARP * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}

template <GgmlType TY, int NT, bool PIPE = false>
__global__ void __launch_bounds__(MMV_WARPS * WARP)
mmv_q_kernel(WArgs w, ActQ A, int64_t N, int T, float* __restrict__ y, int64_t ldy, const float* __restrict__ bias) {
    using Q = QDot<TY>;
    const int64_t row = int64_t(blockIdx.x) * MMV_WARPS + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    pdl_launch_dependents();
    if (row < N) prefetch_row_l2(w, TY, row, lane);
    pdl_wait();
    if (row >= N) return;
    const int tok0 = blockIdx.y * NT;
    int tk[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) tk[t] = min(tok0 + t, T - 1);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;
    if constexpr (PIPE && TY == GgmlType::Q4_K && NT == 1) {
        acc[0] = q4k_row_lane(w, row, A, tk[0], lane);
    } else {
        const int64_t units = w.bpr * Q::UPB;
        const int64_t blk0 = row * w.bpr;
        for (int64_t u = lane; u < units; u += WARP) {
            const int64_t jb = u / Q::UPB;
            Q::template dot<NT>(w, blk0 + jb, jb, int(u % Q::UPB), A, tk, acc);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = warp_sum(acc[t]);
    if (lane == 0) {
        const float b = bias ? bias[row] : 0.f;
#pragma unroll
        for (int t = 0; t < NT; ++t)
            if (tok0 + t < T) y[int64_t(tok0 + t) * ldy + row] = acc[t] + b;
    }
}

// Half / f32 weights times f32 activations: a unit is 16 bytes of the row
// (8 halves or 4 floats) and the matching floats of each token.
template <GgmlType TY> struct HDot;
template <> struct HDot<GgmlType::F16> {
    static constexpr int EPU = 8;
    __device__ static void load(const int4 v, float (&f)[8]) {
        const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 p = __half22float2(h[i]);
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        }
    }
};
template <> struct HDot<GgmlType::BF16> {
    static constexpr int EPU = 8;
    __device__ static void load(const int4 v, float (&f)[8]) {
        const uint32_t w[4] = {uint32_t(v.x), uint32_t(v.y), uint32_t(v.z), uint32_t(v.w)};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
        }
    }
};
template <> struct HDot<GgmlType::F32> {
    static constexpr int EPU = 4;
    __device__ static void load(const int4 v, float (&f)[4]) {
        f[0] = __int_as_float(v.x);
        f[1] = __int_as_float(v.y);
        f[2] = __int_as_float(v.z);
        f[3] = __int_as_float(v.w);
    }
};

template <GgmlType TY, int NT>
__global__ void __launch_bounds__(MMV_WARPS * WARP)
mmv_h_kernel(const uint8_t* __restrict__ W, const float* __restrict__ X, int64_t K, int64_t N, int T,
             float* __restrict__ y, int64_t ldy, const float* __restrict__ bias) {
    using H = HDot<TY>;
    constexpr int EPU = H::EPU;
    const int64_t row = int64_t(blockIdx.x) * MMV_WARPS + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    pdl_enter();
    if (row >= N) return;
    const int tok0 = blockIdx.y * NT;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;
    const uint8_t* wr = W + row * K * (16 / EPU);
    for (int64_t u = lane; u < K / EPU; u += WARP) {
        float wf[EPU];
        H::load(ld16(wr + 16 * u), wf);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int tt = min(tok0 + t, T - 1);
            const float4* xp = reinterpret_cast<const float4*>(X + int64_t(tt) * K + EPU * u);
#pragma unroll
            for (int q = 0; q < EPU / 4; ++q) {
                const float4 xv = __ldg(xp + q);
                acc[t] = fmaf(wf[4 * q], xv.x, acc[t]);
                acc[t] = fmaf(wf[4 * q + 1], xv.y, acc[t]);
                acc[t] = fmaf(wf[4 * q + 2], xv.z, acc[t]);
                acc[t] = fmaf(wf[4 * q + 3], xv.w, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = warp_sum(acc[t]);
    if (lane == 0) {
        const float b = bias ? bias[row] : 0.f;
#pragma unroll
        for (int t = 0; t < NT; ++t)
            if (tok0 + t < T) y[int64_t(tok0 + t) * ldy + row] = acc[t] + b;
    }
}

template <GgmlType TY, int NT>
void launch_q(const DeviceWeight& w, const ActQ& a, int64_t T, float* y, int64_t ldy, const float* bias,
              cudaStream_t s) {
    const dim3 grid(ceil_div(w.N, MMV_WARPS), ceil_div(T, NT));
    if constexpr (TY == GgmlType::Q4_K && NT == 1) {
        if (q4k_pipelined()) {
            launch("mmv_q_kernel", mmv_q_kernel<TY, NT, true>, dim3(grid), dim3(MMV_WARPS * WARP), 0, s, wargs(w), a,
                    w.N, int(T), y, ldy, bias);
            return;
        }
    }
    launch("mmv_q_kernel", mmv_q_kernel<TY, NT>, dim3(grid), dim3(MMV_WARPS * WARP), 0, s, wargs(w), a, w.N, int(T),
            y, ldy, bias);
}

template <GgmlType TY, int NT>
void launch_h(const DeviceWeight& w, const ActQ& a, int64_t T, float* y, int64_t ldy, const float* bias,
              cudaStream_t s) {
    const dim3 grid(ceil_div(w.N, MMV_WARPS), ceil_div(T, NT));
    launch("mmv_h_kernel", mmv_h_kernel<TY, NT>, dim3(grid), dim3(MMV_WARPS * WARP), 0, s, w.data, a.f32, w.K, w.N,
            int(T), y, ldy, bias);
}

template <GgmlType TY, template <GgmlType, int> class L>
void dispatch_nt(const DeviceWeight& w, const ActQ& a, int64_t T, float* y, int64_t ldy, const float* bias,
                 cudaStream_t s) {
    switch (T) {
        case 1: L<TY, 1>::run(w, a, T, y, ldy, bias, s); break;
        case 2: L<TY, 2>::run(w, a, T, y, ldy, bias, s); break;
        case 3: L<TY, 3>::run(w, a, T, y, ldy, bias, s); break;
        case 4: L<TY, 4>::run(w, a, T, y, ldy, bias, s); break;
        default: L<TY, 8>::run(w, a, T, y, ldy, bias, s); break;  // groups of 8 tokens
    }
}
template <GgmlType TY, int NT> struct LQ {
    static void run(const DeviceWeight& w, const ActQ& a, int64_t T, float* y, int64_t ldy, const float* b,
                    cudaStream_t s) { launch_q<TY, NT>(w, a, T, y, ldy, b, s); }
};
template <GgmlType TY, int NT> struct LH {
    static void run(const DeviceWeight& w, const ActQ& a, int64_t T, float* y, int64_t ldy, const float* b,
                    cudaStream_t s) { launch_h<TY, NT>(w, a, T, y, ldy, b, s); }
};

}  // namespace

void matmul_vec(const DeviceWeight& w, const ActQ& a, int64_t T, float* y, int64_t ldy, const float* bias,
                cudaStream_t s) {
    if (T <= 0 || w.N == 0) return;
    if (T == 1 && matvec_multi_supports(w.type) && matvec_variant() >= 3) {
        MatvecJob j;
        j.w = w;
        j.y = y;
        j.ldy = ldy;
        j.bias = bias;
        mv3_launch(&j, 1, a, s);
        QINFER_CUDA_LAUNCHED("matmul_vec");
        return;
    }
    switch (w.type) {
        case GgmlType::Q4_0: dispatch_nt<GgmlType::Q4_0, LQ>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q4_1: dispatch_nt<GgmlType::Q4_1, LQ>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q5_0: dispatch_nt<GgmlType::Q5_0, LQ>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q5_1: dispatch_nt<GgmlType::Q5_1, LQ>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q8_0: dispatch_nt<GgmlType::Q8_0, LQ>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q4_K: dispatch_nt<GgmlType::Q4_K, LQ>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q5_K: dispatch_nt<GgmlType::Q5_K, LQ>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q6_K: dispatch_nt<GgmlType::Q6_K, LQ>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::F16:
        case GgmlType::BF16:
        case GgmlType::F32: {
            const int epu = w.type == GgmlType::F32 ? 4 : 8;
            if (!a.f32 || w.K % epu != 0 || (reinterpret_cast<uintptr_t>(a.f32) & 15) != 0)
                fail(strfmt("CUDA matmul: %s rows of %lld elements (or an unaligned input) are not supported",
                            type_name(w.type), (long long)w.K));
            if (w.type == GgmlType::F16) dispatch_nt<GgmlType::F16, LH>(w, a, T, y, ldy, bias, s);
            else if (w.type == GgmlType::BF16) dispatch_nt<GgmlType::BF16, LH>(w, a, T, y, ldy, bias, s);
            else dispatch_nt<GgmlType::F32, LH>(w, a, T, y, ldy, bias, s);
            break;
        }
        default: fail(strfmt("CUDA matmul: weight type %s not supported", type_name(w.type)));
    }
    QINFER_CUDA_LAUNCHED("matmul_vec");
}

// ---- several products over the same activations in one launch

namespace {

struct MvJobDev {
    WArgs w;
    int64_t N;
    float* y;
    int64_t ldy;
    const float* bias;
    const float* res;
    float* res_out;
    int64_t ld_res, ld_res_out;
    int type;
    int block0;    // first block of this job (one row per warp)
    int64_t row0;  // first row of this job in the rows of all jobs (v3)
};
struct MvBatch {
    MvJobDev job[kMaxMatvecJobs];
    int n;
};

// A job as the kernels see it (block0 / row0 are set by the launcher).
MvJobDev job_dev(const MatvecJob& j) {
    MvJobDev d{};
    d.w = wargs(j.w);
    d.N = j.w.N;
    d.y = j.y;
    d.ldy = j.ldy;
    d.bias = j.bias;
    d.res = j.res;
    d.res_out = j.res_out;
    d.ld_res = j.ld_res;
    d.ld_res_out = j.ld_res_out;
    d.type = int(j.w.type);
    return d;
}

template <GgmlType TY, int NT>
__device__ __forceinline__ void mv_rows(const MvJobDev& j, const ActQ& A, int64_t row, int T, int lane, float (&acc)[NT]) {
    using Q = QDot<TY>;
    int tk[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) tk[t] = min(t, T - 1);
    const int64_t units = j.w.bpr * Q::UPB;
    const int64_t blk0 = row * j.w.bpr;
    for (int64_t u = lane; u < units; u += WARP) {
        const int64_t jb = u / Q::UPB;
        Q::template dot<NT>(j.w, blk0 + jb, jb, int(u % Q::UPB), A, tk, acc);
    }
}

template <int NT, bool PIPE = false>
__global__ void __launch_bounds__(MMV_WARPS * WARP) mmv_multi_kernel(MvBatch b, ActQ A, int T) {
    int ji = 0;
#pragma unroll
    for (int i = 1; i < kMaxMatvecJobs; ++i)
        if (i < b.n && int(blockIdx.x) >= b.job[i].block0) ji = i;
    const MvJobDev& j = b.job[ji];
    const int64_t row = int64_t(blockIdx.x - j.block0) * MMV_WARPS + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    pdl_launch_dependents();
    if (row < j.N) prefetch_row_l2(j.w, GgmlType(j.type), row, lane);
    pdl_wait();
    if (row >= j.N) return;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;
    switch (GgmlType(j.type)) {
        case GgmlType::Q4_0: mv_rows<GgmlType::Q4_0, NT>(j, A, row, T, lane, acc); break;
        case GgmlType::Q4_1: mv_rows<GgmlType::Q4_1, NT>(j, A, row, T, lane, acc); break;
        case GgmlType::Q5_0: mv_rows<GgmlType::Q5_0, NT>(j, A, row, T, lane, acc); break;
        case GgmlType::Q5_1: mv_rows<GgmlType::Q5_1, NT>(j, A, row, T, lane, acc); break;
        case GgmlType::Q8_0: mv_rows<GgmlType::Q8_0, NT>(j, A, row, T, lane, acc); break;
        case GgmlType::Q4_K:
            if constexpr (PIPE && NT == 1) acc[0] = q4k_row_lane(j.w, row, A, 0, lane);
            else mv_rows<GgmlType::Q4_K, NT>(j, A, row, T, lane, acc);
            break;
        case GgmlType::Q5_K: mv_rows<GgmlType::Q5_K, NT>(j, A, row, T, lane, acc); break;
        default: mv_rows<GgmlType::Q6_K, NT>(j, A, row, T, lane, acc); break;
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = warp_sum(acc[t]);
    if (lane == 0) {
        const float bv = j.bias ? j.bias[row] : 0.f;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t >= T) break;
            const float v = acc[t] + bv;
            j.y[int64_t(t) * j.ldy + row] = v;
            if (j.res) j.res_out[int64_t(t) * j.ld_res_out + row] = j.res[int64_t(t) * j.ld_res + row] + v;
        }
    }
}

// ---- v3 (the default for one token): persistent warps, several rows each.
// The one-row-per-warp kernel above reads a K = 2560 Q4_K row (1440 bytes) in
// one short round trip and exits; blocks of such warps churn through several
// waves and leave the memory system idle between them (1.5 TB/s measured on
// an H200). Here the grid is one wave of resident warps. The jobs form runs
// of one weight type, each run gets a share of the warps in proportion to its
// bytes, and warp gw of a run's W takes rows gw, gw + W, ... of the run's rows
// (job after job). It walks them in steps of one unit per lane -- the same
// units, in the same order per lane, as the kernels above -- with the weight
// loads of the next D - 1 steps in flight while one step computes, across row
// and job boundaries. Each row is reduced with warp_sum as before, and bias
// and residual are added the same way, so results are bit-identical to v1 / v2.
// Started with programmatic dependent launch (launch.cuh): a warp's first
// weight loads go out before it waits for the previous kernel's results.

constexpr int MV3_WARPS = 4;

// Steps of weight loads kept in flight per warp: enough bytes to cover the
// memory latency with the warps that fit (see mv3_min_blocks) and no spills.
// MIXED: in the kernel that holds every type's loop.
template <GgmlType TY, bool MIXED> constexpr int mv3_depth() {
    return TY == GgmlType::Q6_K || TY == GgmlType::Q8_0 || (MIXED && TY == GgmlType::Q5_K) ? 2 : 3;
}

__device__ __forceinline__ int mv3_first_row(const MvJobDev& j, int gw, int W) {
    const int r = int((int64_t(gw) - j.row0) % W);
    return r < 0 ? r + W : r;
}

// f(integral_constant<int, 0>), f(..1), ... while they return false (the
// unrolled steps of the pipeline: each names its register buffers statically).
template <class F, int... K>
__device__ __forceinline__ bool mv3_each(F& f, std::integer_sequence<int, K...>) {
    return (f(std::integral_constant<int, K>{}) || ...);
}

// The jobs [j0, j1) (all of type TY, all of the same K) for warp gw.
template <GgmlType TY, int D>
__device__ __forceinline__ void mv3_run(const MvBatch& b, int j0, int j1, const ActQ& A, int gw, int W, int lane) {
    using U = QUnit<TY>;
    const int units = int(b.job[j0].w.bpr) * U::UPB;
    const int S = (units + WARP - 1) / WARP;  // steps per row
    // load cursor (job lj, row lr, step li) and compute cursor (cj, cr, ci);
    // lj == j1: nothing left to load
    int lj = j0, lr = mv3_first_row(b.job[j0], gw, W);
    while (lj < j1 && lr >= b.job[lj].N)
        if (++lj < j1) lr = mv3_first_row(b.job[lj], gw, W);
    if (lj >= j1) return;
    int cj = lj, cr = lr, li = 0, ci = 0;
    WArgs lw = b.job[lj].w;
    auto load = [&](U& x) {
        if (lj >= j1) return;
        const int u = lane + WARP * li;
        if (u < units) x.load(lw, int64_t(lr) * lw.bpr + u / U::UPB, u % U::UPB);
        if (++li < S) return;
        li = 0;
        lr += W;
        while (lr >= b.job[lj].N) {
            if (++lj >= j1) return;
            lr = mv3_first_row(b.job[lj], gw, W);
            lw = b.job[lj].w;
        }
    };
    U buf[D];
    float acc = 0.f;
    float e_bias = 0.f, e_res = 0.f;  // the row's epilogue inputs (lane 0), read when the row starts
    // one step: loads D - 1 steps ahead into buf[(k + D - 1) % D], computes buf[k];
    // true when the warp's last row is done
    auto step = [&](auto kc) {
        constexpr int k = decltype(kc)::value;
        load(buf[(k + D - 1) % D]);
        if (ci == 0 && lane == 0) {  // in flight during the row, not waited for at its end
            const MvJobDev& j = b.job[cj];
            e_bias = j.bias ? j.bias[cr] : 0.f;
            if (j.res) e_res = j.res[cr];
        }
        const int u = lane + WARP * ci;
        if (u < units) buf[k].dot(u / U::UPB, u % U::UPB, A, acc);
        if (++ci < S) return false;
        ci = 0;
        const float v = warp_sum(acc);
        acc = 0.f;
        if (lane == 0) {
            const MvJobDev& j = b.job[cj];
            const float o = v + e_bias;
            j.y[cr] = o;
            if (j.res) j.res_out[cr] = e_res + o;  // res may be res_out: read above, written once here
        }
        cr += W;
        while (cr >= b.job[cj].N) {
            if (++cj >= j1) return true;
            cr = mv3_first_row(b.job[cj], gw, W);
        }
        return false;
    };
#pragma unroll
    for (int k = 0; k < D - 1; ++k) load(buf[k]);
    // Weights only so far; from here on the activations and the outputs (the
    // earlier kernels' results; with PDL those may still be running until now).
    pdl_wait();
    while (!mv3_each(step, std::make_integer_sequence<int, D>{})) {
    }
}

template <GgmlType TY, bool MIXED = false>
__device__ __forceinline__ void mv3_run_t(const MvBatch& b, int j0, int j1, const ActQ& A, int gw, int W, int lane) {
    mv3_run<TY, mv3_depth<TY, MIXED>()>(b, j0, j1, A, gw, W, lane);
}

// Runs of consecutive jobs of one type: run r is jobs [job0[r], job0[r + 1])
// and gets warps [warp0[r], warp0[r + 1]) of the grid, so each warp walks one
// type's loop (a kernel that switched types inside its row loop would carry
// every type's registers at once).
struct Mv3Runs {
    int n;
    int job0[kMaxMatvecJobs + 1];
    int warp0[kMaxMatvecJobs + 1];
};

// Registers are capped by the blocks asked per SM: 64 at 8 blocks of 4 warps.
// Q6_K's unit holds twice Q4_K's bytes and Q5_K's 1.5 times, so they (and the
// kernel that holds every type's loop) run 6 blocks of up to 80 registers:
// their steps are larger, so fewer warps keep as many bytes in flight.
template <int TYI> constexpr int mv3_min_blocks() {
    return TYI == int(GgmlType::Q6_K) || TYI == int(GgmlType::Q5_K) || TYI < 0 ? 6 : 8;
}

// TYI: the type of every job (as int), or -1 for a batch of several types.
// Job row0 counts rows from the first job of the job's run.
template <int TYI>
__global__ void __launch_bounds__(MV3_WARPS * WARP, mv3_min_blocks<TYI>())
    mmv3_kernel(MvBatch b, Mv3Runs runs, ActQ A) {
    pdl_launch_dependents();
    const int lane = threadIdx.x % WARP;
    const int gw = int(blockIdx.x) * MV3_WARPS + int(threadIdx.x) / WARP;
    int w0 = 0, w1 = runs.warp0[1], j0 = 0, j1 = runs.job0[1];  // this warp's run (static indices only)
#pragma unroll
    for (int i = 1; i < kMaxMatvecJobs; ++i)
        if (i < runs.n && gw >= runs.warp0[i]) {
            w0 = runs.warp0[i];
            w1 = runs.warp0[i + 1];
            j0 = runs.job0[i];
            j1 = runs.job0[i + 1];
        }
    const int W = w1 - w0;
    if (gw >= w1) return;  // past the last run's warps
    if constexpr (TYI >= 0) {
        mv3_run_t<GgmlType(TYI)>(b, j0, j1, A, gw - w0, W, lane);
    } else {
        switch (GgmlType(b.job[j0].type)) {
            case GgmlType::Q4_0: mv3_run_t<GgmlType::Q4_0, true>(b, j0, j1, A, gw - w0, W, lane); break;
            case GgmlType::Q4_1: mv3_run_t<GgmlType::Q4_1, true>(b, j0, j1, A, gw - w0, W, lane); break;
            case GgmlType::Q5_0: mv3_run_t<GgmlType::Q5_0, true>(b, j0, j1, A, gw - w0, W, lane); break;
            case GgmlType::Q5_1: mv3_run_t<GgmlType::Q5_1, true>(b, j0, j1, A, gw - w0, W, lane); break;
            case GgmlType::Q8_0: mv3_run_t<GgmlType::Q8_0, true>(b, j0, j1, A, gw - w0, W, lane); break;
            case GgmlType::Q4_K: mv3_run_t<GgmlType::Q4_K, true>(b, j0, j1, A, gw - w0, W, lane); break;
            case GgmlType::Q5_K: mv3_run_t<GgmlType::Q5_K, true>(b, j0, j1, A, gw - w0, W, lane); break;
            default: mv3_run_t<GgmlType::Q6_K, true>(b, j0, j1, A, gw - w0, W, lane); break;
        }
    }
}

// Blocks of mmv3_kernel<TYI> resident on the whole current device (one wave),
// asked once per device.
template <int TYI>
int64_t mv3_wave_blocks() {
    constexpr int kDevs = 16;
    static std::atomic<int> cache[kDevs];
    int dev = 0;
    QINFER_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < kDevs) {
        const int c = cache[dev].load(std::memory_order_relaxed);
        if (c > 0) return c;
    }
    int sms = 0, per_sm = 0;
    QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    QINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mmv3_kernel<TYI>, MV3_WARPS * WARP, 0));
    const int c = std::max(1, sms) * std::max(1, per_sm);
    if (dev >= 0 && dev < kDevs) cache[dev].store(c, std::memory_order_relaxed);
    return c;
}

// One wave of blocks (fewer for small products: a warp per row at most), its
// warps shared among the runs in proportion to their weight bytes.
template <int TYI>
void mv3_start(const MvBatch& b, Mv3Runs& runs, const int64_t* run_rows, const double* run_bytes,
               cudaStream_t s, const ActQ& act) {
    int64_t rows = 0;
    double bytes = 0;
    for (int r = 0; r < runs.n; ++r) {
        rows += run_rows[r];
        bytes += run_bytes[r];
    }
    const int64_t blocks = std::max<int64_t>(
        std::min<int64_t>((rows + MV3_WARPS - 1) / MV3_WARPS, mv3_wave_blocks<TYI>()), runs.n);
    const int64_t warps = blocks * MV3_WARPS;
    // every run at least one warp and at most one per row; the rest by bytes
    int64_t given = 0;
    int64_t w[kMaxMatvecJobs];
    for (int r = 0; r < runs.n; ++r) {
        w[r] = std::clamp<int64_t>(int64_t(double(warps - runs.n) * run_bytes[r] / bytes), 1, run_rows[r]);
        given += w[r];
    }
    for (bool more = true; given < warps && more;) {  // leftovers: to the run with the most bytes per warp
        more = false;
        int best = -1;
        for (int r = 0; r < runs.n; ++r)
            if (w[r] < run_rows[r] && (best < 0 || run_bytes[r] / double(w[r]) > run_bytes[best] / double(w[best])))
                best = r;
        if (best >= 0) {
            const int64_t add = std::min<int64_t>(warps - given, std::max<int64_t>(1, (warps - given) / runs.n));
            const int64_t take = std::min<int64_t>(add, run_rows[best] - w[best]);
            w[best] += take;
            given += take;
            more = true;
        }
    }
    runs.warp0[0] = 0;
    for (int r = 0; r < runs.n; ++r) runs.warp0[r + 1] = runs.warp0[r] + int(w[r]);
    launch("matmul_vec (v3)", mmv3_kernel<TYI>, dim3(unsigned(blocks)), dim3(MV3_WARPS * WARP), 0, s, b, runs, act);
}

void mv3_launch(const MatvecJob* jobs, int n_jobs, const ActQ& act, cudaStream_t s) {
    MvBatch b{};
    b.n = n_jobs;
    Mv3Runs runs{};
    int64_t run_rows[kMaxMatvecJobs] = {};
    double run_bytes[kMaxMatvecJobs] = {};
    int64_t rows = 0;  // of the current run
    for (int i = 0; i < n_jobs; ++i) {
        const MatvecJob& j = jobs[i];
        if (!matvec_multi_supports(j.w.type)) fail(strfmt("CUDA matvec: type %s", type_name(j.w.type)));
        if (j.w.K != jobs[0].w.K || j.w.K % traits(j.w.type).block_size != 0)
            fail(strfmt("CUDA matvec batch: rows of %lld and %lld elements", (long long)jobs[0].w.K,
                        (long long)j.w.K));
        if (i == 0 || j.w.type != jobs[i - 1].w.type) {
            runs.job0[runs.n++] = i;
            rows = 0;
        }
        MvJobDev& d = b.job[i];
        d = job_dev(j);
        d.row0 = rows;
        rows += j.w.N;
        if (rows >= (int64_t(1) << 31)) fail(strfmt("CUDA matvec: %lld rows", (long long)rows));
        run_rows[runs.n - 1] = rows;
        run_bytes[runs.n - 1] += double(j.w.N) * double(row_bytes(j.w.type, j.w.K));
    }
    runs.job0[runs.n] = n_jobs;
    // runs without rows take no warps
    int k = 0;
    for (int r = 0; r < runs.n; ++r)
        if (run_rows[r] > 0) {
            runs.job0[k] = runs.job0[r];
            runs.job0[k + 1] = runs.job0[r + 1];
            run_rows[k] = run_rows[r];
            run_bytes[k] = run_bytes[r];
            ++k;
        }
    runs.n = k;
    if (k == 0) return;
    if (k > 1) return mv3_start<-1>(b, runs, run_rows, run_bytes, s, act);
    switch (GgmlType(b.job[runs.job0[0]].type)) {
        case GgmlType::Q4_0: return mv3_start<int(GgmlType::Q4_0)>(b, runs, run_rows, run_bytes, s, act);
        case GgmlType::Q4_1: return mv3_start<int(GgmlType::Q4_1)>(b, runs, run_rows, run_bytes, s, act);
        case GgmlType::Q5_0: return mv3_start<int(GgmlType::Q5_0)>(b, runs, run_rows, run_bytes, s, act);
        case GgmlType::Q5_1: return mv3_start<int(GgmlType::Q5_1)>(b, runs, run_rows, run_bytes, s, act);
        case GgmlType::Q8_0: return mv3_start<int(GgmlType::Q8_0)>(b, runs, run_rows, run_bytes, s, act);
        case GgmlType::Q4_K: return mv3_start<int(GgmlType::Q4_K)>(b, runs, run_rows, run_bytes, s, act);
        case GgmlType::Q5_K: return mv3_start<int(GgmlType::Q5_K)>(b, runs, run_rows, run_bytes, s, act);
        default: return mv3_start<int(GgmlType::Q6_K)>(b, runs, run_rows, run_bytes, s, act);
    }
}

}  // namespace

bool matvec_multi_supports(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
        case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
            return true;
        default:
            return false;
    }
}

void matmul_vec_multi(const MatvecJob* jobs, int n_jobs, const ActQ& act, int64_t T, cudaStream_t s) {
    if (n_jobs < 1 || n_jobs > kMaxMatvecJobs || T < 1 || T > 8)
        fail(strfmt("CUDA matvec batch: %d jobs, %lld tokens", n_jobs, (long long)T));
    MvBatch b{};
    b.n = n_jobs;
    int blocks = 0;
    for (int i = 0; i < n_jobs; ++i) {
        const MatvecJob& j = jobs[i];
        if (!matvec_multi_supports(j.w.type)) fail(strfmt("CUDA matvec batch: type %s", type_name(j.w.type)));
        MvJobDev& d = b.job[i];
        d = job_dev(j);
        d.block0 = blocks;
        blocks += ceil_div(j.w.N, MMV_WARPS);
    }
    if (T == 1 && matvec_variant() >= 3) {
        mv3_launch(jobs, n_jobs, act, s);
        QINFER_CUDA_LAUNCHED("matmul_vec_multi");
        return;
    }
    const dim3 grid(static_cast<unsigned>(blocks));
    switch (T) {
        case 1:
            if (q4k_pipelined()) launch("mmv_multi_kernel", mmv_multi_kernel<1, true>, dim3(grid),
                    dim3(MMV_WARPS * WARP), 0, s, b, act, int(T));
            else launch("mmv_multi_kernel", mmv_multi_kernel<1>, dim3(grid), dim3(MMV_WARPS * WARP), 0, s, b, act,
                    int(T));
            break;
        case 2: launch("mmv_multi_kernel", mmv_multi_kernel<2>, dim3(grid), dim3(MMV_WARPS * WARP), 0, s, b, act,
                int(T)); break;
        case 3: case 4: launch("mmv_multi_kernel", mmv_multi_kernel<4>, dim3(grid), dim3(MMV_WARPS * WARP), 0, s, b,
                act, int(T)); break;
        default: launch("mmv_multi_kernel", mmv_multi_kernel<8>, dim3(grid), dim3(MMV_WARPS * WARP), 0, s, b, act,
                int(T)); break;
    }
    QINFER_CUDA_LAUNCHED("matmul_vec_multi");
}

// ---- row gather and dequantization

namespace {

template <GgmlType TY>
__global__ void get_rows_kernel(WArgs w, int64_t K, const int32_t* __restrict__ ids, int64_t N,
                                float* __restrict__ out, int64_t ldo) {
    constexpr int BS = TY == GgmlType::F32 || TY == GgmlType::F16 || TY == GgmlType::BF16 ? 1
                       : (TY == GgmlType::Q4_K || TY == GgmlType::Q5_K || TY == GgmlType::Q6_K) ? 256 : 32;
    const int64_t t = blockIdx.y;
    int64_t id = ids[t];
    if (id < 0 || id >= N) id = 0;  // ids are validated on the host; never read out of bounds
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < K; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t blk = id * (K / BS) + i / BS;
        out[t * ldo + i] = dequant_elem<TY>(w, blk, int(i % BS));
    }
}

template <GgmlType TY>
__global__ void dequant_f16_kernel(WArgs w, int64_t n, __half* __restrict__ out) {
    constexpr int BS = TY == GgmlType::F32 || TY == GgmlType::F16 || TY == GgmlType::BF16 ? 1
                       : (TY == GgmlType::Q4_K || TY == GgmlType::Q5_K || TY == GgmlType::Q6_K) ? 256 : 32;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = __float2half_rn(dequant_elem<TY>(w, i / BS, int(i % BS)));
}

template <GgmlType TY>
__global__ void dequant_f32_kernel(WArgs w, int64_t K, int64_t row0, int64_t n, float* __restrict__ out) {
    constexpr int BS = TY == GgmlType::F32 || TY == GgmlType::F16 || TY == GgmlType::BF16 ? 1
                       : (TY == GgmlType::Q4_K || TY == GgmlType::Q5_K || TY == GgmlType::Q6_K) ? 256 : 32;
    const int64_t base = row0 * K;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * K; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = dequant_elem<TY>(w, (base + i) / BS, int((base + i) % BS));
}

template <template <GgmlType> class F, class... Args>
void by_type(GgmlType t, Args&&... args) {
    switch (t) {
        case GgmlType::F32: F<GgmlType::F32>::run(args...); break;
        case GgmlType::F16: F<GgmlType::F16>::run(args...); break;
        case GgmlType::BF16: F<GgmlType::BF16>::run(args...); break;
        case GgmlType::Q4_0: F<GgmlType::Q4_0>::run(args...); break;
        case GgmlType::Q4_1: F<GgmlType::Q4_1>::run(args...); break;
        case GgmlType::Q5_0: F<GgmlType::Q5_0>::run(args...); break;
        case GgmlType::Q5_1: F<GgmlType::Q5_1>::run(args...); break;
        case GgmlType::Q8_0: F<GgmlType::Q8_0>::run(args...); break;
        case GgmlType::Q4_K: F<GgmlType::Q4_K>::run(args...); break;
        case GgmlType::Q5_K: F<GgmlType::Q5_K>::run(args...); break;
        case GgmlType::Q6_K: F<GgmlType::Q6_K>::run(args...); break;
        default: fail(strfmt("CUDA: weight type %s not supported", type_name(t)));
    }
}

template <GgmlType TY> struct GetRows {
    static void run(const DeviceWeight& w, const int32_t* ids, int64_t T, float* out, int64_t ldo, cudaStream_t s) {
        const dim3 grid(unsigned(ceil_div(w.K, 256) < 64 ? ceil_div(w.K, 256) : 64), unsigned(T));
        get_rows_kernel<TY><<<grid, 256, 0, s>>>(wargs(w), w.K, ids, w.N, out, ldo);
    }
};
template <GgmlType TY> struct DequantF16 {
    static void run(const DeviceWeight& w, __half* out, cudaStream_t s) {
        const int64_t n = w.K * w.N;
        const int blocks = int(ceil_div(n, 256) < 65536 ? ceil_div(n, 256) : 65536);
        dequant_f16_kernel<TY><<<blocks, 256, 0, s>>>(wargs(w), n, out);
    }
};

template <GgmlType TY> struct DequantF32 {
    static void run(const DeviceWeight& w, int64_t row0, int64_t n, float* out, cudaStream_t s) {
        const int64_t total = n * w.K;
        const int blocks = int(ceil_div(total, 256) < 65536 ? ceil_div(total, 256) : 65536);
        dequant_f32_kernel<TY><<<blocks, 256, 0, s>>>(wargs(w), w.K, row0, n, out);
    }
};

}  // namespace

void dequant_f32(const DeviceWeight& w, int64_t row0, int64_t n, float* out, cudaStream_t s) {
    if (n <= 0) return;
    by_type<DequantF32>(w.type, w, row0, n, out, s);
    QINFER_CUDA_LAUNCHED("dequant_f32");
}

void get_rows(const DeviceWeight& w, const int32_t* ids, int64_t T, float* out, int64_t ldo, cudaStream_t s) {
    if (T <= 0) return;
    by_type<GetRows>(w.type, w, ids, T, out, ldo, s);
    QINFER_CUDA_LAUNCHED("get_rows");
}

void dequant_f16(const DeviceWeight& w, void* out, cudaStream_t s) {
    by_type<DequantF16>(w.type, w, static_cast<__half*>(out), s);
    QINFER_CUDA_LAUNCHED("dequant_f16");
}

}  // namespace qinfer::cuda
