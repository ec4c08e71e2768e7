// Activation quantization for the matrix products: the same rounding as the CPU
// backend's (quant/cpu_matmul.cpp: Q8_K = quantize_row's reference quantizer;
// Q8_0 / Q8_1 = the reference layout rounded to nearest with ties to even, as
// ggml's SIMD quantizers do), so a GPU row quantizes bit-identically to the CPU's.
#include "common/error.h"
#include "runtime/cuda/act_quant.cuh"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

ActKind act_kind_for(GgmlType t) {
    switch (t) {
        // Half weights multiply f32 activations, as the CPU backend does (ggml would
        // round them to the weight's type; that costs ~1e-3 relative and would
        // break the 1e-3 CPU/GPU agreement on f16 models).
        case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: return ActKind::F32;
        case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return ActKind::Q8_0;
        case GgmlType::Q4_1: case GgmlType::Q5_1: return ActKind::Q8_1;
        case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return ActKind::Q8_K;
        default: fail(strfmt("CUDA: no matrix product for weight type %s", type_name(t)));
    }
}

namespace {
struct ActSections {
    size_t qs, d, s, bsum, total;
};
ActSections act_sections(ActKind k, int64_t K, int64_t T) {
    ActSections a{};
    const size_t n = size_t(K) * size_t(T);
    if (k == ActKind::F32) return a;
    if (k == ActKind::F16 || k == ActKind::BF16) {
        a.total = align16(2 * n);
        return a;
    }
    const size_t bs = k == ActKind::Q8_K ? 256 : 32;
    a.qs = 0;
    a.d = align16(n);
    a.s = align16(a.d + 4 * (n / bs));
    a.bsum = align16(a.s + (k == ActKind::Q8_1 ? 4 * (n / 32) : 0));
    a.total = align16(a.bsum + 2 * (n / 16));
    return a;
}
}  // namespace

size_t act_bytes(ActKind k, int64_t K, int64_t T) { return act_sections(k, K, T).total; }

ActQ act_view(ActKind k, const void* buf, const float* x, int64_t K, int64_t T) {
    ActQ a;
    a.K = K;
    const ActSections sec = act_sections(k, K, T);
    const uint8_t* b = static_cast<const uint8_t*>(buf);
    switch (k) {
        case ActKind::F32: a.f32 = x; break;
        case ActKind::F16: case ActKind::BF16: a.half = buf; break;
        default:
            a.qs = reinterpret_cast<const int8_t*>(b + sec.qs);
            a.d = reinterpret_cast<const float*>(b + sec.d);
            a.s = reinterpret_cast<const float*>(b + sec.s);
            a.bsum = reinterpret_cast<const int16_t*>(b + sec.bsum);
    }
    return a;
}

namespace {

// One warp per 32-element block (Q8_0 / Q8_1): lane = element.
template <bool WITH_SUM>
__global__ void quantize_q8_0_kernel(const float* __restrict__ x, int64_t ldx, int64_t K, int64_t n_blocks,
                                     int8_t* qs, float* d_out, float* s_out, int16_t* bsum) {
    pdl_enter();
    const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (blk >= n_blocks) return;
    const int64_t per_row = K / 32;
    const int64_t t = blk / per_row, j = blk % per_row;
    const float v = x[t * ldx + j * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    const int q = __float2int_rn(v * id);  // nearest, ties to even: the CPU backend's activation quantizer
    qs[t * K + j * 32 + lane] = int8_t(q);
    // sums over 16 elements (lanes 0-15, 16-31)
    int s16 = q;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s16 += __shfl_xor_sync(0xffffffffu, s16, o);
    if (lane == 0 || lane == 16) bsum[(t * K + j * 32 + lane) / 16] = int16_t(s16);
    if (lane == 0) {
        // d is used as stored in the block: rounded to f16.
        d_out[blk] = __half2float(__float2half_rn(d));
    }
    if (WITH_SUM) {
        const int s32 = warp_sum_int(q);
        if (lane == 0) s_out[blk] = __half2float(__float2half_rn(float(s32) * d));
    }
}

// One warp per 256-element block (Q8_K): lane holds 8 consecutive elements
// (the layout of act_quant.cuh, which the fused producers in ops.cu share).
__global__ void quantize_q8_K_kernel(const float* __restrict__ x, int64_t ldx, int64_t K, int64_t n_blocks,
                                     int8_t* qs, float* d_out, int16_t* bsum) {
    pdl_enter();
    const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (blk >= n_blocks) return;
    const int64_t per_row = K / 256;
    const int64_t t = blk / per_row, j = blk % per_row;
    const float* src = x + t * ldx + j * 256 + lane * 8;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = src[i];
    q8K_from_regs(v, lane, true, qs + t * K + j * 256, d_out + blk, bsum + (t * K + j * 256) / 16);
}

__global__ void to_half_kernel(const float* __restrict__ x, int64_t ldx, int64_t K, int64_t n, bool bf16,
                               uint16_t* out) {
    pdl_enter();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t t = i / K, k = i % K;
    const float v = x[t * ldx + k];
    out[i] = bf16 ? f2bf(v) : f2h(v);
}

}  // namespace

void quantize_act(ActKind k, const float* x, int64_t ldx, int64_t K, int64_t T, void* buf, cudaStream_t s) {
    if (k == ActKind::F32 || T == 0) return;
    if (k == ActKind::F16 || k == ActKind::BF16) {
        convert_rows(x, ldx, K, T, k == ActKind::F16 ? GgmlType::F16 : GgmlType::BF16, buf, s);
        return;
    }
    const ActSections sec = act_sections(k, K, T);
    uint8_t* b = static_cast<uint8_t*>(buf);
    int8_t* qs = reinterpret_cast<int8_t*>(b + sec.qs);
    float* d = reinterpret_cast<float*>(b + sec.d);
    float* sm = reinterpret_cast<float*>(b + sec.s);
    int16_t* bsum = reinterpret_cast<int16_t*>(b + sec.bsum);
    const int warps = 8;
    if (k == ActKind::Q8_K) {
        const int64_t nb = T * (K / 256);
        launch("quantize_q8_K_kernel", quantize_q8_K_kernel, dim3(ceil_div(nb, warps)), dim3(warps * WARP), 0, s, x,
                ldx, K, nb, qs, d, bsum);
    } else {
        const int64_t nb = T * (K / 32);
        if (k == ActKind::Q8_1)
            launch("quantize_q8_0_kernel", quantize_q8_0_kernel<true>, dim3(ceil_div(nb, warps)), dim3(warps * WARP),
                    0, s, x, ldx, K, nb, qs, d, sm, bsum);
        else
            launch("quantize_q8_0_kernel", quantize_q8_0_kernel<false>, dim3(ceil_div(nb, warps)), dim3(warps * WARP),
                    0, s, x, ldx, K, nb, qs, d, sm, bsum);
    }
    QINFER_CUDA_LAUNCHED("quantize_act");
}

void convert_rows(const float* x, int64_t ldx, int64_t K, int64_t T, GgmlType to, void* out, cudaStream_t s) {
    const int64_t n = K * T;
    if (n == 0) return;
    launch("to_half_kernel", to_half_kernel, dim3(ceil_div(n, 256)), dim3(256), 0, s, x, ldx, K, n,
            to == GgmlType::BF16, static_cast<uint16_t*>(out));
    QINFER_CUDA_LAUNCHED("convert_rows");
}

}  // namespace qinfer::cuda
