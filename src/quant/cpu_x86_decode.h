// AVX2 block decoders shared by cpu_kernels_avx2.cpp and cpu_kernels_avx512.cpp.
// Include only from files compiled with at least -mavx2 -mfma -mf16c. Everything
// here has internal linkage on purpose: each ISA file gets its own copy compiled
// with its own flags, so the linker can never hand an AVX-512 instance of a
// helper to the AVX2 path (or an AVX2 one to the scalar path).
//
// K-quant super-blocks decode to the generic form of cpu_kernels_scalar.cpp:
// u[256] unsigned quants, per-chunk int16 scale vectors (a 32-element chunk
// spans two 16-element groups: lanes 0-7 carry the first group's scale, lanes
// 8-15 the second's, matching the lane layout of _mm256_maddubs_epi16), the
// sixteen "min" coefficients as int16, and the float factors dA, dB.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"

namespace qinfer::kernels {
namespace {

struct alignas(32) KDec {
    uint8_t u[QK_K];
    int16_t scv[8][16];
    int16_t mn[16];
    float dA, dB;
};

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// sc16 / mn16: sixteen int8 per-group values -> KDec scale vectors and mins.
inline void finish_scales(__m128i sc16, __m128i mn16, KDec& k) {
    for (int c = 0; c < 8; ++c) {
        const __m128i pick = _mm_set_epi64x(0x0101010101010101LL * (2 * c + 1), 0x0101010101010101LL * (2 * c));
        _mm256_store_si256(reinterpret_cast<__m256i*>(k.scv[c]), _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc16, pick)));
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(k.mn), _mm256_cvtepi8_epi16(mn16));
}

inline void store_u(KDec& k, int off, __m256i v) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(k.u + off), v);
}

// 0xFF in byte l where bit `bit` of v's byte l is set.
inline __m256i bit_mask(__m256i v, int bit) {
    const __m256i m = _mm256_set1_epi8(char(1u << bit));
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m);
}

inline void decode(const block_q2_K& b, KDec& k) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * h));
        store_u(k, 128 * h + 0, _mm256_and_si256(q, m3));
        store_u(k, 128 * h + 32, _mm256_and_si256(_mm256_srli_epi16(q, 2), m3));
        store_u(k, 128 * h + 64, _mm256_and_si256(_mm256_srli_epi16(q, 4), m3));
        store_u(k, 128 * h + 96, _mm256_and_si256(_mm256_srli_epi16(q, 6), m3));
    }
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m128i m4 = _mm_set1_epi8(0xF);
    finish_scales(_mm_and_si128(s, m4), _mm_and_si128(_mm_srli_epi16(s, 4), m4), k);
    k.dA = f16_to_f32(b.d);
    k.dB = f16_to_f32(b.dmin);
}

inline void decode(const block_q3_K& b, KDec& k) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask));
    for (int h = 0; h < 2; ++h) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * h));
        const __m256i low[4] = {_mm256_and_si256(q, m3), _mm256_and_si256(_mm256_srli_epi16(q, 2), m3),
                                _mm256_and_si256(_mm256_srli_epi16(q, 4), m3),
                                _mm256_and_si256(_mm256_srli_epi16(q, 6), m3)};
        for (int kk = 0; kk < 4; ++kk)  // u = q + 4 = low2 | (high bit << 2)
            store_u(k, 128 * h + 32 * kk, _mm256_or_si256(low[kk], _mm256_and_si256(bit_mask(hm, 4 * h + kk), four)));
    }
    // Sixteen 6-bit scales (spec/quants.md §5.2 byte map), four per u32.
    uint32_t a[3], s[4];
    std::memcpy(a, b.scales, 12);
    const uint32_t lo4 = 0x0f0f0f0f, hi2 = 0x03030303;
    s[0] = (a[0] & lo4) | (((a[2] >> 0) & hi2) << 4);
    s[1] = (a[1] & lo4) | (((a[2] >> 2) & hi2) << 4);
    s[2] = ((a[0] >> 4) & lo4) | (((a[2] >> 4) & hi2) << 4);
    s[3] = ((a[1] >> 4) & lo4) | (((a[2] >> 6) & hi2) << 4);
    const __m128i sc = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)), _mm_set1_epi8(32));
    finish_scales(sc, sc, k);
    k.dA = f16_to_f32(b.d);
    k.dB = 4.f * k.dA;
}

