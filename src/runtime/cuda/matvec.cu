// Matrix-vector (and matrix x few-vectors) products for decode: one warp per
// output row, lanes striding over 16-byte units of the row, so a warp reads
// its row's bytes once, fully coalesced, for up to 8 tokens at a time. One
// token of K-quant weights runs "v3" (below): the same per-row arithmetic
// with several rows per warp that share their activation loads.
// Also the row gather of the embedding and the f16 dequantization.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "common/env.h"
#include "common/error.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/act_quant.cuh"
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
        if (!v || !*v || std::strcmp(v, "v3") == 0) return 3;
        if (std::strcmp(v, "v1") == 0) return 1;
        if (std::strcmp(v, "v2") == 0) return 2;
        fail(strfmt("QINFER_CUDA_MATVEC=%s: expected v1, v2 or v3", v));
    }();
    return from_env;
}

void set_matvec_variant(int v) { g_variant_override.store(v >= 1 && v <= 3 ? v : 0, std::memory_order_relaxed); }

bool q4k_pipelined() { return matvec_variant() >= 2; }

namespace {

constexpr int MMV_WARPS = 4;  // rows per block

bool rows_kernel_supports(GgmlType t);
void rows_launch(const MatvecJob* jobs, int n_jobs, const ActQ& act, cudaStream_t s);

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
    pdl_trigger_at_top();
    if (row < N) prefetch_row_l2(w, TY, row, lane);
    pdl_wait_inputs();
    if (row >= N) return;
    const int tok0 = blockIdx.y * NT;
    int tk[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) tk[t] = min(tok0 + t, T - 1);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;
    if constexpr (PIPE && TY == GgmlType::Q4_K && NT == 1) {
        acc[0] = q4k_row_lane(w, row, A, lane);  // T = 1: token 0
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
    if (T == 1 && rows_kernel_supports(w.type) && matvec_variant() >= 3) {
        MatvecJob j;
        j.w = w;
        j.y = y;
        j.ldy = ldy;
        j.bias = bias;
        rows_launch(&j, 1, a, s);
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
    int block0;  // first block of this job
    int rpw;     // rows per warp (v3)
    ConvAfter conv;
};
struct MvBatch {
    MvJobDev job[kMaxMatvecJobs];
    int n;
};

// A job as the kernels see it (block0 / rpw are set by the launcher).
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
    d.conv = j.conv;
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
    pdl_trigger_at_top();
    if (row < j.N) prefetch_row_l2(j.w, GgmlType(j.type), row, lane);
    pdl_wait_inputs();
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
            if constexpr (PIPE && NT == 1) acc[0] = q4k_row_lane(j.w, row, A, lane);
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

// ---- v3 (one token, K-quants): R rows per warp.
// The one-row-per-warp kernel is bound by its shape, not by bytes: a K = 2560
// row is 1,440 bytes of Q4_K, three steps of a warp, and every step reads
// twice as many activation bytes (and a 16-byte block header) as weight bytes,
// so a 13 MB product took as long as the 25 MB Q8_0 one (~10 us, 1.2 TB/s on
// an H200). Here a warp walks R rows side by side: each step loads the
// activations once and the R rows' weight bytes, so loads per weight byte drop
// by ~2x at R = 4 and each lane keeps 2R weight loads in flight. The weight
// loads of the first step are issued before the kernel waits on the previous
// one (programmatic dependent launch), the activations only after. Per row the
// units, their order per lane and the reduction are those of v1 / v2, so
// results are bit-identical. Epilogue per row: bias, residual, and the decode
// conv (ConvAfter).

// Rows per warp for Q4_K (Q5_K / Q6_K units hold 1.5 / 2 times the registers:
// half as many). More rows per warp means fewer warps: a launch takes the most
// rows per warp (4 at most) that still leave ~32 warps per SM, fewer for long
// rows (a warp of K = 9216 has 3.6 times the steps of one of K = 2560): 4 for
// the 2 x 9216-row gate+up pair, 2 for the 12,352 DeltaNet input rows, 1 for
// 2560 rows of K = 4096 (bench/results/cuda-h200.md: in back-to-back timing ~16
// warps per SM was as good, in the whole decode step more warps won).
// QINFER_CUDA_MV_ROWS=1/2/4/8 fixes it (A/B).
std::atomic<int> g_rows_override{0};
int forced_rows() {
    if (const int forced = g_rows_override.load(std::memory_order_relaxed)) return forced;
    static const int from_env = env_int_of("QINFER_CUDA_MV_ROWS", {1, 2, 4, 8}, 0);
    return from_env;
}
int rows_for(GgmlType t, int R) { return t == GgmlType::Q4_K ? R : std::max(1, R / 2); }

int sm_count() {
    static const int n = [] {
        int dev = 0, sms = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            return 132;
        return std::max(1, sms);
    }();
    return n;
}

int64_t rows_warps(const MatvecJob* jobs, int n_jobs, int R) {
    int64_t w = 0;
    for (int i = 0; i < n_jobs; ++i) w += ceil_div(jobs[i].w.N, int64_t(rows_for(jobs[i].w.type, R)));
    return w;
}

// Rows of this many elements or more run one per warp with several steps in
// flight (rows_lane's S, steps_in_flight): an H200's Q6_K ffn_down (9216 x
// 2560) took 11.1 us at two rows per warp (1,280 warps, two units in flight per
// lane), 7.6 us at one row per warp and two steps (2,560 warps, the same per
// lane). Back to back, shorter rows lost with two steps (K = 4096: 5.0 vs 4.5
// us); in the model, four won (steps_in_flight).
constexpr int64_t kLongRow = 8192;

// Two kinds of launch where the rule below lost (bench/results, 2026-12-07):
// launches of 3+ jobs (attention q / k / v; the DeltaNet inputs, where the rule
// also gives 2) take two rows per warp (QINFER_CUDA_MV_ROWS_MULTI, Qwen3-4B
// +0.9% on an H100); products of 128 MB or more (the LM head) take what timing
// them on the device chose (large_rows), or QINFER_CUDA_MV_ROWS_LARGE. Either
// set to 0: the rule alone.
constexpr double kLargeProduct = 128e6;
constexpr int kTuneRows = -1;
double weight_bytes(const MatvecJob* jobs, int n_jobs) {
    double b = 0;
    for (int i = 0; i < n_jobs; ++i) b += double(jobs[i].w.N) * double(row_bytes(jobs[i].w.type, jobs[i].w.K));
    return b;
}

int large_rows(const MatvecJob* jobs, int n_jobs, const ActQ& act, cudaStream_t s);

int choose_rows(const MatvecJob* jobs, int n_jobs, const ActQ& act, cudaStream_t s) {
    if (const int f = forced_rows()) return f;
    if (jobs[0].w.K >= kLongRow) return 1;
    static const int large = env_int_of("QINFER_CUDA_MV_ROWS_LARGE", {0, 1, 2, 4}, kTuneRows);
    static const int multi = env_int_of("QINFER_CUDA_MV_ROWS_MULTI", {0, 1, 2, 4}, 2);
    if (large && weight_bytes(jobs, n_jobs) >= kLargeProduct)
        return large == kTuneRows ? large_rows(jobs, n_jobs, act, s) : large;
    if (multi && n_jobs >= 3) return multi;
    const double K = double(jobs[0].w.K);
    const double target = 32.0 * sm_count() * std::min(1.0, 2560.0 / K);
    for (int R : {4, 2})
        if (double(rows_warps(jobs, n_jobs, R)) >= target) return R;
    return 1;
}

bool rows_kernel_supports(GgmlType t) {
    return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K;
}

// acc[0, RR) += rows [row0, row0 + RR) of w times the activations, this lane's
// units; rows past N repeat row N - 1 (loaded, never written). S steps' loads
// (units u, u + 32, ...) are issued together and their dot products added in
// unit order, so the sums are those of S = 1 bit for bit: a warp of one long
// row keeps S times the bytes in flight. Above two steps (kPreWaitSteps) the
// activations of a step are loaded just before its dot products rather than
// all S at once: their registers would not fit beside the weights.
template <GgmlType TY, int RR, int R, int S = 1, class MA = FromGlobal>
__device__ __forceinline__ void rows_lane(const WArgs& w, int64_t row0, int64_t N, const ActQ& A, int lane,
                                          float (&acc)[R]) {
    using U = RowUnit<TY>;
    const int units = int(w.bpr) * U::UPB;
    int64_t blk0[RR];
#pragma unroll
    for (int r = 0; r < RR; ++r) blk0[r] = (row0 + r < N ? row0 + r : N - 1) * w.bpr;
    constexpr bool kLazyAct = S > 2;  // activations loaded step by step
    typename U::W cw[S][RR];
    typename U::A ca[kLazyAct ? 1 : S];
    int u = lane;
#pragma unroll
    for (int s = 0; s < S; ++s)
        if (u + WARP * s < units) {
#pragma unroll
            for (int r = 0; r < RR; ++r) cw[s][r] = U::load_w(w, blk0[r], u + WARP * s);
        }
    pdl_wait_inputs();  // weights only so far; the activations are the previous kernel's output
    if (u >= units) return;
    if constexpr (!kLazyAct) {
#pragma unroll
        for (int s = 0; s < S; ++s)
            if (u + WARP * s < units) ca[s] = U::template load_a<MA>(A, u + WARP * s);
    }
    for (;;) {
#pragma unroll
        for (int s = 0; s < S; ++s) {
            if (u + WARP * s >= units) return;
            if constexpr (kLazyAct) ca[0] = U::template load_a<MA>(A, u + WARP * s);
            const typename U::A& a = ca[kLazyAct ? 0 : s];
#pragma unroll
            for (int r = 0; r < RR; ++r) acc[r] += U::dot(cw[s][r], a, u + WARP * s);
        }
        u += WARP * S;
        if (u >= units) return;
#pragma unroll
        for (int s = 0; s < S; ++s)
            if (u + WARP * s < units) {
                if constexpr (!kLazyAct) ca[s] = U::template load_a<MA>(A, u + WARP * s);
#pragma unroll
                for (int r = 0; r < RR; ++r) cw[s][r] = U::load_w(w, blk0[r], u + WARP * s);
            }
    }
}

// ConvAfter for channel c of C, whose new input is x: as conv1d_silu_kernel
// (deltanet.cu) computes one token of one segment -- the same sum in the same
// order without contraction, and the state shifted by one. conv_load reads the
// channel's taps and state, conv_finish computes and writes, so an epilogue of
// several rows issues every row's loads before its first store.
constexpr int kConvMaxK = 6;
struct ConvWindow {
    float win[kConvMaxK - 1], w[kConvMaxK];
};
__device__ __forceinline__ void conv_load(const ConvAfter& cv, int64_t c, int64_t C, ConvWindow& cw) {
    const int K = cv.K;
    const float* st = cv.state + int64_t(cv.seg->slot) * (K - 1) * C + c;  // state row r at st[r * C]
#pragma unroll
    for (int r = 0; r < kConvMaxK - 1; ++r)
        if (r < K - 1) cw.win[r] = st[int64_t(r) * C];
#pragma unroll
    for (int r = 0; r < kConvMaxK; ++r)
        if (r < K) cw.w[r] = __ldg(cv.w + c * K + r);
}
__device__ __forceinline__ void conv_finish(const ConvAfter& cv, int64_t c, int64_t C, float x, const ConvWindow& cw) {
    const int K = cv.K;
    float* st = cv.state + int64_t(cv.seg->slot) * (K - 1) * C + c;
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < kConvMaxK; ++r)
        if (r < K) acc = __fadd_rn(acc, __fmul_rn(cw.w[r], r == K - 1 ? x : cw.win[r]));
    cv.out[c] = silu(acc);
#pragma unroll
    for (int r = 0; r < kConvMaxK - 1; ++r)
        if (r < K - 1) st[int64_t(r) * C] = r + 1 < K - 1 ? cw.win[r + 1] : x;
}

// acc = rows [row0, row0 + rows_for(type, R)) of a K-quant weight times the
// activations (this lane's share).
template <int R, int S = 1, class MA = FromGlobal>
__device__ __forceinline__ void rows_of_type(GgmlType type, const WArgs& w, int64_t row0, int64_t N, const ActQ& A,
                                             int lane, float (&acc)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    if (type == GgmlType::Q4_K) rows_lane<GgmlType::Q4_K, R, R, S, MA>(w, row0, N, A, lane, acc);
    else if (type == GgmlType::Q5_K) rows_lane<GgmlType::Q5_K, (R > 1 ? R / 2 : 1), R, S, MA>(w, row0, N, A, lane, acc);
    else rows_lane<GgmlType::Q6_K, (R > 1 ? R / 2 : 1), R, S, MA>(w, row0, N, A, lane, acc);
}

// The epilogue of rows [row0, row0 + rpw): warp sums, bias, residual, conv.
// Lane 0 issues every row's loads (bias, residual, conv taps and state) before
// its first store: the compiler may not move a load above a store that could
// alias it, and one memory round trip per row sat at the end of every warp.
template <int R>
__device__ __forceinline__ void rows_store(const MvJobDev& j, int64_t row0, int rpw, float (&acc)[R], int lane) {
    float v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = warp_sum(acc[r]);
    if (lane != 0) return;
    const int n = int(min(int64_t(rpw), j.N - row0));
    float add[R], res[R];
    ConvWindow cw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r >= n) break;
        add[r] = j.bias ? j.bias[row0 + r] : 0.f;
        if (j.res) res[r] = j.res[row0 + r];
        if (j.conv.w) conv_load(j.conv, row0 + r, j.N, cw[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r >= n) break;
        const int64_t row = row0 + r;
        const float o = v[r] + add[r];
        j.y[row] = o;
        if (j.res) j.res_out[row] = res[r] + o;
        if (j.conv.w) conv_finish(j.conv, row, j.N, o, cw[r]);
    }
}

