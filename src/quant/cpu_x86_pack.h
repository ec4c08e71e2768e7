// AVX2 panel packer for the int8 tile kernels (cpu_q8_gemm.h), shared by
// cpu_q8_gemm_avx2.cpp (8-row panels) and cpu_q8_gemm_avx512.cpp (16 rows).
// Include only from files compiled with at least -mavx2 -mfma -mf16c;
// internal linkage (see cpu_x86_decode.h).
//
// The chunk decoders of cpu_x86_decode.h give 32 unsigned quants of one row
// (8 steps of 4) per ymm; eight rows' ymm are an 8 x 8 matrix of 32-bit steps,
// and the panel wants it transposed (step-major, one row per lane). The scale
// part is transposed the same way from per-row vectors (RowScales).
#pragma once
#include "quant/cpu_q8_gemm.h"
#include "quant/cpu_x86_decode.h"

namespace qinfer::kernels {
namespace {

// r[j] holds dwords (j, 0..7); afterwards r[s] holds dwords (0..7, s).
inline void transpose8x8_epi32(__m256i r[8]) {
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);  // steps 0|4, 1|5
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);  // steps 2|6, 3|7
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

// One row's super-block scales as int32 lanes: sc of groups 0-7 and 8-15 (S =
// 16 only), the int16 min pairs (groups 2p, 2p+1) per lane p, and dA, dB.
struct RowScales {
    __m256i sc_lo, sc_hi, mnp;
    float dA, dB;
};

template <class B>
inline RowScales row_scales_q45(const B& b) {
    const __m128i scm = unpack_scales_k4(b.scales);  // sc 0-7, m 0-7
    const __m256i m = _mm256_cvtepu8_epi32(_mm_srli_si128(scm, 8));
    return {_mm256_cvtepu8_epi32(scm), _mm256_setzero_si256(), _mm256_or_si256(m, _mm256_slli_epi32(m, 16)),
            f16_to_f32(b.d), f16_to_f32(b.dmin)};
}
inline RowScales row_scales(const block_q4_K& b) { return row_scales_q45(b); }
inline RowScales row_scales(const block_q5_K& b) { return row_scales_q45(b); }
// Sixteen signed scales that are also the min coefficients (Q3_K, Q6_K).
inline RowScales row_scales_sym(__m128i sc8, float dA, float dB) {
    return {_mm256_cvtepi8_epi32(sc8), _mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8)), _mm256_cvtepi8_epi16(sc8), dA,
            dB};
}
inline RowScales row_scales(const block_q6_K& b) {
    const float d = f16_to_f32(b.d);
    return row_scales_sym(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)), d, 32.f * d);
}
inline RowScales row_scales(const block_q3_K& b) {
    const float d = f16_to_f32(b.d);
    return row_scales_sym(q3_K_scales(b.scales), d, 4.f * d);
}
inline RowScales row_scales(const block_q2_K& b) {
    const __m128i sc = DecQ2K::lo4(b), mn = DecQ2K::hi4(b);
    return {_mm256_cvtepu8_epi32(sc), _mm256_cvtepu8_epi32(_mm_srli_si128(sc, 8)), _mm256_cvtepu8_epi16(mn),
            f16_to_f32(b.d), f16_to_f32(b.dmin)};
}

template <class B> constexpr GgmlType block_type();
template <> constexpr GgmlType block_type<block_q2_K>() { return GgmlType::Q2_K; }
template <> constexpr GgmlType block_type<block_q3_K>() { return GgmlType::Q3_K; }
template <> constexpr GgmlType block_type<block_q4_K>() { return GgmlType::Q4_K; }
template <> constexpr GgmlType block_type<block_q5_K>() { return GgmlType::Q5_K; }
template <> constexpr GgmlType block_type<block_q6_K>() { return GgmlType::Q6_K; }

template <class B, int NR>
void pack_x86(const uint8_t* W, size_t rb, int n, int64_t K, uint8_t* panel) {
    static_assert(NR % 8 == 0, "panels are groups of 8 rows");
    using Dec = typename KDecoder<B>::type;
    constexpr GgmlType wt = block_type<B>();
    const size_t sbb = q8_superblock_bytes(q8_group_size(wt), NR);
    constexpr int NG = QK_K / (block_type<B>() == GgmlType::Q4_K || block_type<B>() == GgmlType::Q5_K ? 32 : 16);
    static const B zero{};  // decodes to u = 0 and d = 0: the padding rows
    constexpr int64_t kAhead = 2;
    for (int64_t i = 0; i < K / QK_K; ++i) {
        uint8_t* q = panel + size_t(i) * sbb;
        uint8_t* scp = q + QK_K * NR;
        uint8_t* mnp = scp + NG * NR * 4;
        float* dA = reinterpret_cast<float*>(mnp + 8 * NR * 4);
        for (int h = 0; h < NR / 8; ++h) {
            const B* blk[8];
            for (int j = 0; j < 8; ++j) {
                const int row = 8 * h + j;
                blk[j] = row < n ? reinterpret_cast<const B*>(W + size_t(row) * rb) + i : &zero;
                // Eight (sixteen) row streams at once are more than the hardware
                // prefetchers follow: ask for the blocks a few steps ahead.
                if (row < n && i + kAhead < K / QK_K)
                    for (size_t l = 0; l < sizeof(B); l += 64)
                        _mm_prefetch(reinterpret_cast<const char*>(blk[j] + kAhead) + l, _MM_HINT_T0);
            }
            __m256i lo[8], hi[8], mn[8];
            for (int j = 0; j < 8; ++j) {
                const RowScales rs = row_scales(*blk[j]);
                lo[j] = rs.sc_lo;
                hi[j] = rs.sc_hi;
                mn[j] = rs.mnp;
                dA[8 * h + j] = rs.dA;
                dA[NR + 8 * h + j] = rs.dB;
            }
            transpose8x8_epi32(lo);
            transpose8x8_epi32(mn);
            for (int g = 0; g < 8; ++g) {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(scp + (size_t(g) * NR + 8 * h) * 4), lo[g]);
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(mnp + (size_t(g) * NR + 8 * h) * 4), mn[g]);
            }
            if constexpr (NG == 16) {
                transpose8x8_epi32(hi);
                for (int g = 0; g < 8; ++g)
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(scp + (size_t(8 + g) * NR + 8 * h) * 4), hi[g]);
            }
            unroll<8>([&](auto c) {
                constexpr int C = decltype(c)::value;
                __m256i r[8];
                for (int j = 0; j < 8; ++j) r[j] = Dec(*blk[j]).template u<C>();
                transpose8x8_epi32(r);
                for (int s = 0; s < 8; ++s)
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + (size_t(8 * C + s) * NR + 8 * h) * 4), r[s]);
            });
        }
    }
}

}  // namespace
}  // namespace qinfer::kernels
