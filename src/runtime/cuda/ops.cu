// Row-wise and elementwise ops: norms, residual add, gates, copies, RoPE.
// Same formulas and operation order as the CPU backend (runtime/cpu/cpu_ops.cpp).
#include "common/error.h"
#include "runtime/cuda/act_quant.cuh"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

namespace {

__device__ __forceinline__ float* row_ptr(const Rows& r, int64_t i) {
    return r.data + (i % r.n1) * r.s1 + (i / r.n1) * r.s2;
}

// Norm kernels: one warp per row when rows are short, else one block per row.
enum class NormKind { Rms, L2, RmsGated };

template <NormKind KIND, bool WARP_PER_ROW>
__global__ void norm_kernel(Rows x, Rows z, const float* __restrict__ w, float eps, Rows y, int64_t rows) {
    __shared__ float red[32];
    int64_t r;
    int tid, width;
    if (WARP_PER_ROW) {
        r = int64_t(blockIdx.x) * (blockDim.x / WARP) + threadIdx.x / WARP;
        tid = threadIdx.x % WARP;
        width = WARP;
        if (r >= rows) return;
    } else {
        r = blockIdx.x;
        tid = threadIdx.x;
        width = blockDim.x;
    }
    const int64_t n = x.n;
    const float* xr = row_ptr(x, r);
    float* yr = row_ptr(y, r);
    float ss = 0.f;
    for (int64_t i = tid; i < n; i += width) ss = fmaf(xr[i], xr[i], ss);
    ss = WARP_PER_ROW ? warp_sum(ss) : block_sum(ss, red);
    float s;
    if (KIND == NormKind::L2) s = 1.f / fmaxf(sqrtf(ss), eps);
    else s = 1.f / sqrtf(ss / float(n) + eps);
    if (KIND == NormKind::RmsGated) {
        const float* zr = row_ptr(z, r);
        for (int64_t i = tid; i < n; i += width) yr[i] = (xr[i] * s) * w[i] * silu(zr[i]);
    } else if (KIND == NormKind::Rms) {
        for (int64_t i = tid; i < n; i += width) yr[i] = (xr[i] * s) * w[i];
    } else {
        for (int64_t i = tid; i < n; i += width) yr[i] = xr[i] * s;
    }
}

// Rows of up to kRegRowMax floats (every hidden size we run): the row is held in
// registers, 8 consecutive elements per thread (two 16-byte loads when aligned),
// over tpr = 32 * ceil(n / 256) threads; x, w (and z) are read once and all loads
// are in flight before the reduction (warp shuffles, plus one shared-memory step
// when a row spans several warps). Short rows share a block. The fused variant
// (QK != 0) quantizes the normed row for a matrix product from the same
// registers (act_quant.cuh): its activations are bit-identical to rms_norm
// followed by quantize_act, because both run this kernel for the norm.
constexpr int64_t kRegRowMax = 8192;

inline int reg_row_threads(int64_t n) { return int((n + 255) / 256) * WARP; }

template <bool VEC>
__device__ __forceinline__ void load8(const float* p, int64_t k0, int64_t n, float (&v)[8]) {
    if (VEC) {  // n % 4 == 0 and p 16-byte aligned: each half is wholly inside or outside
        const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 a = k0 < n ? *reinterpret_cast<const float4*>(p + k0) : z4;
        const float4 b = k0 + 4 < n ? *reinterpret_cast<const float4*>(p + k0 + 4) : z4;
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = k0 + i < n ? p[k0 + i] : 0.f;
    }
}

template <bool VEC>
__device__ __forceinline__ void store8(float* p, int64_t k0, int64_t n, const float (&v)[8]) {
    if (VEC) {
        if (k0 < n) *reinterpret_cast<float4*>(p + k0) = make_float4(v[0], v[1], v[2], v[3]);
        if (k0 + 4 < n) *reinterpret_cast<float4*>(p + k0 + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (k0 + i < n) p[k0 + i] = v[i];
    }
}

// QK: 0 = no quantization, 1 = Q8_0, 2 = Q8_1, 3 = Q8_K (row r is token r of q).
template <NormKind KIND, bool VEC, int QK>
__global__ void __launch_bounds__(1024) reg_norm_kernel(Rows x, Rows z, const float* __restrict__ w, float eps,
                                                        Rows y, int64_t rows, int tpr, ActOutPtrs q) {
    __shared__ float red[32];
    const int rib = threadIdx.x / tpr, tid = threadIdx.x % tpr, lane = threadIdx.x % WARP;
    const int64_t r = int64_t(blockIdx.x) * (blockDim.x / tpr) + rib;
    const bool live = r < rows;  // dead threads still join the reduction's barrier
    const int64_t n = live ? x.n : 0;
    const int64_t k0 = int64_t(tid) * 8;
    float v[8], wv[8], zv[8];
    load8<VEC>(live ? row_ptr(x, r) : x.data, k0, n, v);
    if (KIND != NormKind::L2) load8<VEC>(w, k0, n, wv);
    if (KIND == NormKind::RmsGated) load8<VEC>(live ? row_ptr(z, r) : z.data, k0, n, zv);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) ss = fmaf(v[i], v[i], ss);
    ss = warp_sum(ss);
    if (tpr > WARP) {  // the row's warps are consecutive
        const int wpr = tpr / WARP;
        if (lane == 0) red[threadIdx.x / WARP] = ss;
        __syncthreads();
        ss = warp_sum(lane < wpr ? red[rib * wpr + lane] : 0.f);
    }
    float s;
    if (KIND == NormKind::L2) s = 1.f / fmaxf(sqrtf(ss), eps);
    else s = 1.f / sqrtf(ss / float(x.n) + eps);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        if (KIND == NormKind::RmsGated) v[i] = (v[i] * s) * wv[i] * silu(zv[i]);
        else if (KIND == NormKind::Rms) v[i] = (v[i] * s) * wv[i];
        else v[i] = v[i] * s;
    }
    if (live) store8<VEC>(row_ptr(y, r), k0, n, v);
    if (QK) quantize_span<QK>(v, lane, q, r, x.n, k0 - 8 * lane, live);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
bool rows_vec_ok(const Rows& r) {
    return aligned16(r.data) && r.n % 4 == 0 && (r.n1 <= 1 || r.s1 % 4 == 0) && (r.n2 <= 1 || r.s2 % 4 == 0);
}

template <NormKind KIND, int QK>
void launch_reg_norm(Rows x, Rows z, const float* w, float eps, Rows y, const ActOutPtrs& q, cudaStream_t s) {
    const int64_t rows = x.n1 * x.n2;
    const int tpr = reg_row_threads(x.n);
    const int rpb = tpr >= 256 ? 1 : 256 / tpr;
    const bool vec = rows_vec_ok(x) && rows_vec_ok(y) && (KIND == NormKind::L2 || aligned16(w)) &&
                     (KIND != NormKind::RmsGated || rows_vec_ok(z));
    const unsigned grid = unsigned(ceil_div(rows, rpb));
    if (vec) reg_norm_kernel<KIND, true, QK><<<grid, tpr * rpb, 0, s>>>(x, z, w, eps, y, rows, tpr, q);
    else reg_norm_kernel<KIND, false, QK><<<grid, tpr * rpb, 0, s>>>(x, z, w, eps, y, rows, tpr, q);
}

template <NormKind KIND>
void launch_norm(Rows x, Rows z, const float* w, float eps, Rows y, cudaStream_t s, const char* name) {
    const int64_t rows = x.n1 * x.n2;
    if (rows == 0 || x.n == 0) return;
    if (x.n <= kRegRowMax) {
        launch_reg_norm<KIND, 0>(x, z, w, eps, y, ActOutPtrs{}, s);
    } else {
        norm_kernel<KIND, false><<<unsigned(rows), 256, 0, s>>>(x, z, w, eps, y, rows);
    }
    QINFER_CUDA_LAUNCHED(name);
}

enum class Ew { Add, Swiglu, SigmoidMul, Copy };

template <Ew OP>
__global__ void ew_kernel(Rows a, Rows b, Rows y, int64_t rows) {
    const int64_t n = a.n;
    const int64_t r = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
    if (r >= rows) return;
    const float* ar = row_ptr(a, r);
    const float* br = OP == Ew::Copy ? nullptr : row_ptr(b, r);
    float* yr = row_ptr(y, r);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float av = ar[i];
        if (OP == Ew::Add) yr[i] = av + br[i];
        else if (OP == Ew::Swiglu) yr[i] = silu(av) * br[i];
        else if (OP == Ew::SigmoidMul) yr[i] = av * sigmoid(br[i]);
        else yr[i] = av;
    }
}

