// Row-wise and elementwise ops: norms, residual add, gates, copies, RoPE.
// Same formulas and operation order as the CPU backend (runtime/cpu/cpu_ops.cpp).
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "common/env.h"
#include "common/error.h"
#include "runtime/cuda/act_quant.cuh"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

namespace {

// Norm kernels for rows longer than kRegRowMax (and QINFER_CUDA_REG_NORM=0): one
// warp per row when rows are short, else one block per row.
using NormKind = NormOp;

template <NormKind KIND, bool WARP_PER_ROW>
__global__ void norm_kernel(Rows x, Rows z, const float* __restrict__ w, float eps, Rows y, int64_t rows) {
    pdl_enter();
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
    else s = rms_scale(ss, n, eps);
    if (KIND == NormKind::RmsGated) {
        const float* zr = row_ptr(z, r);
        for (int64_t i = tid; i < n; i += width) yr[i] = rms_gated(xr[i], s, w[i], zr[i]);
    } else if (KIND == NormKind::Rms) {
        for (int64_t i = tid; i < n; i += width) yr[i] = (xr[i] * s) * w[i];
    } else {
        for (int64_t i = tid; i < n; i += width) yr[i] = xr[i] * s;
    }
}

// Rows of up to kRegRowMax floats (every hidden size we run): the row is held in
// registers, 8 consecutive elements per thread (two 16-byte loads when aligned),
// over tpr threads: the smallest power of two >= n / 8 for rows up to 256, else
// 32 * ceil(n / 256). x, w (and z) are read once with all loads in flight before
// the reduction (shuffles within the row's lanes, plus one shared-memory step
// when a row spans several warps). Short rows share a warp / block.
//
// One launch may run two independent norms of one kind and length (q and k
// heads): rows [0, rows0) are set 0, the rest set 1. The fused variant (QK != 0)
// quantizes the normed rows for a matrix product from the same registers
// (act_quant.cuh): m consecutive op rows form one token row of the product's
// input. Its activations are bit-identical to the norm followed by
// quantize_act, because the plain norm runs this kernel with the same tpr.
constexpr int64_t kRegRowMax = 8192;

inline int reg_row_threads(int64_t n) {
    if (n > 256) return int((n + 255) / 256) * WARP;
    int t = 1;
    while (t * 8 < n) t *= 2;
    return t;
}

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

struct RegNormArgs {
    Rows x0, z0, y0, x1, z1, y1;  // z: RmsGated only
    const float* w0;
    const float* w1;
    int64_t rows0, rows;  // rows of set 0, of both sets
    float eps;
    int tpr;
    int64_t m;  // QK: op rows per token row of the quantized input
    ActOutPtrs q;
    // ROPE: NEOX rope on the first n_rot elements of every normed row (row r of
    // a set is head r % n1 of token r / n1), as rope_neox would apply it after.
    const int32_t* pos;
    int n_rot;
    double freq_scale;
    // STORE: set 1's rows (k heads, after the rope) and rows_v rows of v (the
    // grid's rows after both sets) go into the cache, as kv_store writes them.
    Rows v;
    int64_t rows_v;
    unsigned char* cache_k;
    unsigned char* cache_v;
    int cache_type;  // 0 f32, 1 f16, 2 q8_0
    int64_t n_kv, n_ctx;
    const int32_t* slot;
};
// The rope's frequencies (1 KB) travel only with the launches that rotate.
struct RegNormRopeArgs : RegNormArgs {
    RopeFreqs freqs;
};
template <bool ROPE> using RegNormArgsFor = std::conditional_t<ROPE, RegNormRopeArgs, RegNormArgs>;

// One rotated pair as rope_neox computes it (also there): no contraction into
// FMAs, so the fused and the plain rope round alike.
__device__ __forceinline__ float rope_lo(float a, float b, float c, float s) {
    return __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
}
__device__ __forceinline__ float rope_hi(float a, float b, float c, float s) {
    return __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}
// cos / sin of pair i at position pos (angles in double, as the CPU backend;
// its frequencies computed there too: rope_freqs).
__device__ __forceinline__ void rope_cs(int32_t pos, int i, const RopeFreqs& f, double freq_scale, float* c,
                                        float* s) {
    const double p = double(pos) * freq_scale;
    const double theta = p * f.inv[i];
    double sn, cn;
    sincos(theta, &sn, &cn);
    *c = float(cn);
    *s = float(sn);
}

// QK: 0 = no quantization, 1 = Q8_0, 2 = Q8_1, 3 = Q8_K.
// (Blocks are at most 256 threads with ROPE: its double angles need registers.)
template <NormKind KIND, bool VEC, int QK, bool ROPE = false, bool STORE = false>
__global__ void __launch_bounds__(ROPE ? 256 : 1024) reg_norm_kernel(const RegNormArgsFor<ROPE> a) {
    if constexpr (ROPE) pdl_trigger_at_top();
    else pdl_trigger_small(1);
    __shared__ float red[32];
    const int tpr = a.tpr;
    const int rib = threadIdx.x / tpr, tid = threadIdx.x % tpr, lane = threadIdx.x % WARP;
    const int64_t rg = int64_t(blockIdx.x) * (blockDim.x / tpr) + rib;
    const bool live = rg < a.rows;  // dead threads still join the shuffles and the barrier
    const int64_t rv = rg - a.rows;  // STORE: the v row (head, token) of a thread past both sets
    const bool vrow = STORE && !live && rv < a.rows_v;
    const bool set1 = rg >= a.rows0;
    const int64_t r = set1 ? rg - a.rows0 : rg;
    const Rows x = set1 ? a.x1 : a.x0;
    const Rows z = set1 ? a.z1 : a.z0;
    const Rows y = set1 ? a.y1 : a.y0;
    const float* w = set1 ? a.w1 : a.w0;
    const int64_t n = live ? x.n : 0;
    const int64_t k0 = int64_t(tid) * 8;
    float v[8], wv[8], zv[8];
    // Before the wait for the kernels before: what none of them writes -- the
    // norm weight (the previous token's traffic has evicted it from L2) and the
    // rope's angles (positions are copied before the step's kernels).
    if (KIND != NormKind::L2) load8<VEC>(w, k0, n, wv);
    float cj[4], sj[4];  // ROPE: cos / sin of pairs li + L j, held by the row's first L lanes
    const int L = tpr < WARP ? tpr : WARP, li = tid % L;
    if constexpr (ROPE) {
        const int half = a.n_rot / 2;
        const int32_t pos = live ? a.pos[r / y.n1] : 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            cj[j] = sj[j] = 0.f;
            if (live && tid < L && li + L * j < half)
                rope_cs(pos, li + L * j, a.freqs, a.freq_scale, &cj[j], &sj[j]);
        }
    }
    pdl_wait_inputs();
    if (vrow) load8<VEC>(row_ptr(a.v, rv), k0, a.v.n, v);
    else load8<VEC>(live ? row_ptr(x, r) : x.data, k0, n, v);
    if (KIND == NormKind::RmsGated) load8<VEC>(live ? row_ptr(z, r) : z.data, k0, n, zv);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) ss = fmaf(v[i], v[i], ss);
    for (int o = (tpr < WARP ? tpr : WARP) / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (tpr > WARP) {  // the row's warps are consecutive
        const int wpr = tpr / WARP;
        if (lane == 0) red[threadIdx.x / WARP] = ss;
        __syncthreads();
        ss = warp_sum(lane < wpr ? red[rib * wpr + lane] : 0.f);
    }
    float s;
    if (KIND == NormKind::L2) s = 1.f / fmaxf(sqrtf(ss), a.eps);
    else s = rms_scale(ss, x.n, a.eps);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        if (vrow) break;  // v rows are stored as loaded
        if (KIND == NormKind::RmsGated) v[i] = rms_gated(v[i], s, wv[i], zv[i]);
        else if (KIND == NormKind::Rms) v[i] = (v[i] * s) * wv[i];
        else v[i] = v[i] * s;
    }
    if (ROPE) {
        // Pairs (i, i + n_rot/2) lie in whole lanes of the row's first warp
        // (norm_rope_fits): a lane swaps its 8 values with its partner's. The
        // row's L lanes there compute the n_rot/2 angles (<= 4 each) and hand
        // them out with shuffles (computed above, before the wait), so no lane
        // evaluates more than 4 sincos.
        const int half = a.n_rot / 2, h8 = half / 8;
        const int first = lane - li;
        const int ptid = tid < h8 ? tid + h8 : tid < 2 * h8 ? tid - h8 : tid;
        float pv[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) pv[i] = __shfl_sync(0xffffffffu, v[i], lane - tid + ptid);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int e = tid * 8 + i, p = e % half;
            float c = 0.f, sn = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // every lane shuffles; the pair's slot is kept
                const float cs = __shfl_sync(0xffffffffu, cj[j], first + p % L);
                const float ss2 = __shfl_sync(0xffffffffu, sj[j], first + p % L);
                if (j == p / L) {
                    c = cs;
                    sn = ss2;
                }
            }
            if (live && tid < 2 * h8) v[i] = e < half ? rope_lo(v[i], pv[i], c, sn) : rope_hi(pv[i], v[i], c, sn);
        }
    }
    if (live) store8<VEC>(row_ptr(y, r), k0, n, v);
    if (STORE) {
        // k: set 1's row r = (head g, token t) as the rope left it; v: row rv.
        const bool krow = live && set1;
        const int64_t rr = krow ? r : rv, g = rr % a.n_kv, t = rr / a.n_kv;
        const int64_t d = a.v.n;
        const int64_t row = krow || vrow ? (int64_t(a.slot[t]) * a.n_ctx + a.pos[t]) * a.n_kv + g : 0;
        store_cache8(krow ? a.cache_k : a.cache_v, a.cache_type, row, d, k0, v, (krow || vrow) && k0 < d);
    }
    if (QK) {
        // The warp's 256 values are one span of a token row (norm_quantize_fits):
        // rows of >= 32 lanes start a token row (m == 1) or fill whole spans;
        // shorter rows are exactly 8 * tpr long and a warp's rows share a token.
        const int64_t r0 = tpr >= WARP ? r : r - lane / tpr;
        const int64_t kw = (r0 % a.m) * x.n + (tpr >= WARP ? int64_t(tid - lane) * 8 : 0);
        quantize_span<QK>(v, lane, a.q, r0 / a.m, a.m * x.n, kw, live);
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
bool rows_vec_ok(const Rows& r) {
    return aligned16(r.data) && r.n % 4 == 0 && (r.n1 <= 1 || r.s1 % 4 == 0) && (r.n2 <= 1 || r.s2 % 4 == 0);
}
bool job_vec_ok(const NormJob& j) {
    return rows_vec_ok(j.x) && rows_vec_ok(j.y) && (j.op == NormOp::L2 || aligned16(j.w)) &&
           (j.op != NormOp::RmsGated || rows_vec_ok(j.z));
}

// One launch for job a (and job b when given: same op and row length).
template <NormKind KIND, int QK, bool ROPE = false>
void launch_reg_norm(const NormJob& j0, const NormJob* j1, int64_t m, const ActOutPtrs& q, cudaStream_t s,
                     const RopeJob* rope = nullptr, const KvStoreJob* store = nullptr) {
    RegNormArgsFor<ROPE> a{};
    a.x0 = j0.x;
    a.z0 = j0.op == NormOp::RmsGated ? j0.z : j0.x;
    a.y0 = j0.y;
    a.w0 = j0.w;
    const NormJob& jb = j1 ? *j1 : j0;
    a.x1 = jb.x;
    a.z1 = jb.op == NormOp::RmsGated ? jb.z : jb.x;
    a.y1 = jb.y;
    a.w1 = jb.w;
    a.rows0 = j0.x.n1 * j0.x.n2;
    a.rows = a.rows0 + (j1 ? j1->x.n1 * j1->x.n2 : 0);
    a.eps = j0.eps;
    a.tpr = reg_row_threads(j0.x.n);
    a.m = m;
    a.q = q;
    if constexpr (ROPE) {
        a.pos = rope->pos;
        a.n_rot = rope->n_rot;
        a.freqs = rope_freqs(rope->n_rot, rope->base);
        a.freq_scale = double(rope->freq_scale);
    }
    if (store) {
        a.v = store->v;
        a.rows_v = store->v.n1 * store->v.n2;
        a.cache_k = static_cast<unsigned char*>(store->kv.k);
        a.cache_v = static_cast<unsigned char*>(store->kv.v);
        a.cache_type = kv_cache_code(store->kv.type);
        a.n_kv = store->kv.n_kv;
        a.n_ctx = store->kv.n_ctx;
        a.slot = store->slot;
    }
    if (a.rows == 0 || j0.x.n == 0) return;
    const int rpb = a.tpr >= 256 ? 1 : 256 / a.tpr;
    const bool vec = job_vec_ok(j0) && (!j1 || job_vec_ok(*j1)) && (!store || rows_vec_ok(store->v));
    const unsigned grid = unsigned(ceil_div(a.rows + (store ? a.rows_v : 0), rpb));
    auto go = [&](auto with_store) {  // the 16-byte or the scalar form
        constexpr bool STORE = decltype(with_store)::value;
        if (vec) launch("reg_norm_kernel", reg_norm_kernel<KIND, true, QK, ROPE, STORE>, dim3(grid),
                        dim3(a.tpr * rpb), 0, s, a);
        else launch("reg_norm_kernel", reg_norm_kernel<KIND, false, QK, ROPE, STORE>, dim3(grid),
                    dim3(a.tpr * rpb), 0, s, a);
    };
    if constexpr (ROPE) {
        if (store) return go(std::true_type{});
    }
    go(std::false_type{});
}

template <int QK>
void launch_reg_norm_op(const NormJob& j0, const NormJob* j1, int64_t m, const ActOutPtrs& q, cudaStream_t s) {
    switch (j0.op) {
        case NormOp::Rms: launch_reg_norm<NormKind::Rms, QK>(j0, j1, m, q, s); break;
        case NormOp::L2: launch_reg_norm<NormKind::L2, QK>(j0, j1, m, q, s); break;
        case NormOp::RmsGated: launch_reg_norm<NormKind::RmsGated, QK>(j0, j1, m, q, s); break;
    }
}

template <NormKind KIND>
void launch_norm(Rows x, Rows z, const float* w, float eps, Rows y, cudaStream_t s, const char* name) {
    const int64_t rows = x.n1 * x.n2;
    if (rows == 0 || x.n == 0) return;
    // QINFER_CUDA_REG_NORM=0: the earlier kernels (for A/B; the fused norms keep
    // the register kernel, so fused and plain then agree up to rounding only).
    static const bool reg = !env_is("QINFER_CUDA_REG_NORM", "0");
    if (reg && x.n <= kRegRowMax) {
        NormJob j;
        j.op = KIND;
        j.x = x;
        j.z = z;
        j.y = y;
        j.w = w;
        j.eps = eps;
        launch_reg_norm<KIND, 0>(j, nullptr, 1, ActOutPtrs{}, s);
    } else if (x.n <= 512) {
        const int warps = 8;
        launch("norm_kernel", norm_kernel<KIND, true>, dim3(ceil_div(rows, warps)), dim3(warps * WARP), 0, s, x, z, w,
                eps, y, rows);
    } else {
        launch("norm_kernel", norm_kernel<KIND, false>, dim3(unsigned(rows)), dim3(256), 0, s, x, z, w, eps, y, rows);
    }
    QINFER_CUDA_LAUNCHED(name);
}

enum class Ew { Add, Swiglu, SigmoidMul, Copy };

template <Ew OP>
__global__ void ew_kernel(Rows a, Rows b, Rows y, int64_t rows) {
    pdl_enter();
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
    launch("ew_kernel", ew_kernel<OP>, dim3(grid), dim3(threads), 0, s, a, b, y, rows);
    QINFER_CUDA_LAUNCHED(name);
}

// SwiGLU / sigmoid gate fused with the quantization of its result for a matrix
// product: one warp per 256-element span of a token row, lane = 8 consecutive
// elements (n % 8 == 0, so they share an op row: token t's K elements are op
// rows t*m .. t*m+m-1 with m = K / n). The result rows are written as the plain
// op writes them, with the same expression, so the quants are bit-identical.
template <Ew OP, int QK>
__global__ void gate_quant_kernel(Rows a, Rows b, Rows y, int64_t K, int64_t T, ActOutPtrs q) {
    pdl_trigger_small(1);
    pdl_wait_inputs();
    const int lane = threadIdx.x % WARP;
    const int64_t spans = (K + 255) / 256;
    const int64_t wi = int64_t(blockIdx.x) * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (wi >= T * spans) return;  // whole warps
    const int64_t t = wi / spans, k0 = (wi % spans) * 256, k = k0 + 8 * lane;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (k < K) {
        const int64_t row = t * (K / a.n) + k / a.n, col = k % a.n;
        const float* ar = row_ptr(a, row) + col;
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = ar[i];
        if constexpr (OP == Ew::Swiglu) gate8(v, b, y, row, col, SwigluGate{});
        else gate8(v, b, y, row, col, SigmoidGate{});
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
__global__ void rope_kernel(Rows x, const int32_t* __restrict__ pos, int n_rot, const RopeFreqs freqs,
                            double freq_scale) {
    pdl_enter();
    extern __shared__ float cs[];  // [n_rot/2][2]
    const int half = n_rot / 2;
    const int64_t t = blockIdx.x;
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        rope_cs(pos[t], i, freqs, freq_scale, &cs[2 * i], &cs[2 * i + 1]);
    __syncthreads();
    for (int64_t k = threadIdx.x; k < x.n1 * half; k += blockDim.x) {
        const int64_t h = k / half;
        const int i = int(k % half);
        float* v = x.data + h * x.s1 + t * x.s2;
        const float a = v[i], b = v[i + half];
        v[i] = rope_lo(a, b, cs[2 * i], cs[2 * i + 1]);
        v[i + half] = rope_hi(a, b, cs[2 * i], cs[2 * i + 1]);
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

bool rows_are_act_input(const Rows& r, const ActDest& q, int64_t m) {
    const int64_t rows = q.T * m;
    if (r.n <= 0 || r.n * m != q.K || r.n1 * r.n2 != rows || r.data != q.x) return false;
    // the usual layouts at once: [T][m][n] (heads) and [T][n] (token rows)
    if (r.n1 == m && r.n2 == q.T) return (m == 1 || r.s1 == r.n) && (q.T == 1 || r.s2 == q.ldx);
    if (m == 1 && r.n2 == 1) return q.T == 1 || r.s1 == q.ldx;
    if (rows > 4096) return false;
    for (int64_t i = 0; i < rows; ++i) {
        const float* p = r.data + (i % r.n1) * r.s1 + (i / r.n1) * r.s2;
        if (p != q.x + (i / m) * q.ldx + (i % m) * r.n) return false;
    }
    return true;
}

bool whole_blocks(const ActDest& q) { return q.K % (q.kind == ActKind::Q8_K ? 256 : 32) == 0; }

namespace {
bool same_rows(const Rows& a, const Rows& b) { return a.n == b.n && a.n1 * a.n2 == b.n1 * b.n2; }
bool job_shapes_ok(const NormJob& j) {
    return j.x.n > 0 && j.x.n <= kRegRowMax && same_rows(j.x, j.y) && (j.op != NormOp::RmsGated || same_rows(j.x, j.z));
}
// Bytes [lo, hi) a Rows view touches (non-negative strides, as rows_of makes them).
struct Span {
    const char* lo;
    const char* hi;
};
Span span_of(const Rows& r) {
    const char* lo = reinterpret_cast<const char*>(r.data);
    if (r.n1 * r.n2 == 0 || r.n == 0) return {lo, lo};
    return {lo, lo + 4 * ((r.n1 - 1) * r.s1 + (r.n2 - 1) * r.s2 + r.n)};
}
bool overlap(const Rows& a, const Rows& b) {
    const Span x = span_of(a), y = span_of(b);
    return x.lo < y.hi && y.lo < x.hi;
}
}  // namespace

bool norm_pair_fits(const NormJob& a, const NormJob& b) {
    if (a.op != b.op || a.eps != b.eps || a.x.n != b.x.n || !job_shapes_ok(a) || !job_shapes_ok(b)) return false;
    // b must neither read nor write what a writes, nor write what a reads.
    const bool gated = a.op == NormOp::RmsGated;
    if (overlap(a.y, b.x) || overlap(a.y, b.y) || (gated && overlap(a.y, b.z))) return false;
    if (overlap(b.y, a.x) || (gated && overlap(b.y, a.z))) return false;
    return (a.op == NormOp::L2 || (a.w && b.w));
}

void norm_pair(const NormJob& a, const NormJob& b, cudaStream_t s) {
    if (!norm_pair_fits(a, b)) fail("CUDA norm_pair: the two norms cannot share a launch");
    launch_reg_norm_op<0>(a, &b, 1, ActOutPtrs{}, s);
    QINFER_CUDA_LAUNCHED("norm_pair");
}

namespace {
bool one_norm_rope_fits(const NormJob& j, const RopeJob& r) {
    const Rows& y = j.y;
    const bool same = r.x.data == y.data && r.x.n == y.n && r.x.n1 == y.n1 && r.x.n2 == y.n2 &&
                      (y.n1 <= 1 || r.x.s1 == y.s1) && (y.n2 <= 1 || r.x.s2 == y.s2);
    // Pairs in whole lanes of a row's first warp. Every row computes its own
    // angles (in double): decode-sized steps only, where launches cost more.
    return same && y.n2 <= 64 && j.op == NormOp::Rms && job_shapes_ok(j) && r.pos && r.n_rot > 0 &&
           r.n_rot % 16 == 0 && r.n_rot <= 256 && r.n_rot <= y.n && y.n <= 2048;
}
}  // namespace

bool norm_rope_fits(const NormJob& a, const NormJob* b, const RopeJob& ra, const RopeJob* rb) {
    if (!one_norm_rope_fits(a, ra)) return false;
    if (!b) return true;
    return rb && norm_pair_fits(a, *b) && one_norm_rope_fits(*b, *rb) && rb->pos == ra.pos &&
           rb->n_rot == ra.n_rot && rb->base == ra.base && rb->freq_scale == ra.freq_scale;
}

bool norm_rope_store_fits(const NormJob& a, const NormJob& b, const RopeJob& ra, const RopeJob& rb,
                          const KvStoreJob& st) {
    if (!norm_rope_fits(a, &b, ra, &rb)) return false;
    const Rows &y = b.y, &k = st.k, &v = st.v;
    const int64_t d = y.n;
    const bool k_is_y = k.data == y.data && k.n == d && k.n1 == y.n1 && k.n2 == y.n2 &&
                        (k.n1 <= 1 || k.s1 == y.s1) && (k.n2 <= 1 || k.s2 == y.s2);
    // v is read while a's and b's rows are written, by other threads of the launch
    return k_is_y && kv_cache_code(st.kv.type) >= 0 && st.kv.d == d &&
           d % 32 == 0 && st.kv.n_kv == y.n1 && v.n == d && v.n1 == y.n1 && v.n2 == y.n2 && st.pos == ra.pos &&
           st.slot && st.kv.k && st.kv.v && !overlap(v, a.y) && !overlap(v, b.y);
}

void norm_rope(const NormJob& a, const NormJob* b, const RopeJob& ra, const RopeJob* rb, cudaStream_t s,
               const KvStoreJob* store) {
    if (!norm_rope_fits(a, b, ra, rb)) fail("CUDA norm_rope: the rope does not apply to the norm's rows");
    if (store && !(b && norm_rope_store_fits(a, *b, ra, *rb, *store)))
        fail("CUDA norm_rope: the cache rows cannot be stored by this launch");
    launch_reg_norm<NormKind::Rms, 0, true>(a, b, 1, ActOutPtrs{}, s, &ra, store);
    QINFER_CUDA_LAUNCHED(store ? "norm_rope + kv_store" : "norm_rope");
}

bool norm_quantize_fits(const NormJob& j, const ActDest& q) {
    if (!qk_of(q.kind) || j.op == NormOp::L2 || !job_shapes_ok(j) || q.K % j.x.n != 0 || !whole_blocks(q))
        return false;
    const int64_t n = j.x.n, m = q.K / n;
    const int tpr = reg_row_threads(n);
    const bool layout = m == 1 ? tpr >= WARP : n == 8 * int64_t(tpr) && (tpr >= WARP || m % (WARP / tpr) == 0);
    return layout && rows_are_act_input(j.y, q, m);
}

void norm_quantize(const NormJob& j, const ActDest& q, cudaStream_t s) {
    if (!norm_quantize_fits(j, q)) fail("CUDA norm_quantize: the norm's rows are not the quantized rows");
    if (q.T == 0) return;
    const ActOutPtrs o = act_out(q);
    const int64_t m = q.K / j.x.n;
    switch (qk_of(q.kind)) {
        case 1: launch_reg_norm_op<1>(j, nullptr, m, o, s); break;
        case 2: launch_reg_norm_op<2>(j, nullptr, m, o, s); break;
        default: launch_reg_norm_op<3>(j, nullptr, m, o, s); break;
    }
    QINFER_CUDA_LAUNCHED("norm_quantize");
}

bool gate_quantize_fits(Rows a, Rows b, Rows y, const ActDest& q) {
    return qk_of(q.kind) && whole_blocks(q) && a.n > 0 && a.n % 8 == 0 && q.K % a.n == 0 && a.n == b.n &&
           a.n == y.n && a.n1 * a.n2 == y.n1 * y.n2 && b.n1 * b.n2 == y.n1 * y.n2 &&
           rows_are_act_input(y, q, q.K / a.n);
}

void gate_quantize(Gate op, Rows a, Rows b, Rows y, const ActDest& q, cudaStream_t s) {
    if (!gate_quantize_fits(a, b, y, q)) fail("CUDA gate_quantize: the gate's rows are not the quantized rows");
    const int qk = qk_of(q.kind);
    if (q.T == 0) return;
    const ActOutPtrs o = act_out(q);
    const int warps = 8;
    const unsigned grid = unsigned(ceil_div(q.T * ((q.K + 255) / 256), warps));
    if (op == Gate::Swiglu) {
        if (qk == 1) launch("gate_quant_kernel", gate_quant_kernel<Ew::Swiglu, 1>, dim3(grid), dim3(warps * WARP), 0,
                s, a, b, y, q.K, q.T, o);
        else if (qk == 2) launch("gate_quant_kernel", gate_quant_kernel<Ew::Swiglu, 2>, dim3(grid),
                dim3(warps * WARP), 0, s, a, b, y, q.K, q.T, o);
        else launch("gate_quant_kernel", gate_quant_kernel<Ew::Swiglu, 3>, dim3(grid), dim3(warps * WARP), 0, s, a, b,
                y, q.K, q.T, o);
    } else {
        if (qk == 1) launch("gate_quant_kernel", gate_quant_kernel<Ew::SigmoidMul, 1>, dim3(grid), dim3(warps * WARP),
                0, s, a, b, y, q.K, q.T, o);
        else if (qk == 2) launch("gate_quant_kernel", gate_quant_kernel<Ew::SigmoidMul, 2>, dim3(grid),
                dim3(warps * WARP), 0, s, a, b, y, q.K, q.T, o);
        else launch("gate_quant_kernel", gate_quant_kernel<Ew::SigmoidMul, 3>, dim3(grid), dim3(warps * WARP), 0, s,
                a, b, y, q.K, q.T, o);
    }
    QINFER_CUDA_LAUNCHED("gate_quantize");
}

RopeFreqs rope_freqs(int n_rot, float base) {
    if (n_rot <= 0 || n_rot % 2 || n_rot / 2 > kMaxRopePairs)
        fail(strfmt("CUDA rope: n_rot %d is not an even number up to %d", n_rot, 2 * kMaxRopePairs));
    RopeFreqs f{};
    for (int i = 0; i < n_rot / 2; ++i) f.inv[i] = std::pow(double(base), -2.0 * double(i) / double(n_rot));
    return f;
}

void rope_neox(Rows x, const int32_t* pos, int n_rot, float base, float freq_scale, cudaStream_t s) {
    if (x.n2 == 0 || n_rot == 0) return;
    if (n_rot % 2 || n_rot > x.n) fail(strfmt("CUDA rope: n_rot %d does not fit rows of %lld", n_rot, (long long)x.n));
    launch("rope_kernel", rope_kernel, dim3(unsigned(x.n2)), dim3(128), size_t(n_rot) * sizeof(float), s, x, pos,
            n_rot, rope_freqs(n_rot, base), double(freq_scale));
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
