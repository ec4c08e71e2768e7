// Small device helpers shared by the CUDA kernels: error checks, warp
// reductions, half/bfloat conversions and 16-byte loads.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

constexpr int WARP = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide sum for blockDim.x a multiple of 32 (<= 1024). `red` holds 32 floats.
// Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_sum(v);
    __syncthreads();  // red may still be read by a previous call
    if (lane == 0) red[wid] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    return warp_max(v);
}

// The largest |value| of a 32-value block held as 8 values by each of 4
// consecutive lanes (lanes 4j .. 4j + 3); every lane of the warp must call.
__device__ __forceinline__ float block32_amax(const float (&v)[8]) {
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    return fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
}
// A GGUF q8_0 block as the CPU's quantize_row writes it (quantize_ref_q8_0):
// d = amax / 127, q = round(x / d) through the reciprocal, ties away from zero
// (the activation quantizers round ties to even instead: act_quant.cuh).
__device__ __forceinline__ float q8_0_reciprocal(float d) { return d != 0.f ? 1.0f / d : 0.0f; }
__device__ __forceinline__ unsigned char q8_0_ref_quant(float x, float id) {
    return static_cast<unsigned char>(static_cast<int8_t>(roundf(x * id)));
}

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
// Round to nearest even (matches fp32_to_fp16 / fp32_to_bf16 of common/fp16.h).
__device__ __forceinline__ uint16_t f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ uint16_t f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 64);
    return uint16_t((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

// Row i of a Rows view (rows = n1 * n2, strides s1 / s2).
__device__ __forceinline__ float* row_ptr(const Rows& r, int64_t i) {
    return r.data + (i % r.n1) * r.s1 + (i / r.n1) * r.s2;
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }
// The RMS norm's factor for a row of n values whose squares sum to sum_sq, and
// the gated norm's output (spec: y = norm(x) * w * silu(z)); every kernel that
// normalises goes through these, so the fused forms round as the plain ones.
__device__ __forceinline__ float rms_scale(float sum_sq, int64_t n, float eps) {
    return 1.f / sqrtf(sum_sq / float(n) + eps);
}
__device__ __forceinline__ float rms_gated(float x, float scale, float w, float z) { return (x * scale) * w * silu(z); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
// Gates of a lane's 8 values: y = f(v, b) from column col of op row `row`, v
// holding the first operand's values; written to y and kept in v. Shared by
// gate_quant_kernel and the attention merge's quantization (qwen35's output
// gate), so both round alike. Every load comes before the first store, which
// may alias them (swiglu runs in place).
struct SwigluGate {
    __device__ float operator()(float a, float b) const { return silu(a) * b; }
};
struct SigmoidGate {
    __device__ float operator()(float a, float b) const { return a * sigmoid(b); }
};
template <class F>
__device__ __forceinline__ void gate8(float (&v)[8], const Rows& b, const Rows& y, int64_t row, int64_t col, F f) {
    const float* br = row_ptr(b, row) + col;
    float bv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) bv[i] = br[i];
    float* yr = row_ptr(y, row) + col;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[i] = f(v[i], bv[i]);
        yr[i] = v[i];
    }
}
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// 16-byte read-only load (the address must be 16-byte aligned).
__device__ __forceinline__ int4 ld16(const void* p) { return __ldg(reinterpret_cast<const int4*>(p)); }
// Loads that bypass L1 allocation for data read exactly once (weights).
__device__ __forceinline__ int4 ld16_stream(const void* p) {
    return __ldcs(reinterpret_cast<const int4*>(p));
}

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

inline int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// Eight values of a KV cache row (its elements k0 .. k0 + 7; type 0 f32, 1
// f16, 2 q8_0) as kv_store (attention.cu) and the fused norm + rope + store
// (ops.cu) write them. q8_0: the 32-value block is lanes 4j .. 4j + 3 (every
// lane takes part in the shuffles), quantized as quantize_row does.
// store_cache8's type for a cache tensor type; -1 for one it does not write.
inline int kv_cache_code(GgmlType t) {
    return t == GgmlType::F32 ? 0 : t == GgmlType::F16 ? 1 : t == GgmlType::Q8_0 ? 2 : -1;
}
__device__ __forceinline__ void store_cache8(unsigned char* cache, int type, int64_t row, int64_t d, int64_t k0,
                                             const float (&v)[8], bool write) {
    const float amax = block32_amax(v);
    if (!write) return;
    if (type == 0) {
        float* p = reinterpret_cast<float*>(cache) + row * d + k0;
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else if (type == 1) {
        auto pair = [](float lo, float hi) {
            return unsigned(__half_as_ushort(__float2half_rn(lo))) | unsigned(__half_as_ushort(__float2half_rn(hi))) << 16;
        };
        *reinterpret_cast<uint4*>(reinterpret_cast<__half*>(cache) + row * d + k0) =
            make_uint4(pair(v[0], v[1]), pair(v[2], v[3]), pair(v[4], v[5]), pair(v[6], v[7]));
    } else {
        const float dq = amax / 127, id = q8_0_reciprocal(dq);
        unsigned char* block = cache + row * (d / 32) * 34 + (k0 / 32) * 34;
        if (k0 % 32 == 0) *reinterpret_cast<__half*>(block) = __float2half_rn(dq);
        unsigned short* qs = reinterpret_cast<unsigned short*>(block + 2 + k0 % 32);  // 2-byte aligned
#pragma unroll
        for (int i = 0; i < 4; ++i)
            qs[i] = static_cast<unsigned short>(q8_0_ref_quant(v[2 * i], id) | q8_0_ref_quant(v[2 * i + 1], id) << 8);
    }
}

}  // namespace qinfer::cuda