template <Ew OP>
void launch_ew(Rows a, Rows b, Rows y, cudaStream_t s, const char* name) {
    const int64_t rows = a.n1 * a.n2;
    if (rows == 0 || a.n == 0) return;
    const int threads = 256;
    const int bx = ceil_div(a.n, threads) < 32 ? ceil_div(a.n, threads) : 32;
    const int64_t gy = rows < 65535 ? rows : 65535;
    const dim3 grid(static_cast<unsigned>(bx), unsigned(gy), unsigned(ceil_div(rows, gy)));
    ew_kernel<OP><<<grid, threads, 0, s>>>(a, b, y, rows);
    QINFER_CUDA_LAUNCHED(name);
}

// SwiGLU / sigmoid gate fused with the quantization of its result for a matrix
// product: one warp per 256-element span of a token row, lane = 8 consecutive
// elements (n % 8 == 0, so they share an op row: token t's K elements are op
// rows t*m .. t*m+m-1 with m = K / n). The result rows are written as the plain
// op writes them, with the same expression, so the quants are bit-identical.
template <Ew OP, int QK>
__global__ void gate_quant_kernel(Rows a, Rows b, Rows y, int64_t K, int64_t T, ActOutPtrs q) {
    const int lane = threadIdx.x % WARP;
    const int64_t spans = (K + 255) / 256;
    const int64_t wi = int64_t(blockIdx.x) * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (wi >= T * spans) return;  // whole warps
    const int64_t t = wi / spans, k0 = (wi % spans) * 256, k = k0 + 8 * lane;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (k < K) {
        const int64_t row = t * (K / a.n) + k / a.n, col = k % a.n;
        const float* ar = row_ptr(a, row) + col;
        const float* br = row_ptr(b, row) + col;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float av = ar[i];
            if (OP == Ew::Swiglu) v[i] = silu(av) * br[i];
            else v[i] = av * sigmoid(br[i]);
        }
        float* yr = row_ptr(y, row) + col;
#pragma unroll
        for (int i = 0; i < 8; ++i) yr[i] = v[i];
    }
    quantize_span<QK>(v, lane, q, t, K, k0, true);
}

