// Quantized tensor types: reference (scalar) dequantization and quantization.
// Block layouts are defined once in quant/blocks.h and shared with the CPU
// kernels (quant/cpu_*.cpp) and the CUDA kernels (runtime/cuda).
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace qinfer {

// Whether dequantize_row / quantize_row handle type t.
bool can_dequantize(GgmlType t);
bool can_quantize(GgmlType t);

// Dequantizes n elements (a multiple of the block size) of type t to f32.
// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, Q8_K. Throws Error otherwise.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// Reference quantization of n elements (multiple of the block size) into dst
// (row_bytes(t, n) bytes). Returns bytes written. Throws Error for unsupported types.
// Byte-identical to ggml's quantize_row_*_ref (what llama-quantize does without an
// importance matrix). Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1,
// Q2_K..Q6_K, Q8_K.
size_t quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace qinfer
