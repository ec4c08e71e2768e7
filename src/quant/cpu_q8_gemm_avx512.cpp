// AVX512-VNNI int8 tile kernel (see cpu_q8_gemm.h): 16 weight rows (one per
// int32 lane of a zmm) x up to 8 activation rows. Per 4 values of K: one load
// of the panel's quants, and per activation row a 4-byte broadcast and one
// vpdpbusd (u8 x s8, four products summed straight into int32: no 16-bit
// intermediate, so no overflow limit). A scale group's int32 sums are then
// multiplied by the group's scale (vpmulld) and added to the super-block sum;
// the min terms use vpdpwssd on int16 pairs. Same integers as the portable and
// AVX2 kernels. Only used when the CPU has AVX512-VNNI (Isa::Avx512); AVX-512
// CPUs without it run the AVX2 kernel.
#if defined(__x86_64__) || defined(_M_X64)

// GCC 12 warns about _mm512_undefined_ps() inside _mm512_cvtepi32_ps (a false
// positive in its own header).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstring>

#include "quant/blocks.h"
#include "quant/cpu_q8_gemm.h"
#include "quant/cpu_x86_pack.h"

namespace qinfer::kernels {

namespace {

inline __m512i bcast4(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

template <int S, int R>
void gemm_r(int64_t K, const uint8_t* panel, const uint8_t* act, size_t as, float* y, int64_t ldy, int n) {
    constexpr int NR = 16, NG = QK_K / S;
    constexpr size_t sbb = q8_superblock_bytes(S, NR);
    const block_q8_K* a[R];
    for (int r = 0; r < R; ++r) a[r] = reinterpret_cast<const block_q8_K*>(act + size_t(r) * as);
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < K / QK_K; ++i) {
        const uint8_t* q = panel + size_t(i) * sbb;
        const uint8_t* scp = q + QK_K * NR;
        const uint8_t* mnp = scp + NG * NR * 4;
        const float* dp = reinterpret_cast<const float*>(mnp + 8 * NR * 4);
        __m512i isum[R];
        for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
        for (int g = 0; g < NG; ++g) {
            __m512i gsum[R];
            for (int r = 0; r < R; ++r) gsum[r] = _mm512_setzero_si512();
            for (int s = 0; s < S / 4; ++s) {
                const int step = g * (S / 4) + s;
                const __m512i w = _mm512_loadu_si512(q + step * 64);
                for (int r = 0; r < R; ++r) gsum[r] = _mm512_dpbusd_epi32(gsum[r], w, bcast4(a[r][i].qs + step * 4));
            }
            const __m512i sc = _mm512_loadu_si512(scp + g * 64);
            for (int r = 0; r < R; ++r) isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(gsum[r], sc));
        }
        __m512i msum[R];
        for (int r = 0; r < R; ++r) msum[r] = _mm512_setzero_si512();
        for (int p = 0; p < 8; ++p) {
            const __m512i mv = _mm512_loadu_si512(mnp + p * 64);
            for (int r = 0; r < R; ++r) msum[r] = _mm512_dpwssd_epi32(msum[r], mv, bcast4(a[r][i].bsums + 2 * p));
        }
        const __m512 dA = _mm512_loadu_ps(dp), dB = _mm512_loadu_ps(dp + NR);
        for (int r = 0; r < R; ++r) {
            const __m512 d = _mm512_set1_ps(a[r][i].d);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(dA, d), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[r]), _mm512_mul_ps(dB, d), acc[r]);
        }
    }
    const __mmask16 keep = n >= NR ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, keep, acc[r]);
}

template <int S>
void gemm(int64_t K, const uint8_t* panel, const uint8_t* act, size_t as, int R, float* y, int64_t ldy, int n) {
    switch (R) {
        case 1: gemm_r<S, 1>(K, panel, act, as, y, ldy, n); break;
        case 2: gemm_r<S, 2>(K, panel, act, as, y, ldy, n); break;
        case 3: gemm_r<S, 3>(K, panel, act, as, y, ldy, n); break;
        case 4: gemm_r<S, 4>(K, panel, act, as, y, ldy, n); break;
        case 5: gemm_r<S, 5>(K, panel, act, as, y, ldy, n); break;
        case 6: gemm_r<S, 6>(K, panel, act, as, y, ldy, n); break;
        case 7: gemm_r<S, 7>(K, panel, act, as, y, ldy, n); break;
        default: gemm_r<S, 8>(K, panel, act, as, y, ldy, n); break;
    }
}

GemmTable make_table() {
    GemmTable t;
    t.k[int(GgmlType::Q2_K)] = {gemm<16>, pack_x86<block_q2_K, 16>, 16, 8};
    t.k[int(GgmlType::Q3_K)] = {gemm<16>, pack_x86<block_q3_K, 16>, 16, 8};
    t.k[int(GgmlType::Q4_K)] = {gemm<32>, pack_x86<block_q4_K, 16>, 16, 8};
    t.k[int(GgmlType::Q5_K)] = {gemm<32>, pack_x86<block_q5_K, 16>, 16, 8};
    t.k[int(GgmlType::Q6_K)] = {gemm<16>, pack_x86<block_q6_K, 16>, 16, 8};
    return t;
}

}  // namespace

const GemmTable* q8_gemm_avx512_table() {
    static const GemmTable t = make_table();
    return &t;
}

}  // namespace qinfer::kernels

#else

#include "quant/cpu_q8_gemm.h"
namespace qinfer::kernels {
const GemmTable* q8_gemm_avx512_table() { return nullptr; }
}  // namespace qinfer::kernels

#endif
