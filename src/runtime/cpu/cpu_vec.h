// Vector inner loops of the CPU attention, DeltaNet and activation ops, with an
// AVX2/F16C version picked once at run time (same ISA decision as
// quant/cpu_matmul, so QINFER_CPU_ISA=scalar lowers both). Summation order and
// the exp approximation are fixed per CPU, so the thread count never changes
// results; the scalar and AVX2 versions differ in the last bits.
#pragma once
#include <cstdint>

namespace qinfer::cpu {

struct VecOps {
    float (*dot)(const float* a, const float* b, int64_t n);
    void (*axpy)(float w, const float* x, float* y, int64_t n);           // y += w x
    void (*to_f16)(const float* x, uint16_t* y, int64_t n);
    void (*to_f32)(const uint16_t* x, float* y, int64_t n);
    // A row of GGUF Q8_0 blocks (n values) to floats and back, as
    // dequantize_row / quantize_row do it, bit for bit (a q8_0 cache's rows).
    void (*q8_0_to_f32)(const void* x, float* y, int64_t n);
    void (*to_q8_0)(const float* x, void* y, int64_t n);
    // s[i * s_stride + j] = scale * dot(k_j, q[i]), k_j = k + j * k_stride,
    // for i < m, j < nk, each bit-identical to dot: a prompt tile's scores
    // against a tile of cached keys, each key row loaded once for several rows.
    void (*dot_tile)(const float* const* q, int64_t m, const float* k, int64_t k_stride, int64_t nk, int64_t n,
                     float scale, float* s, int64_t s_stride);
    // acc[h] += sum_j w[h * w_stride + j] v_j for rows v_j = v + j * v_stride,
    // each element's sum bit-identical to axpy per head and row (j ascending),
    // with the accumulators held in registers over the rows.
    void (*axpy_rows_heads)(const float* w, int64_t w_stride, const float* v, int64_t v_stride, int64_t rows,
                            float* const* acc, int64_t heads, int64_t n);
    void (*axpy_rows_heads_f16)(const float* w, int64_t w_stride, const uint16_t* v, int64_t v_stride, int64_t rows,
                                float* const* acc, int64_t heads, int64_t n);
    // Rows of Q8_0 blocks v_stride bytes apart, each value as q8_0_to_f32 gives it.
    void (*axpy_rows_heads_q8_0)(const float* w, int64_t w_stride, const void* v, int64_t v_stride, int64_t rows,
                                 float* const* acc, int64_t heads, int64_t n);
    // One token of the gated delta rule on one head's state S (rows x n, row r
    // the state of value channel r), in the definition's order per row:
    //   S_r *= alpha;  delta = beta (v_r - S_r . k);  S_r += delta k;
    //   out_r = scale (S_r . q)
    void (*delta_step)(float* S, int64_t rows, int64_t n, float alpha, float beta, const float* k, const float* q,
                       const float* v, float scale, float* out);
    // Activations (cpu_kernels.h's formulas, exp vectorised): y = silu(x);
    // y = silu(g) u; y = x sigmoid(g). y may alias the inputs.
    void (*silu)(const float* x, float* y, int64_t n);
    void (*silu_mul)(const float* g, const float* u, float* y, int64_t n);
    void (*sigmoid_mul)(const float* x, const float* g, float* y, int64_t n);
    // sum of x_i^2 in double (the norms' spec; order differs per ISA).
    double (*sum_squares)(const float* x, int64_t n);
    // x_j = exp(x_j - m), returns their sum (a softmax's numerators).
    float (*exp_sub_sum)(float* x, int64_t n, float m);
    const char* name;
};

const VecOps& vec();

// Implementations (cpu_vec.cpp, cpu_vec_avx2.cpp).
const VecOps& vec_scalar();
const VecOps* vec_avx2();  // nullptr when not compiled in

}  // namespace qinfer::cpu
