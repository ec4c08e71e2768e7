// Matrix-vector (and matrix x few-vectors) products for decode: one warp per
// output row, lanes striding over 16-byte units of the row, so a warp reads
// its row's bytes once, fully coalesced, for up to 8 tokens at a time.
// Also the row gather of the embedding and the f16 dequantization.
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/quant_dot.cuh"

namespace qinfer::cuda {

bool q4k_pipelined() {
    static const bool on = [] {
        const char* v = std::getenv("QINFER_CUDA_MATVEC");
        return !(v && std::strcmp(v, "v1") == 0);
    }();
    return on;
}

namespace {

constexpr int MMV_WARPS = 4;  // rows per block

WArgs wargs(const DeviceWeight& w) {
    WArgs a;
    a.base = w.data;
    a.qh = w.layout.qh_bytes ? w.data + w.layout.off_qh : nullptr;
    a.d = w.layout.d_bytes ? w.data + w.layout.off_d : nullptr;
    a.bpr = w.K / traits(w.type).block_size;
    return a;
}

template <GgmlType TY, int NT, bool PIPE = false>
__global__ void __launch_bounds__(MMV_WARPS * WARP)
mmv_q_kernel(WArgs w, ActQ A, int64_t N, int T, float* __restrict__ y, int64_t ldy, const float* __restrict__ bias) {
    using Q = QDot<TY>;
    const int64_t row = int64_t(blockIdx.x) * MMV_WARPS + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
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
            mmv_q_kernel<TY, NT, true><<<grid, MMV_WARPS * WARP, 0, s>>>(wargs(w), a, w.N, int(T), y, ldy, bias);
            return;
        }
    }
    mmv_q_kernel<TY, NT><<<grid, MMV_WARPS * WARP, 0, s>>>(wargs(w), a, w.N, int(T), y, ldy, bias);
}

template <GgmlType TY, int NT>
void launch_h(const DeviceWeight& w, const ActQ& a, int64_t T, float* y, int64_t ldy, const float* bias,
              cudaStream_t s) {
    const dim3 grid(ceil_div(w.N, MMV_WARPS), ceil_div(T, NT));
    mmv_h_kernel<TY, NT><<<grid, MMV_WARPS * WARP, 0, s>>>(w.data, a.f32, w.K, w.N, int(T), y, ldy, bias);
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
};
struct MvBatch {
    MvJobDev job[kMaxMatvecJobs];
    int n;
};

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
        d.block0 = blocks;
        blocks += ceil_div(j.w.N, MMV_WARPS);
    }
    const dim3 grid(static_cast<unsigned>(blocks));
    switch (T) {
        case 1:
            if (q4k_pipelined()) mmv_multi_kernel<1, true><<<grid, MMV_WARPS * WARP, 0, s>>>(b, act, int(T));
            else mmv_multi_kernel<1><<<grid, MMV_WARPS * WARP, 0, s>>>(b, act, int(T));
            break;
        case 2: mmv_multi_kernel<2><<<grid, MMV_WARPS * WARP, 0, s>>>(b, act, int(T)); break;
        case 3: case 4: mmv_multi_kernel<4><<<grid, MMV_WARPS * WARP, 0, s>>>(b, act, int(T)); break;
        default: mmv_multi_kernel<8><<<grid, MMV_WARPS * WARP, 0, s>>>(b, act, int(T)); break;
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
