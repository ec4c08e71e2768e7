// The AVX2-era dot-product kernels as templates over the integer "leaf" ops,
// shared by cpu_kernels_avx2.cpp (maddubs/madd) and cpu_kernels_avx512.cpp
// (the same loops with AVX512-VNNI dpbusd/dpwssd). Include only from files
// compiled with at least -mavx2 -mfma -mf16c; internal linkage throughout (see
// cpu_x86_decode.h). An Ops class provides:
//   madd_acc(acc, p, s): acc + pairwise s16 products of p and s, as 8 x s32
//   dot_s8(w, a):        sum of s8 x s8 products in groups of 4 (or 8), as 8 x s32
//   dot_u8(u, a):        the same with u unsigned
// Every kernel handles R = 1..kMaxTile activation rows per call, so a weight
// block is loaded and unpacked once per tile (templates on R keep the R
// accumulators in registers).
#pragma once
#include <cstring>

#include "quant/cpu_kernels.h"
#include "quant/cpu_x86_decode.h"

namespace qinfer::kernels {
namespace {

inline const uint8_t* act_row(const void* a, size_t a_stride, int r) {
    return static_cast<const uint8_t*>(a) + size_t(r) * a_stride;
}

// ---- K-quants x Q8_K --------------------------------------------------------

// Lanes 0-1: the sum of a's lanes; lanes 2-3: the sum of b's (shuffles and
// adds: cheaper than hadd on most cores).
inline __m128i hsum2_epi32(__m256i a, __m256i b) {
    const __m256i t = _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
    const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));  // a a b b (partial)
    return _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xB1));
}

template <class Ops, class B, int R, bool CONTINUE = false>
void dot_kquant_r(int64_t K, const void* w, const void* a, size_t a_stride, float* out, int64_t os) {
    using Dec = typename KDecoder<B>::type;
    const B* wb = static_cast<const B*>(w);
    const block_q8_K* ab[R];
    for (int r = 0; r < R; ++r) ab[r] = reinterpret_cast<const block_q8_K*>(act_row(a, a_stride, r));
    // Per super-block the integer sums are reduced to one sumi and one summ per
    // row, then acc = acc + sumi * (d_a dA) - summ * (d_a dB) in two fused
    // steps: exactly what the int8 tile kernels (cpu_q8_gemm_*.cpp) do per lane,
    // so a prompt's rows give bit-identical results on either path (batch vs
    // token-by-token; any difference would flip later activation roundings).
    __m128 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = CONTINUE ? _mm_set_ss(out[r * os]) : _mm_setzero_ps();
    for (int64_t i = 0; i < K / QK_K; ++i) {
        const Dec d(wb[i]);
        __m256i sumi[R];
        for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
        unroll<8>([&](auto c) {
            constexpr int C = decltype(c)::value;
            const __m256i u = d.template u<C>();
            const __m256i sv = d.template scv<C>();
            for (int r = 0; r < R; ++r) {
                const __m256i p = _mm256_maddubs_epi16(u, load32(ab[r][i].qs + 32 * C));  // u <= 63: no saturation
                sumi[r] = Ops::madd_acc(sumi[r], p, sv);
            }
        });
        for (int r = 0; r < R; ++r) {
            const block_q8_K& y = ab[r][i];
            const __m256i mins = _mm256_madd_epi16(d.mn, load32(y.bsums));
            const __m128 f = _mm_cvtepi32_ps(hsum2_epi32(sumi[r], mins));  // sumi, sumi, summ, summ
            acc[r] = _mm_fmadd_ss(f, _mm_set_ss(d.dA * y.d), acc[r]);
            acc[r] = _mm_fnmadd_ss(_mm_movehl_ps(f, f), _mm_set_ss(d.dB * y.d), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) out[r * os] = _mm_cvtss_f32(acc[r]);
}

// ---- legacy blocks ------------------------------------------------------------

// Blocks alternate between two accumulator sets: with few rows the FMA latency
// would otherwise bound the loop.
template <class Ops, class B, int R>
void dot_legacy_q8_0_r(int64_t K, const void* w, const void* a, size_t a_stride, float* out, int64_t os) {
    const B* wb = static_cast<const B*>(w);
    const block_q8_0* ab[R];
    for (int r = 0; r < R; ++r) ab[r] = reinterpret_cast<const block_q8_0*>(act_row(a, a_stride, r));
    __m256 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
    auto step = [&](int64_t i, __m256* acc) {
        const __m256i wq = quants(wb[i]);
        const float dw = f16_to_f32(wb[i].d);
        for (int r = 0; r < R; ++r) {
            const __m256i prod = Ops::dot_s8(wq, load32(ab[r][i].qs));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * f16_to_f32(ab[r][i].d)), _mm256_cvtepi32_ps(prod), acc[r]);
        }
    };
    const int64_t nb = K / 32;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        step(i, acc0);
        step(i + 1, acc1);
    }
    if (i < nb) step(i, acc0);
    for (int r = 0; r < R; ++r) out[r * os] = hsum_ps(_mm256_add_ps(acc0[r], acc1[r]));
}

