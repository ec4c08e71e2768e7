// AVX2 block decoders shared by cpu_kernels_avx2.cpp and cpu_kernels_avx512.cpp.
// Include only from files compiled with at least -mavx2 -mfma -mf16c. Everything
// here has internal linkage on purpose: each ISA file gets its own copy compiled
// with its own flags, so the linker can never hand an AVX-512 instance of a
// helper to the AVX2 path (or an AVX2 one to the scalar path).
//
// K-quant super-blocks are decoded chunk by chunk (32 elements = one ymm) into
// the generic form of cpu_kernels_scalar.cpp: unsigned quants u, an int16 scale
// vector per chunk (lanes 0-7 carry the scale of the chunk's first 16 elements,
// lanes 8-15 the second's, matching the lanes of _mm256_maddubs_epi16), the
// sixteen "min" coefficients as int16 (dotted with the Q8_K bsums), and the
// float factors dA, dB:
//   dot = d_a * (dA * sum_c madd(maddubs(u_c, a_c), scv_c) - dB * madd(mn, bsums))
// Chunk indices are template parameters so that shifts and shuffle masks are
// immediates and the whole super-block unrolls.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "quant/blocks.h"

namespace qinfer::kernels {
namespace {

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Calls f(std::integral_constant<int, C>) for C = 0..N-1, unrolled.
template <class F, int... C>
inline void unroll_impl(F&& f, std::integer_sequence<int, C...>) {
    (f(std::integral_constant<int, C>{}), ...);
}
template <int N, class F>
inline void unroll(F&& f) {
    unroll_impl(f, std::make_integer_sequence<int, N>{});
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 0xFF in byte l where bit `bit` of v's byte l is set.
template <int Bit>
inline __m256i bit_mask(__m256i v) {
    const __m256i m = _mm256_set1_epi8(char(1u << Bit));
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m);
}

// Bits 2k..2k+1 of every byte.
template <int K>
inline __m256i crumb(__m256i q) {
    return _mm256_and_si256(_mm256_srli_epi16(q, 2 * K), _mm256_set1_epi8(3));
}

// Scale vectors from sixteen s16 per-16-element scales (one per group g).
struct Scales16 {
    __m256i lo, hi;  // groups 0-7 / 8-15, broadcast to both 128-bit lanes
    explicit Scales16(__m128i sc8) {
        const __m256i s = _mm256_cvtepi8_epi16(sc8);
        lo = _mm256_permute2x128_si256(s, s, 0x00);
        hi = _mm256_permute2x128_si256(s, s, 0x11);
    }
    template <int C>
    __m256i get() const {  // chunk C: groups 2C (low lanes) and 2C+1 (high lanes)
        constexpr int w0 = (2 * C) % 8, w1 = w0 + 1;
        const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(short(((2 * w1 + 1) << 8) | (2 * w1))),
                                              _mm_set1_epi16(short(((2 * w0 + 1) << 8) | (2 * w0))));
        return _mm256_shuffle_epi8(C < 4 ? lo : hi, pick);
    }
};

// Scale vectors from eight s16 per-32-element scales (Q4_K, Q5_K).
struct Scales32 {
    __m256i s;  // eight s16, broadcast to both lanes
    explicit Scales32(__m128i sc8_low8) {
        const __m128i v = _mm_cvtepu8_epi16(sc8_low8);
        s = _mm256_set_m128i(v, v);
    }
    template <int C>
    __m256i get() const {
        return _mm256_shuffle_epi8(s, _mm256_set1_epi16(short(((2 * C + 1) << 8) | (2 * C))));
    }
};

struct DecQ2K {
    __m256i q0, q1;
    Scales16 sc;
    __m256i mn;
    float dA, dB;
    explicit DecQ2K(const block_q2_K& b)
        : q0(load32(b.qs)), q1(load32(b.qs + 32)), sc(lo4(b)), mn(_mm256_cvtepu8_epi16(hi4(b))),
          dA(f16_to_f32(b.d)), dB(f16_to_f32(b.dmin)) {}
    static __m128i lo4(const block_q2_K& b) {
        return _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)), _mm_set1_epi8(0xF));
    }
    static __m128i hi4(const block_q2_K& b) {
        const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
        return _mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0xF));
    }
    template <int C>
    __m256i u() const { return crumb<C % 4>(C < 4 ? q0 : q1); }
    template <int C>
    __m256i scv() const { return sc.get<C>(); }
};

// Sixteen signed 6-bit Q3_K scales (spec/quants.md §5.2 byte map), four per u32.
inline __m128i q3_K_scales(const uint8_t* scales) {
    uint32_t a[3], s[4];
    std::memcpy(a, scales, 12);
    const uint32_t lo4 = 0x0f0f0f0f, hi2 = 0x03030303;
    s[0] = (a[0] & lo4) | (((a[2] >> 0) & hi2) << 4);
    s[1] = (a[1] & lo4) | (((a[2] >> 2) & hi2) << 4);
    s[2] = ((a[0] >> 4) & lo4) | (((a[2] >> 4) & hi2) << 4);
    s[3] = ((a[1] >> 4) & lo4) | (((a[2] >> 6) & hi2) << 4);
    return _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)), _mm_set1_epi8(32));
}

