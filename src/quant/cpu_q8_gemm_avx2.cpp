// AVX2 int8 tile kernel (see cpu_q8_gemm.h): 8 weight rows (one per int32 lane
// of a ymm) x up to 4 activation rows. Per 4 values of K: one load of the
// panel's quants, and per activation row a 4-byte broadcast and one
// _mm256_maddubs_epi16 (u8 x s8 -> s16 pairs). The s16 pair sums of D
// consecutive steps are added in 16 bits (D is the most that cannot overflow
// for the type's largest quant: 2 * D * umax * 128 <= 32767), then
// _mm256_madd_epi16 with the group's scale (both halves of a lane hold it)
// widens them to int32 and applies the scale in one instruction.
#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

#include <cstring>

#include "quant/blocks.h"
#include "quant/cpu_q8_gemm.h"
#include "quant/cpu_x86_pack.h"

namespace qinfer::kernels {

namespace {

inline __m256i bcast4(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

template <int S, int D, int R>
void gemm_r(int64_t K, const uint8_t* panel, const uint8_t* act, size_t as, float* y, int64_t ldy, int n) {
    constexpr int NR = 8, NG = QK_K / S;
    constexpr size_t sbb = q8_superblock_bytes(S, NR);
    static_assert(S % (4 * D) == 0, "D steps must stay inside one scale group");
    const block_q8_K* a[R];
    for (int r = 0; r < R; ++r) a[r] = reinterpret_cast<const block_q8_K*>(act + size_t(r) * as);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < K / QK_K; ++i) {
        const uint8_t* q = panel + size_t(i) * sbb;
        const uint8_t* scp = q + QK_K * NR;
        const uint8_t* mnp = scp + NG * NR * 4;
        const float* dp = reinterpret_cast<const float*>(mnp + 8 * NR * 4);
        __m256i isum[R];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        for (int g = 0; g < NG; ++g) {
            const __m256i sc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scp + g * 32));
            // Both s16 halves of a lane = the (signed) scale.
            const __m256i scv = _mm256_blend_epi16(sc, _mm256_slli_epi32(sc, 16), 0xAA);
            for (int s0 = 0; s0 < S / 4; s0 += D) {
                __m256i s16[R];
                for (int s = 0; s < D; ++s) {
                    const int step = g * (S / 4) + s0 + s;
                    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + step * 32));
                    for (int r = 0; r < R; ++r) {
                        const __m256i p = _mm256_maddubs_epi16(w, bcast4(a[r][i].qs + step * 4));
                        s16[r] = s == 0 ? p : _mm256_add_epi16(s16[r], p);
                    }
                }
                for (int r = 0; r < R; ++r) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(s16[r], scv));
            }
        }
        __m256i msum[R];
        for (int r = 0; r < R; ++r) msum[r] = _mm256_setzero_si256();
        for (int p = 0; p < 8; ++p) {
            const __m256i mv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mnp + p * 32));
            for (int r = 0; r < R; ++r)
                msum[r] = _mm256_add_epi32(msum[r], _mm256_madd_epi16(mv, bcast4(a[r][i].bsums + 2 * p)));
        }
        const __m256 dA = _mm256_loadu_ps(dp), dB = _mm256_loadu_ps(dp + NR);
        for (int r = 0; r < R; ++r) {
            const __m256 d = _mm256_set1_ps(a[r][i].d);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(dA, d), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[r]), _mm256_mul_ps(dB, d), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) {
        if (n == NR) {
            _mm256_storeu_ps(y + r * ldy, acc[r]);
        } else {
            alignas(32) float tmp[NR];
            _mm256_store_ps(tmp, acc[r]);
            std::memcpy(y + r * ldy, tmp, sizeof(float) * size_t(n));
        }
    }
}

template <int S, int D>
void gemm(int64_t K, const uint8_t* panel, const uint8_t* act, size_t as, int R, float* y, int64_t ldy, int n) {
    switch (R) {
        case 1: gemm_r<S, D, 1>(K, panel, act, as, y, ldy, n); break;
        case 2: gemm_r<S, D, 2>(K, panel, act, as, y, ldy, n); break;
        case 3: gemm_r<S, D, 3>(K, panel, act, as, y, ldy, n); break;
        default: gemm_r<S, D, 4>(K, panel, act, as, y, ldy, n); break;
    }
}

GemmTable make_table() {
    GemmTable t;
    // D from the largest unsigned quant: Q2_K 3, Q3_K 7, Q4_K 15, Q5_K 31, Q6_K 63.
    // (Q4_K could add 8 steps in 16 bits; 4 measured a little faster.)
    t.k[int(GgmlType::Q2_K)] = {gemm<16, 4>, pack_x86<block_q2_K, 8>, 8, 4};
    t.k[int(GgmlType::Q3_K)] = {gemm<16, 4>, pack_x86<block_q3_K, 8>, 8, 4};
    t.k[int(GgmlType::Q4_K)] = {gemm<32, 4>, pack_x86<block_q4_K, 8>, 8, 4};
    t.k[int(GgmlType::Q5_K)] = {gemm<32, 4>, pack_x86<block_q5_K, 8>, 8, 4};
    t.k[int(GgmlType::Q6_K)] = {gemm<16, 2>, pack_x86<block_q6_K, 8>, 8, 4};
    return t;
}

}  // namespace

const GemmTable* q8_gemm_avx2_table() {
    static const GemmTable t = make_table();
    return &t;
}

}  // namespace qinfer::kernels

#else

#include "quant/cpu_q8_gemm.h"
namespace qinfer::kernels {
const GemmTable* q8_gemm_avx2_table() { return nullptr; }
}  // namespace qinfer::kernels

#endif
