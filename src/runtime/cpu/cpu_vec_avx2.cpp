// AVX2 + FMA + F16C versions of cpu_vec.h (this file is compiled with those
// flags and only called when the CPU has them).
#include "runtime/cpu/cpu_vec.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

#include <cmath>

#include "common/fp16.h"
#include "quant/blocks.h"
#include "quant/cpu_kernels.h"

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
    for (; i < n; ++i) r = std::fma(a[i], b[i], r);  // explicit: dot_tile must round alike
    return r;
}

void axpy(float w, const float* x, float* y, int64_t n) {
    const __m256 wv = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] = std::fma(w, x[i], y[i]);
}

void to_f16(const float* x, uint16_t* y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void to_f32(const uint16_t* x, float* y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_h(x + i));
    for (; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

// Per 32-value block: the f16 scale (exact in f32), then float(q) * d, the
// one rounding dequantize_row makes.
void q8_0_to_f32(const void* x, float* y, int64_t n) {
    const block_q8_0* b = static_cast<const block_q8_0*>(x);
    for (int64_t i = 0; i < n / QK8_0; ++i, y += QK8_0) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int j = 0; j < QK8_0; j += 8) {
            const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + j));
            _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
        }
    }
}

// The quant layer's AVX2 quantizer (bit-identical to quantize_row).
void to_q8_0(const float* x, void* y, int64_t n) {
    kernels::avx2_table()->quantize_q8_0(x, static_cast<block_q8_0*>(y), n);
}

// R query rows x C keys, each score summed exactly as dot() sums it (two
// 8-lane accumulators over 16-column steps, then one 8-column step, the
// horizontal sum, the tail): a prompt's scores equal a decode step's. Per 16
// columns, 2C key loads and 2R query loads feed 2RC fmas.
template <int R, int C>
void dot_tile_rc(const float* const* q, const float* k, int64_t ks, int64_t n, float scale, float* s, int64_t ss) {
    __m256 a0[R][C], a1[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) a0[r][c] = a1[r][c] = _mm256_setzero_ps();
    int64_t e = 0;
    for (; e + 16 <= n; e += 16) {
        __m256 k0[C], k1[C];
        for (int c = 0; c < C; ++c) {
            k0[c] = _mm256_loadu_ps(k + c * ks + e);
            k1[c] = _mm256_loadu_ps(k + c * ks + e + 8);
        }
        for (int r = 0; r < R; ++r) {
            const __m256 q0 = _mm256_loadu_ps(q[r] + e), q1 = _mm256_loadu_ps(q[r] + e + 8);
            for (int c = 0; c < C; ++c) {
                a0[r][c] = _mm256_fmadd_ps(k0[c], q0, a0[r][c]);
                a1[r][c] = _mm256_fmadd_ps(k1[c], q1, a1[r][c]);
            }
        }
    }
    if (e + 8 <= n) {
        for (int r = 0; r < R; ++r) {
            const __m256 q0 = _mm256_loadu_ps(q[r] + e);
            for (int c = 0; c < C; ++c) a0[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(k + c * ks + e), q0, a0[r][c]);
        }
        e += 8;
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            float v = hsum(_mm256_add_ps(a0[r][c], a1[r][c]));
            for (int64_t t = e; t < n; ++t) v = std::fma(k[c * ks + t], q[r][t], v);
            s[r * ss + c] = scale * v;
        }
}

template <int R>
void dot_tile_r(const float* const* q, const float* k, int64_t ks, int64_t nk, int64_t n, float scale, float* s,
                int64_t ss) {
    int64_t j = 0;
    for (; j + 3 <= nk; j += 3) dot_tile_rc<R, 3>(q, k + j * ks, ks, n, scale, s + j, ss);
    if (nk - j == 2) dot_tile_rc<R, 2>(q, k + j * ks, ks, n, scale, s + j, ss);
    if (nk - j == 1) dot_tile_rc<R, 1>(q, k + j * ks, ks, n, scale, s + j, ss);
}

void dot_tile(const float* const* q, int64_t m, const float* k, int64_t ks, int64_t nk, int64_t n, float scale,
              float* s, int64_t ss) {
    int64_t i = 0;
    for (; i + 2 <= m; i += 2) dot_tile_r<2>(q + i, k, ks, nk, n, scale, s + i * ss, ss);
    if (i < m) dot_tile_r<1>(q + i, k, ks, nk, n, scale, s + i * ss, ss);
}

// H heads x CB 8-column blocks of the accumulators held in registers while
// the rows go by, each element's chain of fmas in row order as axpy makes it.
template <int H, int CB, class Load>
void axpy_rows_tile(const float* w, int64_t ws, const Load& load, int64_t rows, float* const* acc, int64_t c) {
    __m256 a[H][CB];
    for (int h = 0; h < H; ++h)
        for (int b = 0; b < CB; ++b) a[h][b] = _mm256_loadu_ps(acc[h] + c + 8 * b);
    for (int64_t j = 0; j < rows; ++j) {
        __m256 v[CB];
        for (int b = 0; b < CB; ++b) v[b] = load(j, c + 8 * b);
        for (int h = 0; h < H; ++h) {
            const __m256 wj = _mm256_set1_ps(w[h * ws + j]);
            for (int b = 0; b < CB; ++b) a[h][b] = _mm256_fmadd_ps(wj, v[b], a[h][b]);
        }
    }
    for (int h = 0; h < H; ++h)
        for (int b = 0; b < CB; ++b) _mm256_storeu_ps(acc[h] + c + 8 * b, a[h][b]);
}