// Q3_K: u = q + 4 (low 2 bits | high bit << 2); mn = sc and dB = 4 d.
struct DecQ3K {
    __m256i q0, q1, hm;
    __m128i sc8;
    Scales16 sc;
    __m256i mn;
    float dA, dB;
    explicit DecQ3K(const block_q3_K& b)
        : q0(load32(b.qs)), q1(load32(b.qs + 32)), hm(load32(b.hmask)), sc8(q3_K_scales(b.scales)), sc(sc8),
          mn(_mm256_cvtepi8_epi16(sc8)), dA(f16_to_f32(b.d)), dB(4.f * dA) {}
    template <int C>
    __m256i u() const {
        const __m256i high = _mm256_and_si256(bit_mask<C>(hm), _mm256_set1_epi8(4));
        return _mm256_or_si256(crumb<C % 4>(C < 4 ? q0 : q1), high);
    }
    template <int C>
    __m256i scv() const { return sc.get<C>(); }
};

// Q4_K / Q5_K scales: bytes 0-7 of the result = sc_0..7, bytes 8-15 = m_0..7.
inline __m128i unpack_scales_k4(const uint8_t* scales) {
    uint32_t a[3], s[4];
    std::memcpy(a, scales, 12);
    const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, hi2 = 0x03030303;
    s[0] = a[0] & lo6;                                        // sc_0..3
    s[1] = (a[2] & lo4) | (((a[0] >> 6) & hi2) << 4);         // sc_4..7
    s[2] = a[1] & lo6;                                        // m_0..3
    s[3] = ((a[2] >> 4) & lo4) | (((a[1] >> 6) & hi2) << 4);  // m_4..7
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
}

template <bool HasQh>
struct DecQ45K {
    const uint8_t* qs;
    __m256i qh;
    __m128i scm;
    Scales32 sc;
    __m256i mn;
    float dA, dB;
    template <class B>
    explicit DecQ45K(const B& b)
        : qs(b.qs), qh(load_qh(b)), scm(unpack_scales_k4(b.scales)), sc(scm),
          // mins per 16-group: m_{g/2}
          mn(_mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm))), dA(f16_to_f32(b.d)), dB(f16_to_f32(b.dmin)) {}
    static __m256i load_qh(const block_q4_K&) { return _mm256_setzero_si256(); }
    static __m256i load_qh(const block_q5_K& b) { return load32(b.qh); }
    template <int C>
    __m256i u() const {
        const __m256i q = load32(qs + 32 * (C / 2));
        __m256i v = _mm256_and_si256(C % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0xF));
        if constexpr (HasQh) v = _mm256_or_si256(v, _mm256_and_si256(bit_mask<C>(qh), _mm256_set1_epi8(16)));
        return v;
    }
    template <int C>
    __m256i scv() const { return sc.get<C>(); }
};
using DecQ4K = DecQ45K<false>;
using DecQ5K = DecQ45K<true>;

// Q6_K: u = q + 32 (low 4 bits | high 2 bits << 4); mn = sc and dB = 32 d.
struct DecQ6K {
    const uint8_t* ql;
    const uint8_t* qh;
    __m128i sc8;
    Scales16 sc;
    __m256i mn;
    float dA, dB;
    explicit DecQ6K(const block_q6_K& b)
        : ql(b.ql), qh(b.qh), sc8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales))), sc(sc8),
          mn(_mm256_cvtepi8_epi16(sc8)), dA(f16_to_f32(b.d)), dB(32.f * dA) {}
    template <int C>
    __m256i u() const {
        constexpr int h = C / 4, k = C % 4;
        const __m256i l = load32(ql + 64 * h + 32 * (k & 1));
        const __m256i low4 = _mm256_and_si256(k >> 1 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(0xF));
        // High 2 bits to bits 4-5 of each byte (they stay inside their byte).
        const __m256i high = _mm256_slli_epi16(crumb<k>(load32(qh + 32 * h)), 4);
        return _mm256_or_si256(low4, high);
    }
    template <int C>
    __m256i scv() const { return sc.get<C>(); }
};

template <class B> struct KDecoder;
template <> struct KDecoder<block_q2_K> { using type = DecQ2K; };
template <> struct KDecoder<block_q3_K> { using type = DecQ3K; };
template <> struct KDecoder<block_q4_K> { using type = DecQ4K; };
template <> struct KDecoder<block_q5_K> { using type = DecQ5K; };
template <> struct KDecoder<block_q6_K> { using type = DecQ6K; };

// ---- legacy 32-element blocks: one ymm of quants + float factors -------------

// 16 packed bytes -> 32 bytes: low nibbles (elements 0-15), then high nibbles (16-31).
inline __m256i nibbles32(const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(both, _mm256_set1_epi8(0xF));
}

// Bit e of qh -> 0x10 in byte e.
inline __m256i fifth_bits32(const uint8_t* qh) {
    const __m256i v = _mm256_set1_epi32(int(load_qh32(qh)));
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, spread), bits), bits);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// Signed quants (used with Q8_0 activations).
inline __m256i quants(const block_q8_0& b) { return load32(b.qs); }
inline __m256i quants(const block_q4_0& b) { return _mm256_sub_epi8(nibbles32(b.qs), _mm256_set1_epi8(8)); }
inline __m256i quants(const block_q5_0& b) {
    return _mm256_sub_epi8(_mm256_or_si256(nibbles32(b.qs), fifth_bits32(b.qh)), _mm256_set1_epi8(16));
}
// Unsigned quants (used with Q8_1 activations).
inline __m256i quants(const block_q4_1& b) { return nibbles32(b.qs); }
inline __m256i quants(const block_q5_1& b) { return _mm256_or_si256(nibbles32(b.qs), fifth_bits32(b.qh)); }

}  // namespace
}  // namespace qinfer::kernels