// Blocks per SM asked of the register allocator: Q4_K at R = 4 takes ~120
// registers unbounded (4 blocks, 16 warps per SM), which would leave a gate+up
// pair of 2 x 9216 rows in more than two waves.
// Two steps in flight take more registers (Q6_K ~96: 5 blocks, 20 warps per SM,
// one wave for a 2560-row product).
constexpr int rows_min_blocks(int R, int S) { return S > 1 ? 5 : R >= 8 ? 4 : R == 4 ? 6 : 8; }

// TYI: the type of every job (as int), or -1 for a batch of several K-quant types.
template <int R, int TYI, int S = 1>
__global__ void __launch_bounds__(MMV_WARPS * WARP, rows_min_blocks(R, S)) mmv_rows_kernel(MvBatch b, ActQ A) {
    int ji = 0;
#pragma unroll
    for (int i = 1; i < kMaxMatvecJobs; ++i)
        if (i < b.n && int(blockIdx.x) >= b.job[i].block0) ji = i;
    const MvJobDev& j = b.job[ji];
    const GgmlType type = TYI >= 0 ? GgmlType(TYI) : GgmlType(j.type);
    const int rpw = j.rpw;
    const int64_t row0 = (int64_t(blockIdx.x - j.block0) * MMV_WARPS + threadIdx.x / WARP) * rpw;
    const int lane = threadIdx.x % WARP;
    pdl_trigger_at_top();
    if (row0 < j.N) {
        float acc[R];
        rows_of_type<R, S>(type, j.w, row0, j.N, A, lane, acc);
        rows_store<R>(j, row0, rpw, acc, lane);
    }
}