void check_rows(const char* op, const Rows& a, const Rows& b) {
    if (a.n != b.n || a.n1 * a.n2 != b.n1 * b.n2)
        fail(strfmt("CUDA %s: row shapes differ (%lld x %lld vs %lld x %lld)", op, (long long)a.n,
                    (long long)(a.n1 * a.n2), (long long)b.n, (long long)(b.n1 * b.n2)));
}

// RoPE: one block per token; the block computes cos/sin per pair once (angles
// in double, as the CPU backend does) and applies them to every head.
__global__ void rope_kernel(Rows x, const int32_t* __restrict__ pos, int n_rot, double base, double freq_scale) {
    extern __shared__ float cs[];  // [n_rot/2][2]
    const int half = n_rot / 2;
    const int64_t t = blockIdx.x;
    const double p = double(pos[t]) * freq_scale;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const double theta = p * pow(base, -2.0 * double(i) / double(n_rot));
        double sn, c;
        sincos(theta, &sn, &c);
        cs[2 * i] = float(c);
        cs[2 * i + 1] = float(sn);
    }
    __syncthreads();
    for (int64_t k = threadIdx.x; k < x.n1 * half; k += blockDim.x) {
        const int64_t h = k / half;
        const int i = int(k % half);
        float* v = x.data + h * x.s1 + t * x.s2;
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[2 * i] - b * cs[2 * i + 1];
        v[i + half] = a * cs[2 * i + 1] + b * cs[2 * i];
    }
}

}  // namespace