template <class Ops, class B, int R>
void dot_legacy_q8_1_r(int64_t K, const void* w, const void* a, size_t a_stride, float* out, int64_t os) {
    const B* wb = static_cast<const B*>(w);
    const block_q8_1* ab[R];
    for (int r = 0; r < R; ++r) ab[r] = reinterpret_cast<const block_q8_1*>(act_row(a, a_stride, r));
    __m256 acc0[R], acc1[R];
    float accm0[R], accm1[R];
    for (int r = 0; r < R; ++r) {
        acc0[r] = acc1[r] = _mm256_setzero_ps();
        accm0[r] = accm1[r] = 0.f;
    }
    auto step = [&](int64_t i, __m256* acc, float* accm) {
        const __m256i wq = quants(wb[i]);
        const float dw = f16_to_f32(wb[i].d), mw = f16_to_f32(wb[i].m);
        for (int r = 0; r < R; ++r) {
            const __m256i prod = Ops::dot_u8(wq, load32(ab[r][i].qs));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * f16_to_f32(ab[r][i].d)), _mm256_cvtepi32_ps(prod), acc[r]);
            accm[r] += mw * f16_to_f32(ab[r][i].s);
        }
    };
    const int64_t nb = K / 32;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        step(i, acc0, accm0);
        step(i + 1, acc1, accm1);
    }
    if (i < nb) step(i, acc0, accm0);
    for (int r = 0; r < R; ++r) out[r * os] = hsum_ps(_mm256_add_ps(acc0[r], acc1[r])) + (accm0[r] + accm1[r]);
}

// ---- float weights x f32 activations ----------------------------------------------

inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load8(const uint16_t* w) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}
struct Bf16 { uint16_t bits; };
inline __m256 load8(const Bf16* w) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline float load1(const float* w) { return *w; }
inline float load1(const uint16_t* w) { return f16_to_f32(*w); }
inline float load1(const Bf16* w) {
    const uint32_t u = uint32_t(w->bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

template <class Ops, class W, int R>
void dot_float_r(int64_t K, const void* w, const void* a, size_t a_stride, float* out, int64_t os) {
    const W* wp = static_cast<const W*>(w);
    const float* x[R];
    for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const float*>(act_row(a, a_stride, r));
    // Two accumulators per row hide the FMA latency.
    __m256 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= K; i += 16) {
        const __m256 w0 = load8(wp + i), w1 = load8(wp + i + 8);
        for (int r = 0; r < R; ++r) {
            acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r] + i), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[r] + i + 8), acc1[r]);
        }
    }
    for (; i + 8 <= K; i += 8) {
        const __m256 w0 = load8(wp + i);
        for (int r = 0; r < R; ++r) acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r] + i), acc0[r]);
    }
    for (int r = 0; r < R; ++r) {
        float s = hsum_ps(_mm256_add_ps(acc0[r], acc1[r]));
        for (int64_t j = i; j < K; ++j) s += load1(wp + j) * x[r][j];
        out[r * os] = s;
    }
}

// ---- R dispatch and the table ------------------------------------------------------

template <class Ops>
struct X86Kernels {
#define QINFER_DOT_WRAPPER(name, impl)                                                                   \
    template <class T>                                                                                   \
    static void name(int64_t K, const void* w, const void* a, size_t as, int R, float* out, int64_t os) { \
        switch (R) {                                                                                     \
            case 1: impl<Ops, T, 1>(K, w, a, as, out, os); break;                                        \
            case 2: impl<Ops, T, 2>(K, w, a, as, out, os); break;                                        \
            case 3: impl<Ops, T, 3>(K, w, a, as, out, os); break;                                        \
            default: impl<Ops, T, 4>(K, w, a, as, out, os); break;                                       \
        }                                                                                                \
    }
    QINFER_DOT_WRAPPER(dot_kquant, dot_kquant_r)
    QINFER_DOT_WRAPPER(dot_legacy_q8_0, dot_legacy_q8_0_r)
    QINFER_DOT_WRAPPER(dot_legacy_q8_1, dot_legacy_q8_1_r)
    QINFER_DOT_WRAPPER(dot_float, dot_float_r)
#undef QINFER_DOT_WRAPPER
    static_assert(kMaxTile == 4, "update the R dispatch");
    template <class T>
    static void dot_kquant_continue(int64_t K, const void* w, const void* a, size_t as, int, float* out, int64_t os) {
        dot_kquant_r<Ops, T, 1, true>(K, w, a, as, out, os);
    }

    static KernelTable table() {
        KernelTable t;
        auto set = [&](GgmlType ty, DotFn f) { t.dot[int(ty)] = f; };
        set(GgmlType::F32, dot_float<float>);
        set(GgmlType::F16, dot_float<uint16_t>);
        set(GgmlType::BF16, dot_float<Bf16>);
        set(GgmlType::Q8_0, dot_legacy_q8_0<block_q8_0>);
        set(GgmlType::Q4_0, dot_legacy_q8_0<block_q4_0>);
        set(GgmlType::Q5_0, dot_legacy_q8_0<block_q5_0>);
        set(GgmlType::Q4_1, dot_legacy_q8_1<block_q4_1>);
        set(GgmlType::Q5_1, dot_legacy_q8_1<block_q5_1>);
        set(GgmlType::Q2_K, dot_kquant<block_q2_K>);
        set(GgmlType::Q3_K, dot_kquant<block_q3_K>);
        set(GgmlType::Q4_K, dot_kquant<block_q4_K>);
        set(GgmlType::Q5_K, dot_kquant<block_q5_K>);
        set(GgmlType::Q6_K, dot_kquant<block_q6_K>);
        t.dot_continue[int(GgmlType::Q2_K)] = dot_kquant_continue<block_q2_K>;
        t.dot_continue[int(GgmlType::Q3_K)] = dot_kquant_continue<block_q3_K>;
        t.dot_continue[int(GgmlType::Q4_K)] = dot_kquant_continue<block_q4_K>;
        t.dot_continue[int(GgmlType::Q5_K)] = dot_kquant_continue<block_q5_K>;
        t.dot_continue[int(GgmlType::Q6_K)] = dot_kquant_continue<block_q6_K>;
        return t;
    }
};

}  // namespace
}  // namespace qinfer::kernels
