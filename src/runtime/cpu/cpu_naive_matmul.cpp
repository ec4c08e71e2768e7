// TEMPORARY: scalar dequantize + f32 dot products until quant/ provides
// dequantize_row and cpu_matmul. Supports F32, F16, BF16 and Q8_0 only.
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "common/thread_pool.h"
#include "runtime/cpu/cpu_kernels.h"

namespace qinfer::cpu {

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
    switch (t) {
        case GgmlType::F32: {
            const float* s = static_cast<const float*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
            return;
        }
        case GgmlType::F16: {
            const uint16_t* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
            return;
        }
        case GgmlType::BF16: {
            const uint16_t* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
            return;
        }
        case GgmlType::Q8_0: {
            const uint8_t* b = static_cast<const uint8_t*>(src);
            for (int64_t i = 0; i < n; i += 32, b += 34) {
                float d = fp16_to_fp32(uint16_t(b[0] | (b[1] << 8)));
                for (int j = 0; j < 32; ++j) dst[i + j] = d * float(int8_t(b[2 + j]));
            }
            return;
        }
        default: fail(strfmt("dequantize: type %s not supported yet", type_name(t)));
    }
}

void matmul(GgmlType wt, const void* W, int64_t K, int64_t N, const float* x, int64_t T, float* y, int64_t ldy,
            ThreadPool& pool) {
    const size_t rb = row_bytes(wt, K);
    pool.parallel_for((N + 15) / 16, [&](int64_t c, int) {
        std::vector<float> w(static_cast<size_t>(K));
        for (int64_t o = c * 16; o < std::min(N, c * 16 + 16); ++o) {
            dequantize_row(wt, static_cast<const uint8_t*>(W) + size_t(o) * rb, w.data(), K);
            for (int64_t t = 0; t < T; ++t) y[t * ldy + o] = dot(w.data(), x + t * K, K);
        }
    });
}

}  // namespace qinfer::cpu
