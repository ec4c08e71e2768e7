// Portable dot-product kernels: the fallback for CPUs without AVX2 and the
// reference the SIMD kernels are tested against. Same integer arithmetic as the
// SIMD versions (activations quantized to Q8_0 / Q8_1 / Q8_K); only the order
// of the float accumulation differs.
//
// K-quants go through one generic form. Every K-quant super-block is decoded to
// unsigned quants u[256], sixteen per-16-element scales sc[g] and "min"
// coefficients mn[g], and two float factors, such that
//   dot(w, a) = d_a * (dA * sum_g sc[g] * sum_{e in g} u_e a_e  -  dB * sum_g mn[g] * bsum_a[g])
// (spec/quants.md §6). Q2_K/Q4_K/Q5_K: dB = dmin, mn = the mins. Q3_K/Q6_K are
// symmetric with an offset (q = u - 4 / u - 32): mn = sc and dB = 4d / 32d.
#include <cstring>

#include "common/fp16.h"
#include "quant/blocks.h"
#include "quant/cpu_kernels.h"

namespace qinfer::kernels {

namespace {

struct KDecoded {
    uint8_t u[QK_K];
    int8_t sc[16];
    int8_t mn[16];
    float dA, dB;
};

// Decoders in loop-nest form (no per-element div/mod) so that compilers
// vectorize them for the baseline ISA: this is the only path on non-x86 CPUs.
void decode(const block_q2_K& b, KDecoded& k) {
    for (int h = 0; h < 2; ++h)
        for (int kk = 0; kk < 4; ++kk)
            for (int l = 0; l < 32; ++l) k.u[128 * h + 32 * kk + l] = uint8_t((b.qs[32 * h + l] >> (2 * kk)) & 3);
    for (int g = 0; g < 16; ++g) {
        k.sc[g] = int8_t(b.scales[g] & 0xF);
        k.mn[g] = int8_t(b.scales[g] >> 4);
    }
    k.dA = fp16_to_fp32(b.d);
    k.dB = fp16_to_fp32(b.dmin);
}

void decode(const block_q3_K& b, KDecoded& k) {
    for (int h = 0; h < 2; ++h)
        for (int kk = 0; kk < 4; ++kk) {
            const int bit = 4 * h + kk;
            for (int l = 0; l < 32; ++l) {
                const int low2 = (b.qs[32 * h + l] >> (2 * kk)) & 3;
                const int hb = (b.hmask[l] >> bit) & 1;
                k.u[128 * h + 32 * kk + l] = uint8_t(low2 | (hb << 2));  // = q + 4
            }
        }
    for (int g = 0; g < 16; ++g) k.sc[g] = k.mn[g] = int8_t(q3_K_scale(b.scales, g));
    k.dA = fp16_to_fp32(b.d);
    k.dB = 4.f * k.dA;
}

template <class B>
void decode_q45(const B& b, KDecoded& k, const uint8_t* qh) {
    for (int g = 0; g < 4; ++g) {
        uint8_t* lo = k.u + 64 * g;
        uint8_t* hi = lo + 32;
        for (int l = 0; l < 32; ++l) {
            lo[l] = uint8_t(b.qs[32 * g + l] & 0xF);
            hi[l] = uint8_t(b.qs[32 * g + l] >> 4);
        }
        if (qh)
            for (int l = 0; l < 32; ++l) {
                lo[l] = uint8_t(lo[l] | (((qh[l] >> (2 * g)) & 1) << 4));
                hi[l] = uint8_t(hi[l] | (((qh[l] >> (2 * g + 1)) & 1) << 4));
            }
    }
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, b.scales, &sc, &m);
        k.sc[2 * j] = k.sc[2 * j + 1] = int8_t(sc);
        k.mn[2 * j] = k.mn[2 * j + 1] = int8_t(m);
    }
    k.dA = fp16_to_fp32(b.d);
    k.dB = fp16_to_fp32(b.dmin);
}
void decode(const block_q4_K& b, KDecoded& k) { decode_q45(b, k, nullptr); }
void decode(const block_q5_K& b, KDecoded& k) { decode_q45(b, k, b.qh); }