template <int H, class Load>
void axpy_rows_n(const float* w, int64_t ws, const Load& load, int64_t rows, float* const* acc, int64_t n) {
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) axpy_rows_tile<H, 2>(w, ws, load, rows, acc, c);
    if (c + 8 <= n) axpy_rows_tile<H, 1>(w, ws, load, rows, acc, c);
}

template <class Load>
void axpy_rows_any(const float* w, int64_t ws, const Load& load, int64_t rows, float* const* acc, int64_t heads,
                   int64_t n) {
    int64_t h = 0;
    for (; h + 4 <= heads; h += 4) axpy_rows_n<4>(w + h * ws, ws, load, rows, acc + h, n);
    switch (heads - h) {
        case 3: axpy_rows_n<3>(w + h * ws, ws, load, rows, acc + h, n); break;
        case 2: axpy_rows_n<2>(w + h * ws, ws, load, rows, acc + h, n); break;
        case 1: axpy_rows_n<1>(w + h * ws, ws, load, rows, acc + h, n); break;
        default: break;
    }
}

void axpy_rows_heads(const float* w, int64_t ws, const float* v, int64_t vs, int64_t rows, float* const* acc,
                     int64_t heads, int64_t n) {
    axpy_rows_any(w, ws, [v, vs](int64_t j, int64_t c) { return _mm256_loadu_ps(v + j * vs + c); }, rows, acc, heads, n);
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = n - n % 8; c < n; ++c)
            for (int64_t j = 0; j < rows; ++j) acc[h][c] = std::fma(w[h * ws + j], v[j * vs + c], acc[h][c]);
}

void axpy_rows_heads_f16(const float* w, int64_t ws, const uint16_t* v, int64_t vs, int64_t rows, float* const* acc,
                         int64_t heads, int64_t n) {
    axpy_rows_any(w, ws, [v, vs](int64_t j, int64_t c) { return load_h(v + j * vs + c); }, rows, acc, heads, n);
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = n - n % 8; c < n; ++c)
            for (int64_t j = 0; j < rows; ++j)
                acc[h][c] = std::fma(w[h * ws + j], fp16_to_fp32(v[j * vs + c]), acc[h][c]);
}

// Q8_0 rows: 8 values of a block at a time, float(q) * d in a register, the
// rounding q8_0_to_f32 makes (the tail of n % 8 values likewise).
void axpy_rows_heads_q8_0(const float* w, int64_t ws, const void* v, int64_t vs, int64_t rows, float* const* acc,
                          int64_t heads, int64_t n) {
    const uint8_t* base = static_cast<const uint8_t*>(v);
    auto block = [base, vs](int64_t j, int64_t c) {
        return reinterpret_cast<const block_q8_0*>(base + j * vs) + c / QK8_0;
    };
    axpy_rows_any(w, ws, [&](int64_t j, int64_t c) {
        const block_q8_0* b = block(j, c);
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + c % QK8_0));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(_cvtsh_ss(b->d)));
    }, rows, acc, heads, n);
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = n - n % 8; c < n; ++c)
            for (int64_t j = 0; j < rows; ++j) {
                const block_q8_0* b = block(j, c);
                acc[h][c] = std::fma(w[h * ws + j], float(b->qs[c % QK8_0]) * _cvtsh_ss(b->d), acc[h][c]);
            }
}

// Rows of the delta rule R at a time, each row's sums as the one-row loop
// makes them (one 8-lane accumulator, then the horizontal sum): the rows'
// dependency chains interleave, the results do not change.
template <int R>
void delta_rows(float* S, int64_t n, float alpha, float beta, const float* k, const float* q, const float* v,
                float scale, float* out) {
    const __m256 av = _mm256_set1_ps(alpha);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 kv = _mm256_loadu_ps(k + i);
        for (int r = 0; r < R; ++r) {
            const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(S + r * n + i), av);
            _mm256_storeu_ps(S + r * n + i, x);
            acc[r] = _mm256_fmadd_ps(x, kv, acc[r]);
        }
    }
    float sum[R], delta[R];
    for (int r = 0; r < R; ++r) sum[r] = hsum(acc[r]);
    for (int64_t j = i; j < n; ++j)
        for (int r = 0; r < R; ++r) sum[r] += (S[r * n + j] *= alpha) * k[j];
    __m256 dv[R];
    for (int r = 0; r < R; ++r) {
        delta[r] = beta * (v[r] - sum[r]);
        dv[r] = _mm256_set1_ps(delta[r]);
        acc[r] = _mm256_setzero_ps();
    }
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 kv = _mm256_loadu_ps(k + i), qv = _mm256_loadu_ps(q + i);
        for (int r = 0; r < R; ++r) {
            const __m256 x = _mm256_fmadd_ps(dv[r], kv, _mm256_loadu_ps(S + r * n + i));
            _mm256_storeu_ps(S + r * n + i, x);
            acc[r] = _mm256_fmadd_ps(x, qv, acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) sum[r] = hsum(acc[r]);
    for (int64_t j = i; j < n; ++j)
        for (int r = 0; r < R; ++r) sum[r] += (S[r * n + j] += delta[r] * k[j]) * q[j];
    for (int r = 0; r < R; ++r) out[r] = sum[r] * scale;
}

