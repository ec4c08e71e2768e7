// Per-type reference quantizers (ggml's quantize_row_*_ref), used by
// quantize_row() and by the CPU kernels to quantize activations.
// n is a multiple of the type's block size; no checks here.
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/blocks.h"

namespace qinfer {

void quantize_ref_q4_0(const float* x, block_q4_0* y, int64_t n);
void quantize_ref_q4_1(const float* x, block_q4_1* y, int64_t n);
void quantize_ref_q5_0(const float* x, block_q5_0* y, int64_t n);
void quantize_ref_q5_1(const float* x, block_q5_1* y, int64_t n);
void quantize_ref_q8_0(const float* x, block_q8_0* y, int64_t n);
void quantize_ref_q8_1(const float* x, block_q8_1* y, int64_t n);
void quantize_ref_q2_K(const float* x, block_q2_K* y, int64_t n);
void quantize_ref_q3_K(const float* x, block_q3_K* y, int64_t n);
void quantize_ref_q4_K(const float* x, block_q4_K* y, int64_t n);
void quantize_ref_q5_K(const float* x, block_q5_K* y, int64_t n);
void quantize_ref_q6_K(const float* x, block_q6_K* y, int64_t n);
void quantize_ref_q8_K(const float* x, block_q8_K* y, int64_t n);

// Round to nearest, ties to even, for |x| <= 2^22 (ggml's nearest_int).
inline int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int32_t i;
    std::memcpy(&i, &val, 4);
    return (i & 0x007fffff) - 0x00400000;
}

}  // namespace qinfer
