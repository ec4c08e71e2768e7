// The CUDA backend's sizing rules that decide its scratch memory, in one place
// for the backend and the memory planner (src/plan), which must count the same
// bytes. Plain constants: included by host code that is built without CUDA too.
#pragma once
#include <cstdint>

namespace qinfer::cuda {

// Prompt products: steps of at least kF16MinTokens tokens dequantize a
// quantized weight of at least kF16MinRows rows to f16 for cuBLAS, through a
// scratch of at most kF16WeightChunkBytes (larger weights go in row chunks),
// and copy the [K, T] input to f16. 32 rows take DeltaNet's alpha / beta
// (2560 x 32) there too: 47 us per call on the int8 kernels at T = 512 on an
// H200, ~1.1 ms per 512-token step (bench/results/cuda-h200.md).
constexpr int64_t kF16MinTokens = 128;
constexpr int64_t kF16MinRows = 32;
constexpr int64_t kF16WeightChunkBytes = int64_t(64) << 20;

// Decode attention splits the key range into one split per kAttnSplitAlign
// positions of the cache capacity, at most kAttnMaxSplits (the launch may take
// fewer: one wave of resident blocks); each leaves (head_dim + kAttnPartHeader)
// floats per head and token, sized here for the maximum.
constexpr int kAttnSplitAlign = 64;
constexpr int kAttnMaxSplits = 128;
constexpr int kAttnPartHeader = 4;
// Steps of up to this many tokens, none with more than kAttnSplitMaxSegment of
// one sequence, take the split kernel (decode steps).
constexpr int kAttnSplitMaxTokens = 64;
constexpr int kAttnSplitMaxSegment = 4;

}  // namespace qinfer::cuda
