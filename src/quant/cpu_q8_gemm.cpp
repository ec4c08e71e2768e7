// Panel packing for the int8 tile kernels (shared by every ISA: it runs once
// per weight row and call, the kernels run once per activation row), the
// portable tile kernel (the reference for the SIMD ones: same integers, same
// float expression as the portable dot kernels), and kernel selection.
#include "quant/cpu_q8_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/fp16.h"
#include "quant/blocks.h"

namespace qinfer::kernels {

namespace {

// One super-block in generic form, everything per group of 16.
struct KBlock {
    uint8_t u[QK_K];
    int sc[16];
    int mn[16];
    float dA, dB;
};

void decode_scales(const block_q2_K& b, KBlock& k) {
    for (int g = 0; g < 16; ++g) {
        k.sc[g] = b.scales[g] & 0xF;
        k.mn[g] = b.scales[g] >> 4;
    }
    k.dA = fp16_to_fp32(b.d);
    k.dB = fp16_to_fp32(b.dmin);
}
void decode(const block_q2_K& b, KBlock& k) {
    for (int h = 0; h < 2; ++h)
        for (int s = 0; s < 4; ++s)
            for (int l = 0; l < 32; ++l) k.u[128 * h + 32 * s + l] = uint8_t((b.qs[32 * h + l] >> (2 * s)) & 3);
    decode_scales(b, k);
}

void decode_scales(const block_q3_K& b, KBlock& k) {
    for (int g = 0; g < 16; ++g) k.sc[g] = k.mn[g] = q3_K_scale(b.scales, g);
    k.dA = fp16_to_fp32(b.d);
    k.dB = 4.f * k.dA;
}
void decode(const block_q3_K& b, KBlock& k) {
    for (int h = 0; h < 2; ++h)
        for (int s = 0; s < 4; ++s)
            for (int l = 0; l < 32; ++l) {
                const int hb = (b.hmask[l] >> (4 * h + s)) & 1;
                k.u[128 * h + 32 * s + l] = uint8_t(((b.qs[32 * h + l] >> (2 * s)) & 3) | (hb << 2));  // q + 4
            }
    decode_scales(b, k);
}

template <class B>
void decode_scales_q45(const B& b, KBlock& k) {
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, b.scales, &sc, &m);
        k.sc[2 * j] = k.sc[2 * j + 1] = sc;
        k.mn[2 * j] = k.mn[2 * j + 1] = m;
    }
    k.dA = fp16_to_fp32(b.d);
    k.dB = fp16_to_fp32(b.dmin);
}

template <class B>
void decode_q45(const B& b, KBlock& k, const uint8_t* qh) {
    for (int g = 0; g < 4; ++g)
        for (int l = 0; l < 32; ++l) {
            int lo = b.qs[32 * g + l] & 0xF, hi = b.qs[32 * g + l] >> 4;
            if (qh) {
                lo |= ((qh[l] >> (2 * g)) & 1) << 4;
                hi |= ((qh[l] >> (2 * g + 1)) & 1) << 4;
            }
            k.u[64 * g + l] = uint8_t(lo);
            k.u[64 * g + 32 + l] = uint8_t(hi);
        }
    decode_scales_q45(b, k);
}
void decode(const block_q4_K& b, KBlock& k) { decode_q45(b, k, nullptr); }
void decode(const block_q5_K& b, KBlock& k) { decode_q45(b, k, b.qh); }

