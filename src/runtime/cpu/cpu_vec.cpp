#include "runtime/cpu/cpu_vec.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/fp16.h"
#include "quant/cpu_matmul.h"
#include "quant/quant.h"
#include "runtime/cpu/cpu_kernels.h"

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
void axpy(float w, const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += w * x[i];
}
void to_f16(const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}
void to_f32(const uint16_t* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}
void q8_0_to_f32(const void* x, float* y, int64_t n) { dequantize_row(GgmlType::Q8_0, x, y, n); }
void to_q8_0(const float* x, void* y, int64_t n) { quantize_row(GgmlType::Q8_0, x, y, n); }
void dot_tile(const float* const* q, int64_t m, const float* k, int64_t ks, int64_t nk, int64_t n, float scale,
              float* s, int64_t ss) {
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < nk; ++j) s[i * ss + j] = scale * dot(k + j * ks, q[i], n);
}
void axpy_rows_heads(const float* w, int64_t ws, const float* v, int64_t vs, int64_t rows, float* const* acc,
                     int64_t heads, int64_t n) {
    for (int64_t j = 0; j < rows; ++j)
        for (int64_t h = 0; h < heads; ++h) axpy(w[h * ws + j], v + j * vs, acc[h], n);
}
void axpy_rows_heads_f16(const float* w, int64_t ws, const uint16_t* v, int64_t vs, int64_t rows, float* const* acc,
                         int64_t heads, int64_t n) {
    for (int64_t j = 0; j < rows; ++j)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < n; ++i) acc[h][i] += w[h * ws + j] * fp16_to_fp32(v[j * vs + i]);
}
void axpy_rows_heads_q8_0(const float* w, int64_t ws, const void* v, int64_t vs, int64_t rows, float* const* acc,
                          int64_t heads, int64_t n) {
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t j = 0; j < rows; ++j) {
        q8_0_to_f32(static_cast<const uint8_t*>(v) + j * vs, row.data(), n);
        for (int64_t h = 0; h < heads; ++h) axpy(w[h * ws + j], row.data(), acc[h], n);
    }
}
void delta_step(float* S, int64_t rows, int64_t n, float alpha, float beta, const float* k, const float* q,
                const float* v, float scale, float* out) {
    for (int64_t r = 0; r < rows; ++r) {
        float* s = S + r * n;
        for (int64_t i = 0; i < n; ++i) s[i] *= alpha;
        const float delta = beta * (v[r] - dot(s, k, n));
        for (int64_t i = 0; i < n; ++i) s[i] += delta * k[i];
        out[r] = dot(s, q, n) * scale;
    }
}
void silu(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = cpu::silu(x[i]);
}
void silu_mul(const float* g, const float* u, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = cpu::silu(g[i]) * u[i];
}
void sigmoid_mul(const float* x, const float* g, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * cpu::sigmoid(g[i]);
}
double sum_squares(const float* x, int64_t n) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
    return ss;
}
float exp_sub_sum(float* x, int64_t n, float m) {
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - m));
    return sum;
}
}  // namespace

const VecOps& vec_scalar() {
    static const VecOps ops{dot, axpy, to_f16, to_f32, q8_0_to_f32, to_q8_0, dot_tile,
                            axpy_rows_heads, axpy_rows_heads_f16, axpy_rows_heads_q8_0, delta_step, silu, silu_mul, sigmoid_mul,
                            sum_squares, exp_sub_sum, "scalar"};
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