template <int R, int S = 1>
void rows_start(const MvBatch& b, int blocks, bool mixed, cudaStream_t s, const ActQ& act) {
    const dim3 grid{unsigned(blocks)}, block{MMV_WARPS * WARP};
    const char* what = "matmul_vec (rows)";
    if (mixed) return launch(what, mmv_rows_kernel<R, -1, S>, grid, block, 0, s, b, act);
    switch (GgmlType(b.job[0].type)) {
        case GgmlType::Q4_K: return launch(what, mmv_rows_kernel<R, int(GgmlType::Q4_K), S>, grid, block, 0, s, b, act);
        case GgmlType::Q5_K: return launch(what, mmv_rows_kernel<R, int(GgmlType::Q5_K), S>, grid, block, 0, s, b, act);
        default: return launch(what, mmv_rows_kernel<R, int(GgmlType::Q6_K), S>, grid, block, 0, s, b, act);
    }
}

// Steps in flight per lane (S > 1 only at one row per warp): four
// (kPreWaitSteps), so that a K = 4096 Q4_K row (ssm_out, attn_output) is
// issued whole before the wait, while the kernel before it runs, and ffn_down
// 128 of its 144 units. Measured in the model (H100, 2026-12-07, bench/results):
// Qwen3.5-4B tg128 +1.6% over the earlier rule (two steps for rows of kLongRow
// elements or more, else one), Qwen3-4B the same; its ssm_out follows the delta rule,
// the longest window before a wait. QINFER_CUDA_MV_STEPS=1 / 2 / 4 fixes it
// (A/B runs); set_matvec_steps(s) overrides the environment (tests).
constexpr int kPreWaitSteps = 4;
std::atomic<int> g_steps_override{0};
int steps_in_flight(int R) {
    static const int from_env = env_int_of("QINFER_CUDA_MV_STEPS", {1, 2, kPreWaitSteps}, 0);
    const int o = g_steps_override.load(std::memory_order_relaxed);
    const int forced = o ? o : from_env;
    if (R != 1) return 1;
    return forced ? forced : kPreWaitSteps;
}