void delta_step(float* S, int64_t rows, int64_t n, float alpha, float beta, const float* k, const float* q,
                const float* v, float scale, float* out) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) delta_rows<4>(S + r * n, n, alpha, beta, k, q, v + r, scale, out + r);
    for (; r < rows; ++r) delta_rows<1>(S + r * n, n, alpha, beta, k, q, v + r, scale, out + r);
}

// exp(x) as Cephes' expf: x = m ln2 + f with |f| <= ln2 / 2 (ln2 in two parts),
// exp(f) by its degree-6 polynomial, 2^m through the exponent bits. About one
// ulp. The polynomial sees x clamped to [-87.3, 88] (2^m a normal float);
// beyond ln(FLT_MAX) the result is inf and below -87.3 zero, as expf's
// overflow and (flushed) underflow. A NaN passes through: it is the second
// operand of min / max, and both fix-up compares are false for it.
inline __m256 exp8(__m256 x) {
    const __m256 xc = _mm256_max_ps(_mm256_set1_ps(-87.3f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
    const __m256 m = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(m, _mm256_set1_ps(0.693359375f), xc);
    f = _mm256_fnmadd_ps(m, _mm256_set1_ps(-2.12194440e-4f), f);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(f, f), f), _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(m), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(88.7228391f), _CMP_GT_OQ));
    return _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ));
}

inline __m256 silu8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.f);
    return _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

inline __m256 sigmoid8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.f);
    return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

// y[0..n) = f(a[i], b[i]) 8 lanes at a time; the last n % 8 go through a
// zero-padded copy, so every element sees the same approximation.
template <class F>
void map8(const float* a, const float* b, float* y, int64_t n, const F& f) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    if (i == n) return;
    float ta[8] = {}, tb[8] = {}, ty[8];  // unaligned accesses: MinGW does not align the stack to 32
    for (int64_t j = i; j < n; ++j) {
        ta[j - i] = a[j];
        tb[j - i] = b[j];
    }
    _mm256_storeu_ps(ty, f(_mm256_loadu_ps(ta), _mm256_loadu_ps(tb)));
    for (int64_t j = i; j < n; ++j) y[j] = ty[j - i];
}

void silu(const float* x, float* y, int64_t n) {
    map8(x, x, y, n, [](__m256 a, __m256) { return silu8(a); });
}
void silu_mul(const float* g, const float* u, float* y, int64_t n) {
    map8(g, u, y, n, [](__m256 a, __m256 b) { return _mm256_mul_ps(silu8(a), b); });
}
void sigmoid_mul(const float* x, const float* g, float* y, int64_t n) {
    map8(x, g, y, n, [](__m256 a, __m256 b) { return _mm256_mul_ps(a, sigmoid8(b)); });
}

double sum_squares(const float* x, int64_t n) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        s0 = _mm256_fmadd_pd(a, a, s0);  // float squares are exact in double
        s1 = _mm256_fmadd_pd(b, b, s1);
    }
    s0 = _mm256_add_pd(s0, s1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s0), _mm256_extractf128_pd(s0, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; ++i) ss += double(x[i]) * double(x[i]);
    return ss;
}

float exp_sub_sum(float* x, int64_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum(acc);
    if (i < n) {
        float t[8] = {}, e[8];
        for (int64_t j = i; j < n; ++j) t[j - i] = x[j];
        _mm256_storeu_ps(e, exp8(_mm256_sub_ps(_mm256_loadu_ps(t), mv)));
        for (int64_t j = i; j < n; ++j) sum += (x[j] = e[j - i]);
    }
    return sum;
}
}  // namespace

const VecOps* vec_avx2() {
    static const VecOps ops{dot, axpy, to_f16, to_f32, q8_0_to_f32, to_q8_0, dot_tile,
                            axpy_rows_heads, axpy_rows_heads_f16, axpy_rows_heads_q8_0, delta_step, silu, silu_mul, sigmoid_mul,
                            sum_squares, exp_sub_sum, "avx2"};
    return &ops;
}

}  // namespace qinfer::cpu

#else

namespace qinfer::cpu {
const VecOps* vec_avx2() { return nullptr; }
}  // namespace qinfer::cpu

#endif
