// AVX2 + FMA + F16C kernels: integer products with _mm256_maddubs_epi16
// (u8 x s8 pairs -> s16) and _mm256_madd_epi16 (-> s32). The loops live in
// cpu_x86_dot.h; this file supplies the leaf ops.
#if defined(__x86_64__) || defined(_M_X64)

#include <cstring>

#include "quant/cpu_x86_dot.h"

namespace qinfer::kernels {

namespace {

struct OpsAvx2 {
    static __m256i madd_acc(__m256i acc, __m256i p, __m256i s) { return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s)); }
    // Sign trick: |w| * (a with w's sign); maddubs cannot saturate since |w| <= 128, |a| <= 127.
    static __m256i dot_s8(__m256i w, __m256i a) {
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
        return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    }
    static __m256i dot_u8(__m256i u, __m256i a) {
        return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
    }
};

inline __m256 abs_mask() { return _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)); }

// max |x_j| over n values (a multiple of 8); a NaN never wins, as with the
// reference quantizers' compares (it is max's first operand).
inline float abs_max(const float* x, int n) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask()), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// quantize_ref_q8_K in 8 lanes, bit for bit: the same signed maximum (the
// first element of the largest magnitude; NaNs never win, as with the
// reference's compares), the same product iscale * x rounded to nearest even
// (what the reference's 1.5 * 2^23 trick gives; spelled as a round, since a
// multiply followed by an add may be contracted into one fma), NaN -> 0 as
// there, capped at 127.
void quantize_q8_K(const float* x, block_q8_K* y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        const float amax = abs_max(x, QK_K);
        if (!amax) {
            y[i].d = 0;
            std::memset(y[i].qs, 0, sizeof y[i].qs);
            std::memset(y[i].bsums, 0, sizeof y[i].bsums);
            continue;
        }
        float max = 0.f;
        const __m256 am = _mm256_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask()), am, _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz(unsigned(hit))];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 is = _mm256_set1_ps(iscale);
        const __m256i cap = _mm256_set1_epi32(127), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        auto quant8 = [&](int j) {
            const __m256 v = _mm256_mul_ps(is, _mm256_loadu_ps(x + j));
            const __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256i q = _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)),
                                                  _mm256_cvtps_epi32(r));
            return _mm256_min_epi32(q, cap);
        };
        for (int j = 0; j < QK_K; j += 32) {
            const __m256i a = _mm256_packs_epi32(quant8(j), quant8(j + 8));
            const __m256i b = _mm256_packs_epi32(quant8(j + 16), quant8(j + 24));
            const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), order);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + j), q);
            // bsums of the two 16-element groups: widen to 16 bits, pairwise sums, then per group
            const __m256i w = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), _mm256_set1_epi16(1));
            const __m256i v = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), _mm256_set1_epi16(1));
            const __m256i s = _mm256_hadd_epi32(w, v);  // [w01 w23 v01 v23 | w45 w67 v45 v67]
            const __m256i s2 = _mm256_hadd_epi32(s, s);  // [w0-3 v0-3 . . | w4-7 v4-7 . .]
            const __m128i g = _mm_add_epi32(_mm256_castsi256_si128(s2), _mm256_extracti128_si256(s2, 1));
            y[i].bsums[j / 16] = int16_t(_mm_cvtsi128_si32(g));
            y[i].bsums[j / 16 + 1] = int16_t(_mm_extract_epi32(g, 1));
        }
        y[i].d = 1 / iscale;
    }
}

// quantize_ref_q8_0 (a q8_0 KV cache's rows) per 32-value block: amax,
// d = amax / 127 stored as f16 (both round to nearest even), q = round half
// away from zero of x * (1 / d). The product is pinned to a
// register before the rounding's subtraction: contracted into an fma, the
// tie test would see the exact product instead of the rounded one.
void quantize_q8_0(const float* x, block_q8_0* b, int64_t n) {
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.f);
    for (int64_t i = 0; i < n / QK8_0; ++i, x += QK8_0) {
        const float d = abs_max(x, QK8_0) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        b[i].d = uint16_t(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT), 0));
        __m256i q[4];
        for (int j = 0; j < 4; ++j) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), _mm256_set1_ps(id));
            __asm__("" : "+x"(v));  // no contraction of the product into the subtraction below
            const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 away = _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(v, t), abs_mask()), half, _CMP_GE_OQ),
                                              _mm256_or_ps(one, _mm256_andnot_ps(abs_mask(), v)));  // +-1 with v's sign
            q[j] = _mm256_cvttps_epi32(_mm256_add_ps(t, away));
        }
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs),
                            _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
}

}  // namespace

const KernelTable* avx2_table() {
    static const KernelTable t = [] {
        KernelTable k = X86Kernels<OpsAvx2>::table();
        k.quantize_q8_K = quantize_q8_K;
        k.quantize_q8_0 = quantize_q8_0;
        return k;
    }();
    return &t;
}

}  // namespace qinfer::kernels

#else  // not x86-64: no AVX2 kernels in this build

#include "quant/cpu_kernels.h"
namespace qinfer::kernels {
const KernelTable* avx2_table() { return nullptr; }
}  // namespace qinfer::kernels

#endif