void rows_launch_with(const MatvecJob* jobs, int n_jobs, const ActQ& act, cudaStream_t s, int R);

// Jobs of K-quant types only (rows_kernel_supports).
void rows_launch(const MatvecJob* jobs, int n_jobs, const ActQ& act, cudaStream_t s) {
    rows_launch_with(jobs, n_jobs, act, s, choose_rows(jobs, n_jobs, act, s));
}

// Rows per warp for a product of kLargeProduct bytes or more: one (four steps
// of loads in flight per lane) or four, whichever streams the weight faster on
// this device. They differ by GPU: the Q6_K LM head of Qwen3.5-4B (521 MB) took
// 173.6 us at one and ~200 at four on an H100, 174.8 and 155.9 on an H200
// (bench/results, 2026-12-07). The first product of a shape on a device times
// both (a launch of each to warm up, then three of each, alternating; the
// fastest launch counts) and the choice stays for the process. Both give the
// same bits, so only the speed depends on it. Not timed -- one row per warp --
// inside graph capture, under QINFER_CUDA_PROFILE (its stream is held), or when
// a second run would change state: a residual written in place, a conv state.
int large_rows(const MatvecJob* jobs, int n_jobs, const ActQ& act, cudaStream_t s) {
    int dev = 0;
    QINFER_CUDA_CHECK(cudaGetDevice(&dev));
    using Key = std::tuple<int, int, int64_t, int64_t, int>;  // device, type, K, rows, jobs
    const Key key{dev, int(jobs[0].w.type), jobs[0].w.K, rows_warps(jobs, n_jobs, 1), n_jobs};
    static std::mutex mu;
    static std::map<Key, int> chosen;
    std::lock_guard<std::mutex> lock(mu);
    // A choice made by an eager step also holds when a later step is recorded.
    if (const auto it = chosen.find(key); it != chosen.end()) return it->second;
    constexpr int kFallback = 1;
    static const bool profiling = env_is("QINFER_CUDA_PROFILE", "1");
    if (profiling) return kFallback;
    for (int i = 0; i < n_jobs; ++i)
        if (jobs[i].res || jobs[i].conv.w) return kFallback;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
        cudaGetLastError();
        return kFallback;
    }
    constexpr int kCandidates[2] = {1, 4};
    cudaEvent_t ev[2];
    QINFER_CUDA_CHECK(cudaEventCreate(&ev[0]));
    QINFER_CUDA_CHECK(cudaEventCreate(&ev[1]));
    float best[2] = {1e30f, 1e30f};
    for (int rep = 0; rep < 4; ++rep)
        for (int c = 0; c < 2; ++c) {
            QINFER_CUDA_CHECK(cudaEventRecord(ev[0], s));
            rows_launch_with(jobs, n_jobs, act, s, kCandidates[c]);
            QINFER_CUDA_CHECK(cudaEventRecord(ev[1], s));
            QINFER_CUDA_CHECK(cudaEventSynchronize(ev[1]));
            float ms = 0.f;
            QINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
            if (rep > 0) best[c] = std::min(best[c], ms);  // rep 0 warms up
        }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    const int R = best[1] < best[0] ? kCandidates[1] : kCandidates[0];
    if (std::getenv("QINFER_CUDA_VERBOSE"))
        std::fprintf(stderr, "qinfer cuda: %.0f MB product: %d row(s) per warp (%.1f us at 1, %.1f at 4)\n",
                     weight_bytes(jobs, n_jobs) / 1e6, R, 1e3 * best[0], 1e3 * best[1]);
    chosen.emplace(key, R);
    return R;
}

