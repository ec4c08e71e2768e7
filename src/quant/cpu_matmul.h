// CPU matrix products on quantized weights (the hot path of the CPU backend).
// Activations are quantized to 8 bits per block first (Q8_0 or Q8_K, as fast CPU
// engines do), then integer dot products run in SIMD kernels picked at run time
// (AVX-512/VNNI, AVX2, portable fallback).
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace qinfer {

class ThreadPool;

// y[t][o] = sum_k W[o][k] * x[t][k]  for t < T, o < N.
// W: N rows of K elements of type wt (row stride = row_bytes(wt, K)); x: T x K f32
// (row stride K); y: T x N f32 (row stride ldy, >= N). T == 1 is the decode path
// (matrix-vector); T > 1 uses a blocked matrix-matrix kernel.
void cpu_matmul(GgmlType wt, const void* W, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                int64_t ldy, ThreadPool& pool);

// Throws the error cpu_matmul would throw for this weight type and shape, if any
// (callers that defer a product check it when it is issued).
void cpu_matmul_check(GgmlType wt, int64_t K, int64_t N, int64_t ldy);

// One weight matrix of a group that shares its input (e.g. the q, k and v
// projections of one hidden state): N rows of K elements, output y (ldy >= N).
struct MatmulJob {
    GgmlType wt;
    const void* W;
    int64_t N;
    float* y;
    int64_t ldy;
};

// cpu_matmul for several weights on the same x (T x K) in one parallel region:
// the activations are quantized once and the threads are forked and joined
// once for the whole group. Outputs must not overlap x or each other.
void cpu_matmul_group(const MatmulJob* jobs, size_t n_jobs, int64_t K, const float* x, int64_t T,
                      ThreadPool& pool);

// Which SIMD level the kernels picked on this CPU ("avx512vnni", "avx2", "scalar").
const char* cpu_kernel_isa();

}  // namespace qinfer
