// The order Backend::top_k selects by, one number per logit, shared by the CPU
// fallback (backend.cpp) and the CUDA kernels (cuda/sampling.cu) so both pick
// the same candidates: the logit (-0 as +0, NaN below -inf) in the high half,
// the inverted index below it, so the lower index wins among equal logits, as
// the sampler orders candidates. Larger is better.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QINFER_HOST_DEVICE __host__ __device__
#else
#define QINFER_HOST_DEVICE
#endif

namespace qinfer {

QINFER_HOST_DEVICE inline uint64_t top_k_order(float v, int64_t index) {
    uint32_t key = 0;  // NaN: below everything
    if (v == v) {
        if (v == 0.0f) v = 0.0f;  // -0 == +0
        uint32_t u;
        memcpy(&u, &v, 4);
        key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    return uint64_t(key) << 32 | uint32_t(0xffffffffu - uint32_t(index));
}

QINFER_HOST_DEVICE inline int64_t top_k_index(uint64_t order) { return int64_t(0xffffffffu - uint32_t(order)); }

}  // namespace qinfer