void rows_launch_with(const MatvecJob* jobs, int n_jobs, const ActQ& act, cudaStream_t s, int R) {
    MvBatch b{};
    b.n = n_jobs;
    int64_t blocks = 0;
    bool mixed = false;
    for (int i = 0; i < n_jobs; ++i) {
        MvJobDev& d = b.job[i];
        d = job_dev(jobs[i]);
        d.rpw = rows_for(jobs[i].w.type, R);
        d.block0 = int(blocks);
        blocks += ceil_div(jobs[i].w.N, int64_t(MMV_WARPS) * d.rpw);
        mixed |= jobs[i].w.type != jobs[0].w.type;
    }
    if (blocks >= (int64_t(1) << 31)) fail(strfmt("CUDA matvec: %lld blocks", (long long)blocks));
    if (blocks == 0) return;
    if (R == 1) {
        const int S = steps_in_flight(R);
        if (S == kPreWaitSteps) rows_start<1, kPreWaitSteps>(b, int(blocks), mixed, s, act);
        else if (S == 2) rows_start<1, 2>(b, int(blocks), mixed, s, act);
        else rows_start<1>(b, int(blocks), mixed, s, act);
    } else if (R == 2) rows_start<2>(b, int(blocks), mixed, s, act);
    else if (R == 8) rows_start<8>(b, int(blocks), mixed, s, act);
    else rows_start<4>(b, int(blocks), mixed, s, act);
}

}  // namespace

void set_matvec_rows(int r) {
    g_rows_override.store(r == 1 || r == 2 || r == 4 || r == 8 ? r : 0, std::memory_order_relaxed);
}

void set_matvec_steps(int s) {
    g_steps_override.store(s == 1 || s == 2 || s == kPreWaitSteps ? s : 0, std::memory_order_relaxed);
}

// ---- the decode FFN block in one launch (FfnJob in kernels.h)

namespace {

struct FfnDev {
    const float* x;  // norm input (the residual stream)
    const float* norm_w;
    float eps;
    float* h;  // norm output (block 0 writes it)
    int E, F;
    ActOutPtrs act_h;  // its quantization (block 0 writes it; each block keeps its own copy)
    MvJobDev gate, up, down;  // rpw set by the launcher
    const float* g;
    const float* u;
    float* s;  // swiglu output
    ActOutPtrs act_s;
    const uint8_t* pf[3];  // weight bytes to pull into L2 at the start
    int64_t pf_bytes[3];
    unsigned* barrier;
    bool clocks;  // add each phase's SM cycles to g_ffn_phase_cycles
};

// QINFER_CUDA_FFN_CLOCKS=1: where the fused FFN block's time goes. Per phase,
// the SM cycles summed over every block run (thread 0's clock, the block
// synchronized at each mark); the last word counts block runs.
constexpr int kFfnPhases = 8;
const char* const kFfnPhaseNames[kFfnPhases] = {"prefetch issue", "wait for inputs", "norm + quantize", "gate + up",
                                                "barrier 1",      "swiglu + quantize", "barrier 2", "down + residual"};
__device__ unsigned long long g_ffn_phase_cycles[kFfnPhases + 1];

struct PhaseClock {
    bool on;
    long long t;
    __device__ explicit PhaseClock(bool enabled) : on(enabled), t(0) {
#ifdef __CUDA_ARCH__  // the host pass of the translation unit sees this body too
        if (on) t = clock64();
#endif
    }
    __device__ void mark(int phase) {
        if (!on) return;
        __syncthreads();
        if (threadIdx.x == 0) {
            const long long now = clock64();
            atomicAdd(&g_ffn_phase_cycles[phase], static_cast<unsigned long long>(now - t));
            if (phase == kFfnPhases - 1) atomicAdd(&g_ffn_phase_cycles[kFfnPhases], 1ull);
            t = now;
        }
    }
};

// All blocks of the grid (co-resident: the launcher sizes it to one wave) meet
// here; writes before it are visible to every block after it (bar[0]: arrivals,
// bar[1]: generation).
__device__ __forceinline__ void grid_barrier(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned* gen = bar + 1;
        const unsigned g0 = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (*gen == g0) __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

// The quantized activations of one token row of up to kmax elements (a
// multiple of 256) in shared memory: quants, block scales, 16-element sums,
// each section 16-byte aligned (the product kernels load them 8 and 16 bytes
// at a time).
__host__ __device__ constexpr int smem_act_d_at(int kmax) { return kmax; }
__host__ __device__ constexpr int smem_act_bsum_at(int kmax) { return (kmax + kmax / 256 * 4 + 15) / 16 * 16; }
__host__ __device__ constexpr int smem_act_bytes(int kmax) { return smem_act_bsum_at(kmax) + kmax / 16 * 2; }
struct SmemAct {
    int8_t* qs;
    float* d;
    int16_t* bsum;
    __device__ SmemAct(void* base, int kmax)
        : qs(static_cast<int8_t*>(base)),
          d(reinterpret_cast<float*>(static_cast<int8_t*>(base) + smem_act_d_at(kmax))),
          bsum(reinterpret_cast<int16_t*>(static_cast<int8_t*>(base) + smem_act_bsum_at(kmax))) {}
    __device__ ActQ view(int K) const {
        ActQ a;
        a.qs = qs;
        a.d = d;
        a.bsum = bsum;
        a.K = K;
        return a;
    }
};

// One block has E / 8 threads (norm_quantize's row threads: a warp per
// 256-element span). Phases: L2 prefetch of the weights; rms_norm + Q8_K
// quantization of x (as reg_norm_kernel computes it for one row); gate and up
// rows (R rows per warp group, as mmv_rows_kernel); barrier; swiglu +
// quantization, a warp per span (as gate_quant_kernel); barrier; down rows
// with the residual.
// Rows [row0, row0 + rpw) of a weight of type TY (R for Q4_K, R / 2 otherwise).
template <GgmlType TY, int R>
__device__ __forceinline__ void ffn_rows(const MvJobDev& j, int64_t row0, const ActQ& a, int lane) {
    constexpr int RR = TY == GgmlType::Q4_K ? R : (R > 1 ? R / 2 : 1);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    rows_lane<TY, RR, R, 1, FromShared>(j.w, row0, j.N, a, lane, acc);
    rows_store<R>(j, row0, j.rpw, acc, lane);
}

template <int TG, int TD, int R, int RD>
__global__ void __maxnreg__(96) ffn_decode_kernel(const FfnDev f) {
    extern __shared__ int4 ffn_smem[];
    __shared__ float red[32];
    const int lane = threadIdx.x % WARP, wib = threadIdx.x / WARP, nwb = blockDim.x / WARP;
    const int kmax = max(f.E, f.F);
    PhaseClock clk(f.clocks);
    pdl_trigger_at_top();
    {
        const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, nt = int64_t(gridDim.x) * blockDim.x;
#pragma unroll
        for (int i = 0; i < 3; ++i)
            for (int64_t off = t * 128; off < f.pf_bytes[i]; off += nt * 128)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(f.pf[i] + off));
    }
    clk.mark(0);
    pdl_wait_inputs();
    clk.mark(1);

    // rms_norm + quantization: lane holds elements 256 wib + 8 lane + [0, 8)
    SmemAct sa(ffn_smem, kmax);
    {
        const int k0 = 256 * wib + 8 * lane;
        float v[8], wv[8];
        const float4 x0 = *reinterpret_cast<const float4*>(f.x + k0), x1 = *reinterpret_cast<const float4*>(f.x + k0 + 4);
        const float4 w0 = *reinterpret_cast<const float4*>(f.norm_w + k0),
                     w1 = *reinterpret_cast<const float4*>(f.norm_w + k0 + 4);
        v[0] = x0.x; v[1] = x0.y; v[2] = x0.z; v[3] = x0.w; v[4] = x1.x; v[5] = x1.y; v[6] = x1.z; v[7] = x1.w;
        wv[0] = w0.x; wv[1] = w0.y; wv[2] = w0.z; wv[3] = w0.w; wv[4] = w1.x; wv[5] = w1.y; wv[6] = w1.z; wv[7] = w1.w;
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) ss = fmaf(v[i], v[i], ss);
        for (int o = WARP / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) red[wib] = ss;
        __syncthreads();
        ss = warp_sum(lane < nwb ? red[lane] : 0.f);
        const float sc = rms_scale(ss, f.E, f.eps);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = (v[i] * sc) * wv[i];
        if (blockIdx.x == 0) {
            *reinterpret_cast<float4*>(f.h + k0) = make_float4(v[0], v[1], v[2], v[3]);
            *reinterpret_cast<float4*>(f.h + k0 + 4) = make_float4(v[4], v[5], v[6], v[7]);
            quantize_span<3>(v, lane, f.act_h, 0, f.E, 256 * wib, true);
        }
        quantize_span<3>(v, lane, ActOutPtrs{sa.qs, sa.d, nullptr, sa.bsum}, 0, f.E, 256 * wib, true);
        __syncthreads();
    }
    clk.mark(2);