void rms_norm(Rows x, const float* w, float eps, Rows y, cudaStream_t s) {
    check_rows("rms_norm", x, y);
    launch_norm<NormKind::Rms>(x, x, w, eps, y, s, "rms_norm");
}
void l2_norm(Rows x, float eps, Rows y, cudaStream_t s) {
    check_rows("l2_norm", x, y);
    launch_norm<NormKind::L2>(x, x, nullptr, eps, y, s, "l2_norm");
}
void rms_norm_gated(Rows x, const float* w, Rows z, float eps, Rows y, cudaStream_t s) {
    check_rows("rms_norm_gated", x, y);
    check_rows("rms_norm_gated", x, z);
    launch_norm<NormKind::RmsGated>(x, z, w, eps, y, s, "rms_norm_gated");
}
void add(Rows a, Rows b, Rows y, cudaStream_t s) {
    check_rows("add", a, b);
    check_rows("add", a, y);
    launch_ew<Ew::Add>(a, b, y, s, "add");
}
void swiglu(Rows g, Rows u, Rows y, cudaStream_t s) {
    check_rows("swiglu", g, u);
    check_rows("swiglu", g, y);
    launch_ew<Ew::Swiglu>(g, u, y, s, "swiglu");
}
void sigmoid_mul(Rows x, Rows g, Rows y, cudaStream_t s) {
    check_rows("sigmoid_mul", x, g);
    check_rows("sigmoid_mul", x, y);
    launch_ew<Ew::SigmoidMul>(x, g, y, s, "sigmoid_mul");
}
void copy_rows(Rows src, Rows dst, cudaStream_t s) {
    check_rows("copy", src, dst);
    launch_ew<Ew::Copy>(src, src, dst, s, "copy");
}

namespace {
int qk_of(ActKind k) {
    switch (k) {
        case ActKind::Q8_0: return 1;
        case ActKind::Q8_1: return 2;
        case ActKind::Q8_K: return 3;
        default: return 0;
    }
}

// Whether op rows r (n elements each) are exactly the quantization input of
// `q`: K = m * n, and row t*m + j starts at q.x + t*ldx + j*n.
bool rows_are_act_input(const Rows& r, const ActDest& q, int64_t m) {
    if (r.n <= 0 || r.n * m != q.K || r.n1 * r.n2 != q.T * m || q.T * m > 65536) return false;
    for (int64_t i = 0; i < q.T * m; ++i) {
        const float* p = r.data + (i % r.n1) * r.s1 + (i / r.n1) * r.s2;
        if (p != q.x + (i / m) * q.ldx + (i % m) * r.n) return false;
    }
    return true;
}

ActOutPtrs act_out(const ActDest& q) {
    const ActQ v = act_view(q.kind, q.buf, q.x, q.K, q.T);
    return ActOutPtrs{const_cast<int8_t*>(v.qs), const_cast<float*>(v.d), const_cast<float*>(v.s),
                      const_cast<int16_t*>(v.bsum)};
}
}  // namespace

bool rms_norm_quantize_fits(Rows x, Rows y, const ActDest& q) {
    return qk_of(q.kind) && x.n <= kRegRowMax && x.n == y.n && x.n1 * x.n2 == y.n1 * y.n2 &&
           rows_are_act_input(y, q, 1);
}