void decode_scales(const block_q6_K& b, KBlock& k) {
    for (int g = 0; g < 16; ++g) k.sc[g] = k.mn[g] = b.scales[g];
    k.dA = fp16_to_fp32(b.d);
    k.dB = 32.f * k.dA;
}
void decode(const block_q6_K& b, KBlock& k) {
    for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b.ql + 64 * h;
        const uint8_t* qh = b.qh + 32 * h;
        uint8_t* u = k.u + 128 * h;
        for (int l = 0; l < 32; ++l) {  // q + 32
            u[l] = uint8_t((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
            u[l + 32] = uint8_t((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            u[l + 64] = uint8_t((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            u[l + 96] = uint8_t((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
    decode_scales(b, k);
}

template <class B>
void pack(const uint8_t* W, size_t rb, int n, int nr, int64_t K, int S, uint8_t* panel) {
    const int ng = QK_K / S;
    const size_t sbb = q8_superblock_bytes(S, nr);
    KBlock k;
    for (int64_t i = 0; i < K / QK_K; ++i) {
        uint8_t* q = panel + size_t(i) * sbb;
        int32_t* sc = reinterpret_cast<int32_t*>(q + QK_K * nr);
        int32_t* mn = sc + ng * nr;
        float* dA = reinterpret_cast<float*>(mn + 8 * nr);
        float* dB = dA + nr;
        for (int j = 0; j < nr; ++j) {
            if (j < n) {
                decode(reinterpret_cast<const B*>(W + size_t(j) * rb)[i], k);
            } else {
                std::memset(&k, 0, sizeof k);
            }
            for (int s = 0; s < QK_K / 4; ++s) std::memcpy(q + (size_t(s) * nr + j) * 4, k.u + 4 * s, 4);
            for (int g = 0; g < ng; ++g) sc[g * nr + j] = k.sc[g * (S / 16)];
            for (int p = 0; p < 8; ++p)
                mn[p * nr + j] = int32_t(uint32_t(uint16_t(k.mn[2 * p])) | (uint32_t(uint16_t(k.mn[2 * p + 1])) << 16));
            dA[j] = k.dA;
            dB[j] = k.dB;
        }
    }
}

// Portable tile kernel: one output at a time, integers exactly as the SIMD
// kernels compute them, and the float step of the portable dot kernel.
template <int S>
void gemm_scalar(int64_t K, const uint8_t* panel, const uint8_t* act, size_t as, int R, float* y, int64_t ldy,
                 int n) {
    constexpr int NR = 8, NG = QK_K / S;
    constexpr size_t sbb = q8_superblock_bytes(S, NR);
    for (int r = 0; r < R; ++r) {
        const block_q8_K* a = reinterpret_cast<const block_q8_K*>(act + size_t(r) * as);
        for (int j = 0; j < n; ++j) {
            float acc = 0.f;
            for (int64_t i = 0; i < K / QK_K; ++i) {
                const uint8_t* q = panel + size_t(i) * sbb;
                const int32_t* sc = reinterpret_cast<const int32_t*>(q + QK_K * NR);
                const int32_t* mn = sc + NG * NR;
                const float* dA = reinterpret_cast<const float*>(mn + 8 * NR);
                const float* dB = dA + NR;
                int sumi = 0, summ = 0;
                for (int g = 0; g < NG; ++g) {
                    int s = 0;
                    for (int e = g * S; e < (g + 1) * S; ++e)
                        s += int(q[(size_t(e / 4) * NR + j) * 4 + e % 4]) * int(a[i].qs[e]);
                    sumi += sc[g * NR + j] * s;
                }
                for (int p = 0; p < 8; ++p) {
                    const uint32_t m = uint32_t(mn[p * NR + j]);
                    summ += int(int16_t(m & 0xFFFF)) * a[i].bsums[2 * p] + int(int16_t(m >> 16)) * a[i].bsums[2 * p + 1];
                }
                acc += a[i].d * (dA[j] * float(sumi) - dB[j] * float(summ));
            }
            y[r * ldy + j] = acc;
        }
    }
}

GemmTable make_scalar_table() {
    GemmTable t;
    for (GgmlType ty : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
        t.k[int(ty)] = {q8_group_size(ty) == 32 ? gemm_scalar<32> : gemm_scalar<16>, nullptr, 8, 4};
    return t;
}

}  // namespace

int q8_group_size(GgmlType wt) {
    switch (wt) {
        case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q6_K: return 16;
        case GgmlType::Q4_K: case GgmlType::Q5_K: return 32;
        default: return 0;
    }
}

size_t q8_panel_bytes(GgmlType wt, int64_t K, int nr) {
    return size_t(K / QK_K) * q8_superblock_bytes(q8_group_size(wt), nr);
}

void q8_pack_panel(GgmlType wt, const uint8_t* W, size_t rb, int n, int nr, int64_t K, uint8_t* panel) {
    const int S = q8_group_size(wt);
    switch (wt) {
        case GgmlType::Q2_K: pack<block_q2_K>(W, rb, n, nr, K, S, panel); break;
        case GgmlType::Q3_K: pack<block_q3_K>(W, rb, n, nr, K, S, panel); break;
        case GgmlType::Q4_K: pack<block_q4_K>(W, rb, n, nr, K, S, panel); break;
        case GgmlType::Q5_K: pack<block_q5_K>(W, rb, n, nr, K, S, panel); break;
        case GgmlType::Q6_K: pack<block_q6_K>(W, rb, n, nr, K, S, panel); break;
        default: break;
    }
}

const GemmTable* q8_gemm_scalar_table() {
    static const GemmTable t = make_scalar_table();
    return &t;
}

GemmKernel pick_gemm(Isa isa, GgmlType wt) {
    const int id = int(wt);
    if (id < 0 || id >= kTypeSlots) return {};
    if (isa == Isa::Scalar) return q8_gemm_scalar_table()->k[id];
    if (isa == Isa::Avx512 && q8_gemm_avx512_table() && q8_gemm_avx512_table()->k[id].fn)
        return q8_gemm_avx512_table()->k[id];
    if (isa >= Isa::Avx2 && q8_gemm_avx2_table() && q8_gemm_avx2_table()->k[id].fn)
        return q8_gemm_avx2_table()->k[id];
    return q8_gemm_scalar_table()->k[id];
}

int q8_gemm_min_rows(GgmlType wt) {
    // QINFER_CPU_GEMM_MIN_ROWS overrides the crossover (measurements only).
    static const int forced = [] {
        const char* env = std::getenv("QINFER_CPU_GEMM_MIN_ROWS");
        return env ? std::max(0, std::atoi(env)) : 0;
    }();
    if (forced > 0) return forced;
    // quant_bench BM_MatmulSmallT (K 2560, N 9216, AVX2, 1 thread): repacking
    // costs about 4 activation rows of Q4_K work (~1.7 ms for 9216 rows) and
    // ~10 of Q6_K (whose kernel gains less: 16-value scale groups). Q4_K breaks
    // even below 16 rows, Q6_K between 16 and 32; Q2_K/Q3_K not measured.
    return wt == GgmlType::Q4_K || wt == GgmlType::Q5_K ? 16 : 32;
}

}  // namespace qinfer::kernels
