// Reference quantization of the legacy 32-element types and of the Q8_K
// activation helper (spec/quants.md §5.6, §7, §8.1-§8.2), plus quantize_row().
// Byte-identical to ggml's quantize_row_*_ref: same float32 operations in the
// same order, same rounding helpers (roundf, truncation, nearest_int).
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/fp16.h"
#include "quant/quant.h"
#include "quant/quant_ref.h"

namespace qinfer {

namespace {

// C's float -> int conversion (truncation toward zero), made total: ggml's
// (int8_t)(x + 8.5f) is undefined for NaN/huge inputs, we clamp instead.
inline int trunc_int(float v) {
    if (!(v > -256.f)) return -256;  // also NaN
    if (v > 256.f) return 256;
    return int(v);
}

// The element with the largest |x| (first one on ties), with its sign.
inline float signed_absmax(const float* x, int n, float* amax_out) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < n; ++j) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    *amax_out = amax;
    return max;
}

inline void min_max(const float* x, int n, float* mn, float* mx) {
    float lo = 3.402823466e+38f, hi = -3.402823466e+38f;
    for (int j = 0; j < n; ++j) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

}  // namespace

void quantize_ref_q4_0(const float* x, block_q4_0* y, int64_t n) {
    for (int64_t i = 0; i < n / QK4_0; ++i, x += QK4_0) {
        float amax;
        const float max = signed_absmax(x, QK4_0, &amax);
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            const int q0 = std::min(15, trunc_int(x[j] * id + 8.5f));
            const int q1 = std::min(15, trunc_int(x[j + QK4_0 / 2] * id + 8.5f));
            y[i].qs[j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
        }
    }
}