void rms_norm_quantize(Rows x, const float* w, float eps, Rows y, const ActDest& q, cudaStream_t s) {
    if (!rms_norm_quantize_fits(x, y, q)) fail("CUDA rms_norm_quantize: the norm's rows are not the quantized rows");
    const int qk = qk_of(q.kind);
    if (q.T == 0) return;
    const ActOutPtrs o = act_out(q);
    if (qk == 1) launch_reg_norm<NormKind::Rms, 1>(x, x, w, eps, y, o, s);
    else if (qk == 2) launch_reg_norm<NormKind::Rms, 2>(x, x, w, eps, y, o, s);
    else launch_reg_norm<NormKind::Rms, 3>(x, x, w, eps, y, o, s);
    QINFER_CUDA_LAUNCHED("rms_norm_quantize");
}

bool gate_quantize_fits(Rows a, Rows b, Rows y, const ActDest& q) {
    return qk_of(q.kind) && a.n > 0 && a.n % 8 == 0 && q.K % a.n == 0 && a.n == b.n && a.n == y.n &&
           a.n1 * a.n2 == y.n1 * y.n2 && b.n1 * b.n2 == y.n1 * y.n2 && rows_are_act_input(y, q, q.K / a.n);
}

void gate_quantize(Gate op, Rows a, Rows b, Rows y, const ActDest& q, cudaStream_t s) {
    if (!gate_quantize_fits(a, b, y, q)) fail("CUDA gate_quantize: the gate's rows are not the quantized rows");
    const int qk = qk_of(q.kind);
    if (q.T == 0) return;
    const ActOutPtrs o = act_out(q);
    const int warps = 8;
    const unsigned grid = unsigned(ceil_div(q.T * ((q.K + 255) / 256), warps));
    if (op == Gate::Swiglu) {
        if (qk == 1) gate_quant_kernel<Ew::Swiglu, 1><<<grid, warps * WARP, 0, s>>>(a, b, y, q.K, q.T, o);
        else if (qk == 2) gate_quant_kernel<Ew::Swiglu, 2><<<grid, warps * WARP, 0, s>>>(a, b, y, q.K, q.T, o);
        else gate_quant_kernel<Ew::Swiglu, 3><<<grid, warps * WARP, 0, s>>>(a, b, y, q.K, q.T, o);
    } else {
        if (qk == 1) gate_quant_kernel<Ew::SigmoidMul, 1><<<grid, warps * WARP, 0, s>>>(a, b, y, q.K, q.T, o);
        else if (qk == 2) gate_quant_kernel<Ew::SigmoidMul, 2><<<grid, warps * WARP, 0, s>>>(a, b, y, q.K, q.T, o);
        else gate_quant_kernel<Ew::SigmoidMul, 3><<<grid, warps * WARP, 0, s>>>(a, b, y, q.K, q.T, o);
    }
    QINFER_CUDA_LAUNCHED("gate_quantize");
}

void rope_neox(Rows x, const int32_t* pos, int n_rot, float base, float freq_scale, cudaStream_t s) {
    if (x.n2 == 0 || n_rot == 0) return;
    if (n_rot % 2 || n_rot > x.n) fail(strfmt("CUDA rope: n_rot %d does not fit rows of %lld", n_rot, (long long)x.n));
    rope_kernel<<<unsigned(x.n2), 128, size_t(n_rot) * sizeof(float), s>>>(x, pos, n_rot, double(base),
                                                                            double(freq_scale));
    QINFER_CUDA_LAUNCHED("rope_neox");
}

namespace {
// At most ~50 ms: should a host call block on this stream while it is held,
// the profile loses accuracy instead of the process hanging.
__global__ void hold_kernel(const volatile int* flag, int value) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (*flag < value) {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > 50000000ull) break;
    }
}
}  // namespace

void hold_until(const volatile int* flag, int value, cudaStream_t s) {
    hold_kernel<<<1, 1, 0, s>>>(flag, value);
    QINFER_CUDA_LAUNCHED("hold_until");
}

}  // namespace qinfer::cuda