    const int W = int(gridDim.x) * nwb, w0 = int(blockIdx.x) * nwb + wib;
    {  // gate and up rows
        const ActQ a = sa.view(f.E);
        const int64_t ng_gate = (f.gate.N + f.gate.rpw - 1) / f.gate.rpw;
        const int64_t ng = ng_gate + (f.up.N + f.up.rpw - 1) / f.up.rpw;
        for (int64_t g = w0; g < ng; g += W) {
            const bool is_gate = g < ng_gate;
            const MvJobDev& j = is_gate ? f.gate : f.up;
            ffn_rows<GgmlType(TG), R>(j, (is_gate ? g : g - ng_gate) * j.rpw, a, lane);
        }
    }
    clk.mark(3);
    grid_barrier(f.barrier);
    clk.mark(4);

    // swiglu + quantization; gate / up come from other blocks: L2 loads
    for (int sp = w0; sp < f.F / 256; sp += W) {
        const int k = 256 * sp + 8 * lane;
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float av = __ldcg(f.g + k + i);
            v[i] = silu(av) * __ldcg(f.u + k + i);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) f.s[k + i] = v[i];
        quantize_span<3>(v, lane, f.act_s, 0, f.F, 256 * sp, true);
    }
    clk.mark(5);
    grid_barrier(f.barrier);
    clk.mark(6);

    {  // down rows, on a copy of the quantized s
        SmemAct sd(ffn_smem, kmax);
        for (int i = threadIdx.x; i < f.F / 16; i += blockDim.x)
            reinterpret_cast<int4*>(sd.qs)[i] = __ldcg(reinterpret_cast<const int4*>(f.act_s.qs) + i);
        for (int i = threadIdx.x; i < f.F / 256; i += blockDim.x) sd.d[i] = __ldcg(f.act_s.d + i);
        for (int i = threadIdx.x; i < f.F / 16; i += blockDim.x) sd.bsum[i] = __ldcg(f.act_s.bsum + i);
        __syncthreads();
        const ActQ a = sd.view(f.F);
        const int64_t ng = (f.down.N + f.down.rpw - 1) / f.down.rpw;
        for (int64_t g = w0; g < ng; g += W) ffn_rows<GgmlType(TD), RD>(f.down, g * f.down.rpw, a, lane);
    }
    clk.mark(7);
}

constexpr int kFfnRows = 4;      // rows per warp group of gate / up (Q4_K; half for Q5_K / Q6_K)
constexpr int kFfnDownRows = 1;  // of down (long rows)

