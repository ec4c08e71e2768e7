#include "runtime/cuda/layout.h"

#include <cstring>

#include "common/error.h"
#include "quant/blocks.h"

namespace qinfer::cuda {

bool cuda_supports_weight_type(GgmlType t) {
    switch (t) {
        case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16:
        case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
        case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
            return true;
        default:
            return false;
    }
}

WeightLayout weight_layout(GgmlType t, int64_t n_blocks) {
    WeightLayout l;
    const size_t nb = size_t(n_blocks);
    switch (t) {
        case GgmlType::Q4_0: l.main_bytes = 16; l.d_bytes = 2; break;
        case GgmlType::Q4_1: l.main_bytes = 16; l.d_bytes = 4; break;
        case GgmlType::Q5_0: l.main_bytes = 16; l.qh_bytes = 4; l.d_bytes = 2; break;
        case GgmlType::Q5_1: l.main_bytes = 16; l.qh_bytes = 4; l.d_bytes = 4; break;
        case GgmlType::Q8_0: l.main_bytes = 32; l.d_bytes = 2; break;
        case GgmlType::Q6_K: l.main_bytes = 208; l.d_bytes = 2; break;
        default:
            l.main_bytes = traits(t).type_size;
            l.total = l.main_bytes * nb;
            return l;
    }
    l.repacked = true;
    l.off_qh = align16(l.main_bytes * nb);
    l.off_d = align16(l.off_qh + l.qh_bytes * nb);
    l.total = align16(l.off_d + l.d_bytes * nb);
    return l;
}

void repack_blocks(GgmlType t, const void* src, int64_t count, void* main, void* qh, void* d) {
    uint8_t* m = static_cast<uint8_t*>(main);
    uint8_t* h = static_cast<uint8_t*>(qh);
    uint8_t* dd = static_cast<uint8_t*>(d);
    const size_t n = size_t(count);
    switch (t) {
        case GgmlType::Q4_0: {
            const block_q4_0* b = static_cast<const block_q4_0*>(src);
            for (size_t i = 0; i < n; ++i) {
                std::memcpy(m + 16 * i, b[i].qs, 16);
                std::memcpy(dd + 2 * i, &b[i].d, 2);
            }
            return;
        }
        case GgmlType::Q4_1: {
            const block_q4_1* b = static_cast<const block_q4_1*>(src);
            for (size_t i = 0; i < n; ++i) {
                std::memcpy(m + 16 * i, b[i].qs, 16);
                std::memcpy(dd + 4 * i, &b[i].d, 2);
                std::memcpy(dd + 4 * i + 2, &b[i].m, 2);
            }
            return;
        }
        case GgmlType::Q5_0: {
            const block_q5_0* b = static_cast<const block_q5_0*>(src);
            for (size_t i = 0; i < n; ++i) {
                std::memcpy(m + 16 * i, b[i].qs, 16);
                std::memcpy(h + 4 * i, b[i].qh, 4);
                std::memcpy(dd + 2 * i, &b[i].d, 2);
            }
            return;
        }
        case GgmlType::Q5_1: {
            const block_q5_1* b = static_cast<const block_q5_1*>(src);
            for (size_t i = 0; i < n; ++i) {
                std::memcpy(m + 16 * i, b[i].qs, 16);
                std::memcpy(h + 4 * i, b[i].qh, 4);
                std::memcpy(dd + 4 * i, &b[i].d, 2);
                std::memcpy(dd + 4 * i + 2, &b[i].m, 2);
            }
            return;
        }
        case GgmlType::Q8_0: {
            const block_q8_0* b = static_cast<const block_q8_0*>(src);
            for (size_t i = 0; i < n; ++i) {
                std::memcpy(m + 32 * i, b[i].qs, 32);
                std::memcpy(dd + 2 * i, &b[i].d, 2);
            }
            return;
        }
        case GgmlType::Q6_K: {
            const block_q6_K* b = static_cast<const block_q6_K*>(src);
            for (size_t i = 0; i < n; ++i) {
                std::memcpy(m + 208 * i, b[i].ql, 128);
                std::memcpy(m + 208 * i + 128, b[i].qh, 64);
                std::memcpy(m + 208 * i + 192, b[i].scales, 16);
                std::memcpy(dd + 2 * i, &b[i].d, 2);
            }
            return;
        }
        default:
            std::memcpy(m, src, n * traits(t).type_size);
            return;
    }
}

void repack_weight(GgmlType t, const void* src, int64_t n_blocks, void* dst) {
    const WeightLayout l = weight_layout(t, n_blocks);
    uint8_t* base = static_cast<uint8_t*>(dst);
    std::memset(base, 0, l.total);
    repack_blocks(t, src, n_blocks, base, l.qh_bytes ? base + l.off_qh : nullptr,
                  l.d_bytes ? base + l.off_d : nullptr);
}

}  // namespace qinfer::cuda
