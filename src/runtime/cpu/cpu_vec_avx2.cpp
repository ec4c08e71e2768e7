// AVX2 + FMA + F16C versions of cpu_vec.h (this file is compiled with those
// flags and only called when the CPU has them).
#include "runtime/cpu/cpu_vec.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

#include "common/fp16.h"

namespace qinfer::cpu {

namespace {
inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
inline __m256 load_h(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

float dot(const float* a, const float* b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float r = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; ++i) r += a[i] * b[i];
    return r;
}

float dot_f16(const uint16_t* a, const float* b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(load_h(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(load_h(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_h(a + i), _mm256_loadu_ps(b + i), s0);
    float r = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; ++i) r += fp16_to_fp32(a[i]) * b[i];
    return r;
}

void axpy(float w, const float* x, float* y, int64_t n) {
    const __m256 wv = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += w * x[i];
}

void axpy_f16(float w, const uint16_t* x, float* y, int64_t n) {
    const __m256 wv = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, load_h(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += w * fp16_to_fp32(x[i]);
}

void to_f16(const float* x, uint16_t* y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

float scale_dot(float* s, float alpha, const float* k, int64_t n) {
    const __m256 av = _mm256_set1_ps(alpha);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + i), av);
        _mm256_storeu_ps(s + i, v);
        acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(k + i), acc);
    }
    float r = hsum(acc);
    for (; i < n; ++i) r += (s[i] *= alpha) * k[i];
    return r;
}

float axpy_dot(float* s, float delta, const float* k, const float* q, int64_t n) {
    const __m256 dv = _mm256_set1_ps(delta);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_fmadd_ps(dv, _mm256_loadu_ps(k + i), _mm256_loadu_ps(s + i));
        _mm256_storeu_ps(s + i, v);
        acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(q + i), acc);
    }
    float r = hsum(acc);
    for (; i < n; ++i) r += (s[i] += delta * k[i]) * q[i];
    return r;
}
}  // namespace

const VecOps* vec_avx2() {
    static const VecOps ops{dot, dot_f16, axpy, axpy_f16, to_f16, scale_dot, axpy_dot, "avx2"};
    return &ops;
}

}  // namespace qinfer::cpu

#else

namespace qinfer::cpu {
const VecOps* vec_avx2() { return nullptr; }
}  // namespace qinfer::cpu

#endif
