// Activation quantization of values a warp holds in registers: lane l holds 8
// consecutive elements [8l, 8l + 8) of a 256-element span. quantize.cu quantizes
// rows it loads this way; the fused producers in ops.cu (RMSNorm, SwiGLU,
// sigmoid gate -> quantized activations) quantize their results straight from
// registers with the same functions, so fused and unfused activations are
// bit-identical. Same rounding as the CPU backend (see quantize.cu).
#pragma once
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

// One Q8_K block (256 elements) per warp. qs: the block's 256 quants, d: its
// scale, bsum: its 16 sums of 16. Every lane must call (shuffles); `store`
// false computes without writing (a warp past the end of the row).
__device__ __forceinline__ void q8K_from_regs(const float (&v)[8], int lane, bool store, int8_t* qs, float* d_out,
                                              int16_t* bsum) {
    // The first element of largest magnitude (ggml keeps the first on ties).
    float amax = 0.f;
    int idx = 0x7fffffff;
    float vmax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float a = fabsf(v[i]);
        if (a > amax) { amax = a; idx = lane * 8 + i; vmax = v[i]; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        const float ov = __shfl_xor_sync(0xffffffffu, vmax, o);
        if (oa > amax || (oa == amax && oi < idx)) { amax = oa; idx = oi; vmax = ov; }
    }
    int8_t* q = qs + lane * 8;
    int sum = 0;
    if (amax == 0.f) {
        if (store) {
#pragma unroll
            for (int i = 0; i < 8; ++i) q[i] = 0;
        }
    } else {
        const float iscale = -127.f / vmax;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int qi = min(127, __float2int_rn(iscale * v[i]));  // nearest, ties to even
            if (store) q[i] = int8_t(qi);
            sum += qi;
        }
    }
    // 16-element sums: lanes (2m, 2m+1) hold group m.
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (!store) return;
    if ((lane & 1) == 0) bsum[lane / 2] = int16_t(sum);
    if (lane == 0) *d_out = amax == 0.f ? 0.f : 1.f / (-127.f / vmax);
}

// Q8_0 / Q8_1 blocks (32 elements) from the same layout: lanes 4m..4m+3 hold
// block m of the span. qs, d, s, bsum point at the span's first element / block
// / 16-group. `valid`: this lane's 8 elements exist (a row's length is a
// multiple of 32, so a block is wholly valid or not). Every lane must call.
template <bool WITH_SUM>
__device__ __forceinline__ void q8_0_from_regs(const float (&v)[8], int lane, bool valid, int8_t* qs, float* d_out,
                                               float* s_out, int16_t* bsum) {
    const float amax = block32_amax(v);
    const float d = amax / 127;
    const float id = q8_0_reciprocal(d);
    int sum = 0;
    int8_t* q = qs + lane * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int qi = __float2int_rn(v[i] * id);  // nearest, ties to even
        if (valid) q[i] = int8_t(qi);
        sum += qi;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // 16-element sums
    const int s32 = sum + __shfl_xor_sync(0xffffffffu, sum, 2);
    if (!valid) return;
    if ((lane & 1) == 0) bsum[lane / 2] = int16_t(sum);
    if ((lane & 3) == 0) {
        const int m = lane / 4;
        d_out[m] = __half2float(__float2half_rn(d));  // d is used as stored in the block: rounded to f16
        if (WITH_SUM) s_out[m] = __half2float(__float2half_rn(float(s32) * d));
    }
}

// Where quantized activations go: the sections of an ActQ buffer, writable.
struct ActOutPtrs {
    int8_t* qs;
    float* d;
    float* s;
    int16_t* bsum;
};

// The sections of the activation buffer a quantization writes.
inline ActOutPtrs act_out(const ActDest& q) {
    const ActQ v = act_view(q.kind, q.buf, q.x, q.K, q.T);
    return ActOutPtrs{const_cast<int8_t*>(v.qs), const_cast<float*>(v.d), const_cast<float*>(v.s),
                      const_cast<int16_t*>(v.bsum)};
}

// The quantize_span kind of an activation format: 1 Q8_0, 2 Q8_1, 3 Q8_K, 0 none.
inline int qk_of(ActKind k) {
    switch (k) {
        case ActKind::Q8_0: return 1;
        case ActKind::Q8_1: return 2;
        case ActKind::Q8_K: return 3;
        default: return 0;
    }
}

// Quantizes the 256-element span of token row t starting at element k0 (a
// multiple of 256) of a K-element row, from a warp's registers. Elements at or
// past K must be passed as 0 (K is a multiple of the block size).
template <int QK>  // 1: Q8_0, 2: Q8_1, 3: Q8_K
__device__ __forceinline__ void quantize_span(const float (&v)[8], int lane, const ActOutPtrs& o, int64_t t,
                                              int64_t K, int64_t k0, bool live) {
    const int64_t e = t * K + k0;  // the span's first element in the buffer
    if (QK == 3) {
        q8K_from_regs(v, lane, live && k0 < K, o.qs + e, o.d + e / 256, o.bsum + e / 16);
    } else {
        const bool valid = live && k0 + 8 * lane < K;
        q8_0_from_regs<QK == 2>(v, lane, valid, o.qs + e, o.d + e / 32, o.s + e / 32, o.bsum + e / 16);
    }
}

}  // namespace qinfer::cuda