// Q4_K / Q5_K scales: bytes 0-7 of the result = sc_0..7, bytes 8-15 = m_0..7.
inline __m128i unpack_scales_k4(const uint8_t* scales) {
    uint32_t a[3], s[4];
    std::memcpy(a, scales, 12);
    const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, hi2 = 0x03030303;
    s[0] = a[0] & lo6;                                       // sc_0..3
    s[1] = (a[2] & lo4) | (((a[0] >> 6) & hi2) << 4);        // sc_4..7
    s[2] = a[1] & lo6;                                       // m_0..3
    s[3] = ((a[2] >> 4) & lo4) | (((a[1] >> 6) & hi2) << 4); // m_4..7
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
}

template <class B>
inline void decode_q45(const B& b, KDec& k, const uint8_t* qh) {
    const __m256i m4 = _mm256_set1_epi8(0xF), sixteen = _mm256_set1_epi8(16);
    __m256i hb = _mm256_setzero_si256();
    if (qh) hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    for (int g = 0; g < 4; ++g) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * g));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh) {
            lo = _mm256_or_si256(lo, _mm256_and_si256(bit_mask(hb, 2 * g), sixteen));
            hi = _mm256_or_si256(hi, _mm256_and_si256(bit_mask(hb, 2 * g + 1), sixteen));
        }
        store_u(k, 64 * g, lo);
        store_u(k, 64 * g + 32, hi);
    }
    const __m128i scm = unpack_scales_k4(b.scales);
    // One scale per 32 elements: duplicate each byte for the two 16-groups.
    finish_scales(_mm_unpacklo_epi8(scm, scm), _mm_unpackhi_epi8(scm, scm), k);
    k.dA = f16_to_f32(b.d);
    k.dB = f16_to_f32(b.dmin);
}
inline void decode(const block_q4_K& b, KDec& k) { decode_q45(b, k, nullptr); }
inline void decode(const block_q5_K& b, KDec& k) { decode_q45(b, k, b.qh); }

inline void decode(const block_q6_K& b, KDec& k) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
        // High 2 bits to bits 4-5 of each byte (the values stay inside their byte).
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4);
        const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4);
        const __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4);
        store_u(k, 128 * h + 0, _mm256_or_si256(_mm256_and_si256(ql0, m4), h0));
        store_u(k, 128 * h + 32, _mm256_or_si256(_mm256_and_si256(ql1, m4), h1));
        store_u(k, 128 * h + 64, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), h2));
        store_u(k, 128 * h + 96, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), h3));
    }
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    finish_scales(sc, sc, k);
    k.dA = f16_to_f32(b.d);
    k.dB = 32.f * k.dA;
}

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
inline __m256i quants(const block_q8_0& b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)); }
inline __m256i quants(const block_q4_0& b) { return _mm256_sub_epi8(nibbles32(b.qs), _mm256_set1_epi8(8)); }
inline __m256i quants(const block_q5_0& b) {
    return _mm256_sub_epi8(_mm256_or_si256(nibbles32(b.qs), fifth_bits32(b.qh)), _mm256_set1_epi8(16));
}
// Unsigned quants (used with Q8_1 activations).
inline __m256i quants(const block_q4_1& b) { return nibbles32(b.qs); }
inline __m256i quants(const block_q5_1& b) { return _mm256_or_si256(nibbles32(b.qs), fifth_bits32(b.qh)); }

}  // namespace
}  // namespace qinfer::kernels