size_t ffn_smem_bytes(int64_t E, int64_t F) { return size_t(smem_act_bytes(int(std::max(E, F)))); }

// Blocks of the one wave: what fits per SM, at most ~24 warps per SM.
int ffn_grid(const void* kernel, int threads, size_t smem) {
    const Residency r = residency(kernel, threads, smem);
    if (r.per_sm < 1) fail("CUDA FFN kernel: does not fit on one SM");
    return std::min(r.per_sm, std::max(1, 24 * WARP / threads)) * r.sms;
}

template <int TG, int TD>
void ffn_start(const FfnDev& f, cudaStream_t s) {
    auto kernel = ffn_decode_kernel<TG, TD, kFfnRows, kFfnDownRows>;
    const int threads = f.E / 8;
    const size_t smem = ffn_smem_bytes(f.E, f.F);
    allow_dynamic_smem(kernel, smem);
    const int grid = ffn_grid(reinterpret_cast<const void*>(kernel), threads, smem);
    launch("ffn_decode_kernel", kernel, dim3(unsigned(grid)), dim3(unsigned(threads)), smem, s, f);
}
template <int TG>
void ffn_start_d(GgmlType down, const FfnDev& f, cudaStream_t s) {
    switch (down) {
        case GgmlType::Q4_K: return ffn_start<TG, int(GgmlType::Q4_K)>(f, s);
        case GgmlType::Q5_K: return ffn_start<TG, int(GgmlType::Q5_K)>(f, s);
        default: return ffn_start<TG, int(GgmlType::Q6_K)>(f, s);
    }
}
void ffn_start_g(GgmlType gate, GgmlType down, const FfnDev& f, cudaStream_t s) {
    switch (gate) {
        case GgmlType::Q4_K: return ffn_start_d<int(GgmlType::Q4_K)>(down, f, s);
        case GgmlType::Q5_K: return ffn_start_d<int(GgmlType::Q5_K)>(down, f, s);
        default: return ffn_start_d<int(GgmlType::Q6_K)>(down, f, s);
    }
}

bool is_row_kernel_type(GgmlType t) {
    return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K;
}
bool plain_vector(const Rows& r, int64_t n) { return r.data && r.n == n && r.n1 * r.n2 == 1; }
bool aligned16_ptr(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool ffn_clocks_enabled() {
    static const bool on = env_int("QINFER_CUDA_FFN_CLOCKS", 0, 1, 0) != 0;
    return on;
}

void ffn_print_clocks() {
    if (!ffn_clocks_enabled()) return;
    unsigned long long c[kFfnPhases + 1] = {};
    if (cudaMemcpyFromSymbol(c, g_ffn_phase_cycles, sizeof c) != cudaSuccess || c[kFfnPhases] == 0) return;
    int dev = 0, khz = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev);
    const double runs = double(c[kFfnPhases]), us_per_cycle = khz > 0 ? 1e3 / khz : 0;
    std::fprintf(stderr, "ffn_decode phases, mean per block run (%.0f block runs, %d MHz):\n", runs, khz / 1000);
    for (int i = 0; i < kFfnPhases; ++i)
        std::fprintf(stderr, "  %-18s %8.0f cycles %7.2f us\n", kFfnPhaseNames[i], double(c[i]) / runs,
                     double(c[i]) / runs * us_per_cycle);
}

bool ffn_decode_fits(const FfnJob& j) {
    const int64_t E = j.norm.x.n, F = j.gate.w.N;
    if (matvec_variant() < 3 || !j.barrier) return false;
    if (E < 256 || E % 256 != 0 || E > 4096 || F < 256 || F % 256 != 0) return false;
    if (j.norm.op != NormOp::Rms || !plain_vector(j.norm.x, E) || !plain_vector(j.norm.y, E) || !j.norm.w ||
        !aligned16_ptr(j.norm.x.data) || !aligned16_ptr(j.norm.y.data) || !aligned16_ptr(j.norm.w))
        return false;
    const bool q8k_h = j.act_h.kind == ActKind::Q8_K && j.act_h.K == E && j.act_h.T == 1 && j.act_h.x == j.norm.y.data;
    const bool q8k_s = j.act_s.kind == ActKind::Q8_K && j.act_s.K == F && j.act_s.T == 1 && j.act_s.x == j.s.data;
    if (!q8k_h || !q8k_s) return false;
    for (const MatvecJob* m : {&j.gate, &j.up, &j.down})
        if (!is_row_kernel_type(m->w.type) || m->conv.w || m->bias) return false;
    if (j.gate.w.K != E || j.up.w.K != E || j.up.w.N != F || j.down.w.K != F || j.down.w.N != E) return false;
    if (j.gate.res || j.up.res || j.gate.y == j.up.y || j.gate.w.type != j.up.w.type) return false;
    if (!plain_vector(j.ga, F) || !plain_vector(j.ub, F) || !plain_vector(j.s, F) || j.ga.data != j.gate.y ||
        j.ub.data != j.up.y)
        return false;
    if (j.down.res && (!j.down.res_out)) return false;
    return true;
}

