#include "runtime/cpu/cpu_vec.h"

#include <cstring>

#include "common/fp16.h"
#include "quant/cpu_matmul.h"

namespace qinfer::cpu {

namespace {
// Eight partial sums, so the scalar and SIMD versions add in a similar order.
template <class Load>
float dot8(const Load& a, const float* b, int64_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) s[j] += a(i + j) * b[i + j];
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; ++i) r += a(i) * b[i];
    return r;
}

float dot(const float* a, const float* b, int64_t n) {
    return dot8([a](int64_t i) { return a[i]; }, b, n);
}
float dot_f16(const uint16_t* a, const float* b, int64_t n) {
    return dot8([a](int64_t i) { return fp16_to_fp32(a[i]); }, b, n);
}
void axpy(float w, const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += w * x[i];
}
void axpy_f16(float w, const uint16_t* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += w * fp16_to_fp32(x[i]);
}
void to_f16(const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}
float scale_dot(float* s, float alpha, const float* k, int64_t n) {
    for (int64_t i = 0; i < n; ++i) s[i] *= alpha;
    return dot(s, k, n);
}
float axpy_dot(float* s, float delta, const float* k, const float* q, int64_t n) {
    for (int64_t i = 0; i < n; ++i) s[i] += delta * k[i];
    return dot(s, q, n);
}
}  // namespace

const VecOps& vec_scalar() {
    static const VecOps ops{dot, dot_f16, axpy, axpy_f16, to_f16, scale_dot, axpy_dot, "scalar"};
    return ops;
}

const VecOps& vec() {
    static const VecOps& ops = [] () -> const VecOps& {
        const VecOps* avx2 = vec_avx2();
        if (avx2 && std::strcmp(cpu_kernel_isa(), "scalar") != 0) return *avx2;
        return vec_scalar();
    }();
    return ops;
}

}  // namespace qinfer::cpu
