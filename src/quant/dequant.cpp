// Scalar reference dequantization (spec/quants.md §3-§5). Bit-exact with ggml's
// dequantize_row_*: every formula keeps ggml's float32 evaluation order, e.g.
// (d * sc) * q - (dmin * m). This file is compiled for baseline x86-64, so the
// compiler cannot contract those products into FMAs.
#include <cstring>

#include "common/error.h"
#include "common/fp16.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace qinfer {

namespace {

void check_row(GgmlType t, int64_t n, const char* what) {
    const TypeTraits& tt = traits(t);
    if (n < 0 || n % tt.block_size != 0)
        fail(strfmt("%s: %lld elements is not a multiple of the %s block size %u", what, (long long)n,
                    tt.name, tt.block_size));
}

void deq_q4_0(const block_q4_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            y[j] = float((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = float((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void deq_q4_1(const block_q4_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
        const float d = fp16_to_fp32(x[i].d), m = fp16_to_fp32(x[i].m);
        for (int j = 0; j < QK4_1 / 2; ++j) {
            y[j] = float(x[i].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = float(x[i].qs[j] >> 4) * d + m;
        }
    }
}

void deq_q5_0(const block_q5_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
        const float d = fp16_to_fp32(x[i].d);
        const uint32_t qh = load_qh32(x[i].qh);
        for (int j = 0; j < QK5_0 / 2; ++j) {
            const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = float(((x[i].qs[j] & 0x0F) | h0) - 16) * d;
            y[j + QK5_0 / 2] = float(((x[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

void deq_q5_1(const block_q5_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
        const float d = fp16_to_fp32(x[i].d), m = fp16_to_fp32(x[i].m);
        const uint32_t qh = load_qh32(x[i].qh);
        for (int j = 0; j < QK5_1 / 2; ++j) {
            const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = float((x[i].qs[j] & 0x0F) | h0) * d + m;
            y[j + QK5_1 / 2] = float((x[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

void deq_q8_0(const block_q8_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_0; ++j) y[j] = float(x[i].qs[j]) * d;
    }
}

void deq_q8_1(const block_q8_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK8_1) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_1; ++j) y[j] = float(x[i].qs[j]) * d;
    }
}

void deq_q2_K(const block_q2_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d), dmin = fp16_to_fp32(x[i].dmin);
        const uint8_t* q = x[i].qs;
        int is = 0;
        for (int h = 0; h < 2; ++h, q += 32) {
            for (int k = 0; k < 4; ++k) {
                for (int half = 0; half < 2; ++half) {  // two 16-element sub-blocks per shift
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
                    for (int l = 0; l < 16; ++l) *y++ = dl * float((q[16 * half + l] >> (2 * k)) & 3) - ml;
                }
            }
        }
    }
}

void deq_q3_K(const block_q3_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const uint8_t* q = x[i].qs;
        int is = 0;
        for (int h = 0; h < 2; ++h, q += 32) {
            for (int k = 0; k < 4; ++k) {
                const uint8_t m = uint8_t(1u << (4 * h + k));
                for (int half = 0; half < 2; ++half) {
                    const float dl = d * float(q3_K_scale(x[i].scales, is++));
                    for (int l = 16 * half; l < 16 * half + 16; ++l) {
                        const int q3 = ((q[l] >> (2 * k)) & 3) - ((x[i].hmask[l] & m) ? 0 : 4);
                        *y++ = dl * float(q3);
                    }
                }
            }
        }
    }
}

void deq_q4_K(const block_q4_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d), dmin = fp16_to_fp32(x[i].dmin);
        const uint8_t* q = x[i].qs;
        for (int g = 0; g < 4; ++g, q += 32) {
            uint8_t sc, m;
            get_scale_min_k4(2 * g, x[i].scales, &sc, &m);
            const float d1 = d * float(sc), m1 = dmin * float(m);
            get_scale_min_k4(2 * g + 1, x[i].scales, &sc, &m);
            const float d2 = d * float(sc), m2 = dmin * float(m);
            for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
        }
    }
}

void deq_q5_K(const block_q5_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d), dmin = fp16_to_fp32(x[i].dmin);
        const uint8_t* ql = x[i].qs;
        const uint8_t* qh = x[i].qh;
        for (int g = 0; g < 4; ++g, ql += 32) {
            const uint8_t u1 = uint8_t(1u << (2 * g)), u2 = uint8_t(2u << (2 * g));
            uint8_t sc, m;
            get_scale_min_k4(2 * g, x[i].scales, &sc, &m);
            const float d1 = d * float(sc), m1 = dmin * float(m);
            get_scale_min_k4(2 * g + 1, x[i].scales, &sc, &m);
            const float d2 = d * float(sc), m2 = dmin * float(m);
            for (int l = 0; l < 32; ++l) *y++ = d1 * float((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

void deq_q6_K(const block_q6_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        for (int h = 0; h < 2; ++h) {
            const uint8_t* ql = x[i].ql + 64 * h;
            const uint8_t* qh = x[i].qh + 32 * h;
            const int8_t* sc = x[i].scales + 8 * h;
            float* yh = y + 128 * h;
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                yh[l] = d * float(sc[is + 0]) * float(q1);
                yh[l + 32] = d * float(sc[is + 2]) * float(q2);
                yh[l + 64] = d * float(sc[is + 4]) * float(q3);
                yh[l + 96] = d * float(sc[is + 6]) * float(q4);
            }
        }
        y += QK_K;
    }
}

void deq_q8_K(const block_q8_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K)
        for (int j = 0; j < QK_K; ++j) y[j] = x[i].d * float(x[i].qs[j]);
}

}  // namespace

bool can_dequantize(GgmlType t) {
    switch (t) {
        case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16:
        case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
        case GgmlType::Q8_0: case GgmlType::Q8_1:
        case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K:
        case GgmlType::Q6_K: case GgmlType::Q8_K:
            return true;
        default:
            return false;
    }
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
    if (!can_dequantize(t)) fail(strfmt("dequantize: unsupported tensor type %s", type_name(t)));
    check_row(t, n, "dequantize");
    const int64_t nb = n / traits(t).block_size;
    switch (t) {
        case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
        case GgmlType::F16: {
            const uint16_t* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
            break;
        }
        case GgmlType::BF16: {
            const uint16_t* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
            break;
        }
        case GgmlType::Q4_0: deq_q4_0(static_cast<const block_q4_0*>(src), dst, nb); break;
        case GgmlType::Q4_1: deq_q4_1(static_cast<const block_q4_1*>(src), dst, nb); break;
        case GgmlType::Q5_0: deq_q5_0(static_cast<const block_q5_0*>(src), dst, nb); break;
        case GgmlType::Q5_1: deq_q5_1(static_cast<const block_q5_1*>(src), dst, nb); break;
        case GgmlType::Q8_0: deq_q8_0(static_cast<const block_q8_0*>(src), dst, nb); break;
        case GgmlType::Q8_1: deq_q8_1(static_cast<const block_q8_1*>(src), dst, nb); break;
        case GgmlType::Q2_K: deq_q2_K(static_cast<const block_q2_K*>(src), dst, nb); break;
        case GgmlType::Q3_K: deq_q3_K(static_cast<const block_q3_K*>(src), dst, nb); break;
        case GgmlType::Q4_K: deq_q4_K(static_cast<const block_q4_K*>(src), dst, nb); break;
        case GgmlType::Q5_K: deq_q5_K(static_cast<const block_q5_K*>(src), dst, nb); break;
        case GgmlType::Q6_K: deq_q6_K(static_cast<const block_q6_K*>(src), dst, nb); break;
        case GgmlType::Q8_K: deq_q8_K(static_cast<const block_q8_K*>(src), dst, nb); break;
        default: break;
    }
}

}  // namespace qinfer