void ffn_decode(const FfnJob& j, cudaStream_t s) {
    if (!ffn_decode_fits(j)) fail("CUDA FFN kernel: the ops do not fit it");
    FfnDev f{};
    f.x = j.norm.x.data;
    f.norm_w = j.norm.w;
    f.eps = j.norm.eps;
    f.h = j.norm.y.data;
    f.E = int(j.norm.x.n);
    f.F = int(j.gate.w.N);
    f.act_h = act_out(j.act_h);
    f.gate = job_dev(j.gate);
    f.up = job_dev(j.up);
    f.down = job_dev(j.down);
    f.gate.rpw = rows_for(j.gate.w.type, kFfnRows);
    f.up.rpw = rows_for(j.up.w.type, kFfnRows);
    f.down.rpw = 1;
    f.g = j.gate.y;
    f.u = j.up.y;
    f.s = j.s.data;
    f.act_s = act_out(j.act_s);
    const MatvecJob* ws[3] = {&j.gate, &j.up, &j.down};
    static const bool prefetch = env_int("QINFER_CUDA_FFN_PREFETCH", 0, 1, 1) != 0;  // (A/B)
    for (int i = 0; i < 3 && prefetch; ++i) {
        f.pf[i] = ws[i]->w.data;
        f.pf_bytes[i] = int64_t(ws[i]->w.layout.main_bytes) * ws[i]->w.N * (ws[i]->w.K / 256);
    }
    f.barrier = j.barrier;
    f.clocks = ffn_clocks_enabled();
    ffn_start_g(j.gate.w.type, j.down.w.type, f, s);
    QINFER_CUDA_LAUNCHED("ffn_decode");
}

bool matvec_multi_supports(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
        case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
            return true;
        default:
            return false;
    }
}

namespace {
bool rows_path(const MatvecJob* jobs, int n_jobs, int64_t T) {
    bool rows = T == 1 && matvec_variant() >= 3;
    for (int i = 0; i < n_jobs; ++i) rows &= rows_kernel_supports(jobs[i].w.type);
    return rows;
}
}  // namespace

bool conv_after_fits(const MatvecJob* jobs, int n_jobs, int64_t T) {
    return n_jobs >= 1 && n_jobs <= kMaxMatvecJobs && rows_path(jobs, n_jobs, T);
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
    bool conv = false;
    for (int i = 0; i < n_jobs; ++i) conv |= jobs[i].conv.w != nullptr;
    if (conv && (!conv_after_fits(jobs, n_jobs, T) || [&] {
            for (int i = 0; i < n_jobs; ++i)
                if (jobs[i].conv.w && (jobs[i].conv.K < 2 || jobs[i].conv.K > 6 || !jobs[i].conv.seg)) return true;
            return false;
        }()))
        fail("CUDA matvec batch: a fused conv needs the one-token K-quant kernel and a kernel size of 2..6");
    if (rows_path(jobs, n_jobs, T)) {
        rows_launch(jobs, n_jobs, act, s);
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
__global__ void dequant_f16_kernel(WArgs w, int64_t base, int64_t n, __half* __restrict__ out) {
    constexpr int BS = TY == GgmlType::F32 || TY == GgmlType::F16 || TY == GgmlType::BF16 ? 1
                       : (TY == GgmlType::Q4_K || TY == GgmlType::Q5_K || TY == GgmlType::Q6_K) ? 256 : 32;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = __float2half_rn(dequant_elem<TY>(w, (base + i) / BS, int((base + i) % BS)));
}

// Eight consecutive elements (one 16-byte store) per thread: a quantized block
// is 32 or 256 elements, so the eight share a block and its scales. `base`
// (the first element) is a multiple of the block size.
template <GgmlType TY>
__global__ void dequant_f16x8_kernel(WArgs w, int64_t base, int64_t n8, int4* __restrict__ out) {
    constexpr int BS = (TY == GgmlType::Q4_K || TY == GgmlType::Q5_K || TY == GgmlType::Q6_K) ? 256 : 32;
    for (int64_t i8 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i8 < n8; i8 += int64_t(gridDim.x) * blockDim.x) {
        const int64_t blk = (base + i8 * 8) / BS;
        const int j = int(i8 * 8 % BS);
        union {
            __half2 h[4];
            int4 v;
        } u;
#pragma unroll
        for (int e = 0; e < 4; ++e)
            u.h[e] = __floats2half2_rn(dequant_elem<TY>(w, blk, j + 2 * e), dequant_elem<TY>(w, blk, j + 2 * e + 1));
        out[i8] = u.v;
    }
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
    static void run(const DeviceWeight& w, int64_t row0, int64_t rows, __half* out, cudaStream_t s) {
        const int64_t n = w.K * rows, base = w.K * row0;
        constexpr bool blocked = TY != GgmlType::F32 && TY != GgmlType::F16 && TY != GgmlType::BF16;
        if constexpr (blocked) {  // K is a multiple of the block size
            const int blocks = int(ceil_div(n / 8, 256) < 65536 ? ceil_div(n / 8, 256) : 65536);
            dequant_f16x8_kernel<TY><<<blocks, 256, 0, s>>>(wargs(w), base, n / 8, reinterpret_cast<int4*>(out));
            return;
        }
        const int blocks = int(ceil_div(n, 256) < 65536 ? ceil_div(n, 256) : 65536);
        dequant_f16_kernel<TY><<<blocks, 256, 0, s>>>(wargs(w), base, n, out);
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

void dequant_f16(const DeviceWeight& w, int64_t row0, int64_t n, void* out, cudaStream_t s) {
    if (n <= 0) return;
    by_type<DequantF16>(w.type, w, row0, n, static_cast<__half*>(out), s);
    QINFER_CUDA_LAUNCHED("dequant_f16");
}

}  // namespace qinfer::cuda
