// AVX2 + FMA + F16C kernels: integer products with _mm256_maddubs_epi16
// (u8 x s8 pairs -> s16) and _mm256_madd_epi16 (-> s32). The loops live in
// cpu_x86_dot.h; this file supplies the leaf ops.
#if defined(__x86_64__) || defined(_M_X64)

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

}  // namespace

const KernelTable* avx2_table() {
    static const KernelTable t = X86Kernels<OpsAvx2>::table();
    return &t;
}

}  // namespace qinfer::kernels

#else  // not x86-64: no AVX2 kernels in this build

#include "quant/cpu_kernels.h"
namespace qinfer::kernels {
const KernelTable* avx2_table() { return nullptr; }
}  // namespace qinfer::kernels

#endif
