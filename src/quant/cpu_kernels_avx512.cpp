// AVX512-VNNI kernels (with AVX512VL, so they run on 256-bit vectors): the loops
// of cpu_x86_dot.h with the integer leaf ops fused by VNNI. vpdpbusd multiplies
// u8 x s8 and sums groups of four straight into s32 (replacing maddubs + madd),
// vpdpwssd multiplies s16 pairs and accumulates (replacing madd + add). Both are
// exact, so the results are bit-identical to the AVX2 kernels; the gain is
// fewer instructions per block. Float-weight kernels are the AVX2 ones.
#if defined(__x86_64__) || defined(_M_X64)

#include "quant/cpu_x86_dot.h"

namespace qinfer::kernels {

namespace {

struct OpsVnni {
    static __m256i madd_acc(__m256i acc, __m256i p, __m256i s) { return _mm256_dpwssd_epi32(acc, p, s); }
    // Sign trick as in AVX2: |w| * (a with w's sign); dpbusd has no s16 saturation step.
    static __m256i dot_s8(__m256i w, __m256i a) {
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    }
    static __m256i dot_u8(__m256i u, __m256i a) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a); }
};

}  // namespace

const KernelTable* avx512_table() {
    static const KernelTable t = X86Kernels<OpsVnni>::table();
    return &t;
}

}  // namespace qinfer::kernels

#else

#include "quant/cpu_kernels.h"
namespace qinfer::kernels {
const KernelTable* avx512_table() { return nullptr; }
}  // namespace qinfer::kernels

#endif
