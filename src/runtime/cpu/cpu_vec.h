// Vector inner loops of the CPU attention and DeltaNet ops, with an AVX2/F16C
// version picked once at run time (same ISA decision as quant/cpu_matmul, so
// QINFER_CPU_ISA=scalar lowers both). Summation order is fixed per CPU, so the
// thread count never changes results.
#pragma once
#include <cstdint>

namespace qinfer::cpu {

struct VecOps {
    float (*dot)(const float* a, const float* b, int64_t n);
    float (*dot_f16)(const uint16_t* a, const float* b, int64_t n);      // a: IEEE half
    void (*axpy)(float w, const float* x, float* y, int64_t n);           // y += w x
    void (*axpy_f16)(float w, const uint16_t* x, float* y, int64_t n);
    void (*to_f16)(const float* x, uint16_t* y, int64_t n);
    // DeltaNet row update: s *= alpha, returns s . k
    float (*scale_dot)(float* s, float alpha, const float* k, int64_t n);
    // s += delta k, returns s . q
    float (*axpy_dot)(float* s, float delta, const float* k, const float* q, int64_t n);
    const char* name;
};

const VecOps& vec();

// Implementations (cpu_vec.cpp, cpu_vec_avx2.cpp).
const VecOps& vec_scalar();
const VecOps* vec_avx2();  // nullptr when not compiled in

}  // namespace qinfer::cpu
