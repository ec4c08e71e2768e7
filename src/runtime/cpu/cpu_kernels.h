// Small inner loops shared by the CPU ops (the matmul kernels live in quant/).
#pragma once
#include <cmath>
#include <cstdint>


namespace qinfer {
namespace cpu {

inline float dot(const float* a, const float* b, int64_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; ++i) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float silu(float x) { return x / (1.f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

}  // namespace cpu
}  // namespace qinfer