void quantize_ref_q4_1(const float* x, block_q4_1* y, int64_t n) {
    for (int64_t i = 0; i < n / QK4_1; ++i, x += QK4_1) {
        float min, max;
        min_max(x, QK4_1, &min, &max);
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        y[i].m = fp32_to_fp16(min);
        for (int j = 0; j < QK4_1 / 2; ++j) {
            const int q0 = std::min(15, trunc_int((x[j] - min) * id + 0.5f));
            const int q1 = std::min(15, trunc_int((x[j + QK4_1 / 2] - min) * id + 0.5f));
            y[i].qs[j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
        }
    }
}

void quantize_ref_q5_0(const float* x, block_q5_0* y, int64_t n) {
    for (int64_t i = 0; i < n / QK5_0; ++i, x += QK5_0) {
        float amax;
        const float max = signed_absmax(x, QK5_0, &amax);
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; ++j) {
            const int q0 = std::min(31, trunc_int(x[j] * id + 16.5f));
            const int q1 = std::min(31, trunc_int(x[j + QK5_0 / 2] * id + 16.5f));
            y[i].qs[j] = uint8_t((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= uint32_t((q0 & 0x10) >> 4) << j;
            qh |= uint32_t((q1 & 0x10) >> 4) << (j + QK5_0 / 2);
        }
        for (int b = 0; b < 4; ++b) y[i].qh[b] = uint8_t(qh >> (8 * b));
    }
}

void quantize_ref_q5_1(const float* x, block_q5_1* y, int64_t n) {
    for (int64_t i = 0; i < n / QK5_1; ++i, x += QK5_1) {
        float min, max;
        min_max(x, QK5_1, &min, &max);
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        y[i].m = fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; ++j) {
            // ggml casts to uint8_t without a clamp: the fit guarantees <= 31.
            const int q0 = trunc_int((x[j] - min) * id + 0.5f) & 0xFF;
            const int q1 = trunc_int((x[j + QK5_1 / 2] - min) * id + 0.5f) & 0xFF;
            y[i].qs[j] = uint8_t((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= uint32_t((q0 & 0x10) >> 4) << j;
            qh |= uint32_t((q1 & 0x10) >> 4) << (j + QK5_1 / 2);
        }
        for (int b = 0; b < 4; ++b) y[i].qh[b] = uint8_t(qh >> (8 * b));
    }
}

void quantize_ref_q8_0(const float* x, block_q8_0* y, int64_t n) {
    for (int64_t i = 0; i < n / QK8_0; ++i, x += QK8_0) {
        float amax = 0.f;
        for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = int8_t(std::round(x[j] * id));
    }
}

void quantize_ref_q8_1(const float* x, block_q8_1* y, int64_t n) {
    for (int64_t i = 0; i < n / QK8_1; ++i, x += QK8_1) {
        float amax = 0.f;
        for (int j = 0; j < QK8_1; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; ++j) {
            y[i].qs[j] = int8_t(std::round(x[j] * id));
            sum += y[i].qs[j];
        }
        y[i].s = fp32_to_fp16(float(sum) * d);
    }
}

void quantize_ref_q8_K(const float* x, block_q8_K* y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        float amax;
        const float max = signed_absmax(x, QK_K, &amax);
        if (!amax) {
            y[i].d = 0;
            std::memset(y[i].qs, 0, sizeof y[i].qs);
            std::memset(y[i].bsums, 0, sizeof y[i].bsums);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; ++j) y[i].qs[j] = int8_t(std::min(127, nearest_int(iscale * x[j])));
        for (int g = 0; g < QK_K / 16; ++g) {
            int sum = 0;
            for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * g + l];
            y[i].bsums[g] = int16_t(sum);
        }
        y[i].d = 1 / iscale;
    }
}

// Every type we read we also write (round trips are tested type by type).
bool can_quantize(GgmlType t) { return can_dequantize(t); }

size_t quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
    if (!can_quantize(t)) fail(strfmt("quantize: unsupported tensor type %s", type_name(t)));
    const TypeTraits& tt = traits(t);
    if (n < 0 || n % tt.block_size != 0)
        fail(strfmt("quantize: %lld elements is not a multiple of the %s block size %u", (long long)n,
                    tt.name, tt.block_size));
    switch (t) {
        case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
        case GgmlType::F16: {
            uint16_t* d = static_cast<uint16_t*>(dst);
            for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
            break;
        }
        case GgmlType::BF16: {
            uint16_t* d = static_cast<uint16_t*>(dst);
            for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
            break;
        }
        case GgmlType::Q4_0: quantize_ref_q4_0(src, static_cast<block_q4_0*>(dst), n); break;
        case GgmlType::Q4_1: quantize_ref_q4_1(src, static_cast<block_q4_1*>(dst), n); break;
        case GgmlType::Q5_0: quantize_ref_q5_0(src, static_cast<block_q5_0*>(dst), n); break;
        case GgmlType::Q5_1: quantize_ref_q5_1(src, static_cast<block_q5_1*>(dst), n); break;
        case GgmlType::Q8_0: quantize_ref_q8_0(src, static_cast<block_q8_0*>(dst), n); break;
        case GgmlType::Q8_1: quantize_ref_q8_1(src, static_cast<block_q8_1*>(dst), n); break;
        case GgmlType::Q2_K: quantize_ref_q2_K(src, static_cast<block_q2_K*>(dst), n); break;
        case GgmlType::Q3_K: quantize_ref_q3_K(src, static_cast<block_q3_K*>(dst), n); break;
        case GgmlType::Q4_K: quantize_ref_q4_K(src, static_cast<block_q4_K*>(dst), n); break;
        case GgmlType::Q5_K: quantize_ref_q5_K(src, static_cast<block_q5_K*>(dst), n); break;
        case GgmlType::Q6_K: quantize_ref_q6_K(src, static_cast<block_q6_K*>(dst), n); break;
        case GgmlType::Q8_K: quantize_ref_q8_K(src, static_cast<block_q8_K*>(dst), n); break;
        default: break;
    }
    return row_bytes(t, n);
}

}  // namespace qinfer