void decode(const block_q6_K& b, KDecoded& k) {
    for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b.ql + 64 * h;
        const uint8_t* qh = b.qh + 32 * h;
        uint8_t* u = k.u + 128 * h;
        for (int l = 0; l < 32; ++l) {  // = q + 32
            u[l] = uint8_t((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
            u[l + 32] = uint8_t((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            u[l + 64] = uint8_t((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            u[l + 96] = uint8_t((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
    for (int g = 0; g < 16; ++g) k.sc[g] = k.mn[g] = b.scales[g];
    k.dA = fp16_to_fp32(b.d);
    k.dB = 32.f * k.dA;
}

template <class B>
void dot_kquant(int64_t K, const void* w, const void* a, size_t a_stride, int R, float* out, int64_t os) {
    const B* wb = static_cast<const B*>(w);
    float acc[kMaxTile] = {};
    KDecoded k;
    for (int64_t i = 0; i < K / QK_K; ++i) {
        decode(wb[i], k);
        for (int r = 0; r < R; ++r) {
            const block_q8_K& ab =
                reinterpret_cast<const block_q8_K*>(static_cast<const uint8_t*>(a) + r * a_stride)[i];
            int sumi = 0, summ = 0;
            for (int g = 0; g < 16; ++g) {
                int s = 0;
                for (int l = 0; l < 16; ++l) s += int(k.u[16 * g + l]) * int(ab.qs[16 * g + l]);
                sumi += k.sc[g] * s;
                summ += k.mn[g] * ab.bsums[g];
            }
            acc[r] += ab.d * (k.dA * float(sumi) - k.dB * float(summ));
        }
    }
    for (int r = 0; r < R; ++r) out[r * os] = acc[r];
}

// Legacy blocks: signed quants w[32] with scale d (Q4_0, Q5_0, Q8_0 with Q8_0
// activations) or unsigned u[32] with scale d and offset m (Q4_1, Q5_1 with Q8_1).
struct LDecoded {
    int8_t q[32];
    float d, m;
};

void decode(const block_q8_0& b, LDecoded& l) {
    std::memcpy(l.q, b.qs, 32);
    l.d = fp16_to_fp32(b.d);
}
void decode(const block_q4_0& b, LDecoded& l) {
    for (int j = 0; j < 16; ++j) {
        l.q[j] = int8_t((b.qs[j] & 0xF) - 8);
        l.q[j + 16] = int8_t((b.qs[j] >> 4) - 8);
    }
    l.d = fp16_to_fp32(b.d);
}
void decode(const block_q5_0& b, LDecoded& l) {
    const uint32_t qh = load_qh32(b.qh);
    for (int j = 0; j < 16; ++j) {
        l.q[j] = int8_t(((b.qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
        l.q[j + 16] = int8_t(((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
    l.d = fp16_to_fp32(b.d);
}
void decode(const block_q4_1& b, LDecoded& l) {
    for (int j = 0; j < 16; ++j) {
        l.q[j] = int8_t(b.qs[j] & 0xF);
        l.q[j + 16] = int8_t(b.qs[j] >> 4);
    }
    l.d = fp16_to_fp32(b.d);
    l.m = fp16_to_fp32(b.m);
}
void decode(const block_q5_1& b, LDecoded& l) {
    const uint32_t qh = load_qh32(b.qh);
    for (int j = 0; j < 16; ++j) {
        l.q[j] = int8_t((b.qs[j] & 0xF) | (((qh >> j) & 1) << 4));
        l.q[j + 16] = int8_t((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    l.d = fp16_to_fp32(b.d);
    l.m = fp16_to_fp32(b.m);
}

template <class B>
void dot_legacy_q8_0(int64_t K, const void* w, const void* a, size_t a_stride, int R, float* out, int64_t os) {
    const B* wb = static_cast<const B*>(w);
    float acc[kMaxTile] = {};
    LDecoded l;
    for (int64_t i = 0; i < K / 32; ++i) {
        decode(wb[i], l);
        for (int r = 0; r < R; ++r) {
            const block_q8_0& ab =
                reinterpret_cast<const block_q8_0*>(static_cast<const uint8_t*>(a) + r * a_stride)[i];
            int s = 0;
            for (int j = 0; j < 32; ++j) s += int(l.q[j]) * int(ab.qs[j]);
            acc[r] += (l.d * fp16_to_fp32(ab.d)) * float(s);
        }
    }
    for (int r = 0; r < R; ++r) out[r * os] = acc[r];
}

template <class B>
void dot_legacy_q8_1(int64_t K, const void* w, const void* a, size_t a_stride, int R, float* out, int64_t os) {
    const B* wb = static_cast<const B*>(w);
    float acc[kMaxTile] = {};
    LDecoded l;
    for (int64_t i = 0; i < K / 32; ++i) {
        decode(wb[i], l);
        for (int r = 0; r < R; ++r) {
            const block_q8_1& ab =
                reinterpret_cast<const block_q8_1*>(static_cast<const uint8_t*>(a) + r * a_stride)[i];
            int s = 0;
            for (int j = 0; j < 32; ++j) s += int(l.q[j]) * int(ab.qs[j]);
            acc[r] += (l.d * fp16_to_fp32(ab.d)) * float(s) + l.m * fp16_to_fp32(ab.s);
        }
    }
    for (int r = 0; r < R; ++r) out[r * os] = acc[r];
}

inline float load_w(const float* w, int64_t i) { return w[i]; }
inline float load_w(const uint16_t* w, int64_t i) { return fp16_to_fp32(w[i]); }
struct Bf16 { uint16_t bits; };
inline float load_w(const Bf16* w, int64_t i) { return bf16_to_fp32(w[i].bits); }

template <class W>
void dot_float(int64_t K, const void* w, const void* a, size_t a_stride, int R, float* out, int64_t os) {
    const W* wp = static_cast<const W*>(w);
    for (int r = 0; r < R; ++r) {
        const float* x = reinterpret_cast<const float*>(static_cast<const uint8_t*>(a) + r * a_stride);
        // Four partial sums, like the SIMD kernels, to keep the rounding error comparable.
        float s[4] = {};
        int64_t i = 0;
        for (; i + 4 <= K; i += 4)
            for (int j = 0; j < 4; ++j) s[j] += load_w(wp, i + j) * x[i + j];
        for (; i < K; ++i) s[0] += load_w(wp, i) * x[i];
        out[r * os] = (s[0] + s[1]) + (s[2] + s[3]);
    }
}

KernelTable make_table() {
    KernelTable t;
    auto set = [&](GgmlType ty, DotFn f) { t.dot[int(ty)] = f; };
    set(GgmlType::F32, dot_float<float>);
    set(GgmlType::F16, dot_float<uint16_t>);
    set(GgmlType::BF16, dot_float<Bf16>);
    set(GgmlType::Q8_0, dot_legacy_q8_0<block_q8_0>);
    set(GgmlType::Q4_0, dot_legacy_q8_0<block_q4_0>);
    set(GgmlType::Q5_0, dot_legacy_q8_0<block_q5_0>);
    set(GgmlType::Q4_1, dot_legacy_q8_1<block_q4_1>);
    set(GgmlType::Q5_1, dot_legacy_q8_1<block_q5_1>);
    set(GgmlType::Q2_K, dot_kquant<block_q2_K>);
    set(GgmlType::Q3_K, dot_kquant<block_q3_K>);
    set(GgmlType::Q4_K, dot_kquant<block_q4_K>);
    set(GgmlType::Q5_K, dot_kquant<block_q5_K>);
    set(GgmlType::Q6_K, dot_kquant<block_q6_K>);
    return t;
}

}  // namespace

const KernelTable* scalar_table() {
    static const KernelTable t = make_table();
    return &t;
}

}  // namespace qinfer::kernels
