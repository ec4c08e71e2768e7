// Prefill matrix products on the int8 tensor cores (mma.sync m16n8k32 /
// m16n8k16, sm_80+), from the same quantized activations as the decode path,
// so results equal matmul_vec up to float rounding.
//
// Block tile: 64 weight rows x 64 tokens, 4 warps (2 x 2) of 32 x 32. The K
// loop walks 256-element stages: the weights of the stage are unpacked to int8
// in shared memory with their per-sub-block integer scales, the activations
// are copied as they are. Per 32 (Q6_K: 16) elements one mma gives an exact
// integer partial sum; K-quants scale it by the integer sub-block scale and sum
// in int32 over the 256-element super-block (their activation scale is per
// super-block), the mins go through the activations' 16-element sums; the
// legacy types (Q8_0 / Q4_0 / Q5_0, per-32 float scales on both sides) scale
// each partial in float. One float multiply-add per super-block and element
// then applies d_w * d_a, as ggml's vec_dot_*_q8_* does.
#include <cstdlib>

#include "common/env.h"
#include "common/error.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/quant_dot.cuh"

namespace qinfer::cuda {

namespace {

constexpr int BM = 64, BN = 64, STAGE = 256, PAD = 16, LDS = STAGE + PAD;
constexpr int MMA_THREADS = 128;

__device__ __forceinline__ void mma_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

struct Smem {
    int8_t a[BM][LDS];   // unpacked weights of the stage
    int8_t b[BN][LDS];   // activations of the stage
    int sc[BM][16];      // integer sub-block scales (K-quants)
    int mn[BM][8];       // integer sub-block mins (Q4_K / Q5_K)
    float dw[BM][8];     // d (and dmin in [1]) for K-quants; per-32 block scale for legacy types
    float dmin[BM];
    float da[BN][8];     // activation scale: [0] per super-block (Q8_K), per 32-block (Q8_0)
    int bs[BN][8];       // activation sums over 32 elements (Q8_K)
};

// Unpacks the stage (super-block kb, or 8 legacy blocks from 8*kb) of row r;
// thread half h (0, 1) does half of it.
template <GgmlType TY> __device__ void unpack_row(const WArgs& w, int64_t row, int64_t kb, int nblk, int h, Smem& s, int r);

// The eight scales and mins, d and dmin of a Q4_K / Q5_K header (hd: its
// first 16 bytes) into row r of the stage.
__device__ __forceinline__ void store_k4_header(Smem& s, int r, const int4& hd) {
#pragma unroll
    for (int g = 0; g < 4; ++g)
        get_scale_min_k4_pair(g, hd.y, hd.z, hd.w, s.sc[r][2 * g], s.mn[r][2 * g], s.sc[r][2 * g + 1],
                              s.mn[r][2 * g + 1]);
    s.dw[r][0] = h2f(uint16_t(hd.x & 0xFFFF));
    s.dmin[r] = h2f(uint16_t(uint32_t(hd.x) >> 16));
}

template <> __device__ void unpack_row<GgmlType::Q4_K>(const WArgs& w, int64_t row, int64_t kb, int, int h, Smem& s, int r) {
    const uint8_t* b = w.base + 144 * (row * w.bpr + kb);
    const int4 hd = ld16(b);
#pragma unroll
    for (int gg = 0; gg < 2; ++gg) {
        const int g = 2 * h + gg;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int4 q = ld16(b + 16 + 32 * g + 16 * c);
            const int4 lo = and4(q, 0x0F0F0F0F), hi = and4(shr4(q, 4), 0x0F0F0F0F);
            *reinterpret_cast<int4*>(&s.a[r][64 * g + 16 * c]) = lo;
            *reinterpret_cast<int4*>(&s.a[r][64 * g + 32 + 16 * c]) = hi;
        }
    }
    if (h == 0) store_k4_header(s, r, hd);
}

template <> __device__ void unpack_row<GgmlType::Q5_K>(const WArgs& w, int64_t row, int64_t kb, int, int h, Smem& s, int r) {
    const uint8_t* b = w.base + 176 * (row * w.bpr + kb);
    const int4 hd = ld16(b);
#pragma unroll
    for (int gg = 0; gg < 2; ++gg) {
        const int g = 2 * h + gg;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int4 qh = ld16(b + 16 + 16 * c);
            const int4 q = ld16(b + 48 + 32 * g + 16 * c);
            const int4 bl = and4(shr4(qh, 2 * g), 0x01010101), bh = and4(shr4(qh, 2 * g + 1), 0x01010101);
            const int4 lo = or4(and4(q, 0x0F0F0F0F), make_int4(bl.x << 4, bl.y << 4, bl.z << 4, bl.w << 4));
            const int4 hi = or4(and4(shr4(q, 4), 0x0F0F0F0F), make_int4(bh.x << 4, bh.y << 4, bh.z << 4, bh.w << 4));
            *reinterpret_cast<int4*>(&s.a[r][64 * g + 16 * c]) = lo;
            *reinterpret_cast<int4*>(&s.a[r][64 * g + 32 + 16 * c]) = hi;
        }
    }
    if (h == 0) store_k4_header(s, r, hd);
}

// Q6_K: quants stored as q - 32 (signed), 16 sub-blocks of 16 with int8 scales.
template <> __device__ void unpack_row<GgmlType::Q6_K>(const WArgs& w, int64_t row, int64_t kb, int, int h, Smem& s, int r) {
    const int64_t blk = row * w.bpr + kb;
    const uint8_t* b = w.base + 208 * blk;
    const int n = h;  // half of 128 elements
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int l0 = 16 * u;
        const int4 qa = ld16(b + 64 * n + l0), qb = ld16(b + 64 * n + 32 + l0), qh = ld16(b + 128 + 32 * n + l0);
        const int4 q1 = or4(and4(qa, 0x0F0F0F0F), and4(make_int4(qh.x << 4, qh.y << 4, qh.z << 4, qh.w << 4), 0x30303030));
        const int4 q2 = or4(and4(qb, 0x0F0F0F0F), and4(make_int4(qh.x << 2, qh.y << 2, qh.z << 2, qh.w << 2), 0x30303030));
        const int4 q3 = or4(and4(shr4(qa, 4), 0x0F0F0F0F), and4(qh, 0x30303030));
        const int4 q4 = or4(and4(shr4(qb, 4), 0x0F0F0F0F), and4(shr4(qh, 2), 0x30303030));
        auto sub32 = [](int4 v) {  // bytes 0..63 -> -32..31
            return make_int4(int(__vsub4(uint32_t(v.x), 0x20202020u)), int(__vsub4(uint32_t(v.y), 0x20202020u)),
                             int(__vsub4(uint32_t(v.z), 0x20202020u)), int(__vsub4(uint32_t(v.w), 0x20202020u)));
        };
        *reinterpret_cast<int4*>(&s.a[r][128 * n + l0]) = sub32(q1);
        *reinterpret_cast<int4*>(&s.a[r][128 * n + l0 + 32]) = sub32(q2);
        *reinterpret_cast<int4*>(&s.a[r][128 * n + l0 + 64]) = sub32(q3);
        *reinterpret_cast<int4*>(&s.a[r][128 * n + l0 + 96]) = sub32(q4);
    }
    if (h == 0) {
        const int4 scv = ld16(b + 192);
#pragma unroll
        for (int j = 0; j < 16; ++j) s.sc[r][j] = sbyte16(scv, j);
        s.dw[r][0] = h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]);
    }
}

// Legacy 32-element types: blocks 8kb .. 8kb+nblk-1 of the row, signed int8 quants.
template <> __device__ void unpack_row<GgmlType::Q8_0>(const WArgs& w, int64_t row, int64_t kb, int nblk, int h, Smem& s, int r) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int j = 4 * h + i;
        int4 q0 = make_int4(0, 0, 0, 0), q1 = q0;
        float d = 0.f;
        if (j < nblk) {
            const int64_t blk = row * w.bpr + 8 * kb + j;
            q0 = ld16(w.base + 32 * blk);
            q1 = ld16(w.base + 32 * blk + 16);
            d = h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]);
        }
        *reinterpret_cast<int4*>(&s.a[r][32 * j]) = q0;
        *reinterpret_cast<int4*>(&s.a[r][32 * j + 16]) = q1;
        s.dw[r][j] = d;
    }
}

template <int OFF>
__device__ void unpack_q4_0_like(const WArgs& w, int64_t row, int64_t kb, int nblk, int h, Smem& s, int r, bool q5) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int j = 4 * h + i;
        int4 lo = make_int4(0, 0, 0, 0), hi = lo;
        float d = 0.f;
        if (j < nblk) {
            const int64_t blk = row * w.bpr + 8 * kb + j;
            const int4 q = ld16(w.base + 16 * blk);
            if (q5) {
                q5_unpack(q, reinterpret_cast<const uint32_t*>(w.qh)[blk], lo, hi);
            } else {
                lo = and4(q, 0x0F0F0F0F);
                hi = and4(shr4(q, 4), 0x0F0F0F0F);
            }
            auto sub = [](int4 v) {
                return make_int4(int(__vsub4(uint32_t(v.x), OFF * 0x01010101u)), int(__vsub4(uint32_t(v.y), OFF * 0x01010101u)),
                                 int(__vsub4(uint32_t(v.z), OFF * 0x01010101u)), int(__vsub4(uint32_t(v.w), OFF * 0x01010101u)));
            };
            lo = sub(lo);
            hi = sub(hi);
            d = h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]);
        }
        *reinterpret_cast<int4*>(&s.a[r][32 * j]) = lo;
        *reinterpret_cast<int4*>(&s.a[r][32 * j + 16]) = hi;
        s.dw[r][j] = d;
    }
}
template <> __device__ void unpack_row<GgmlType::Q4_0>(const WArgs& w, int64_t row, int64_t kb, int nblk, int h, Smem& s, int r) {
    unpack_q4_0_like<8>(w, row, kb, nblk, h, s, r, false);
}
template <> __device__ void unpack_row<GgmlType::Q5_0>(const WArgs& w, int64_t row, int64_t kb, int nblk, int h, Smem& s, int r) {
    unpack_q4_0_like<16>(w, row, kb, nblk, h, s, r, true);
}

template <GgmlType TY> constexpr bool is_kquant() {
    return TY == GgmlType::Q4_K || TY == GgmlType::Q5_K || TY == GgmlType::Q6_K;
}

template <GgmlType TY>
__global__ void __launch_bounds__(MMA_THREADS) mma_kernel(WArgs w, ActQ A, int64_t N, int T, float* __restrict__ y,
                                                          int64_t ldy, const float* __restrict__ bias) {
    constexpr bool KQ = is_kquant<TY>();
    constexpr bool HAS_MIN = TY == GgmlType::Q4_K || TY == GgmlType::Q5_K;
    extern __shared__ __align__(16) uint8_t smem_raw[];
    Smem& s = *reinterpret_cast<Smem*>(smem_raw);
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int wm = warp / 2, wn = warp % 2;
    const int g = lane >> 2, t4 = lane & 3;
    const int64_t row0 = int64_t(blockIdx.x) * BM;
    const int tok0 = blockIdx.y * BN;
    const int64_t K = A.K;
    const int64_t n_stage = (K + STAGE - 1) / STAGE;

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][c][e] = 0.f;

    for (int64_t kb = 0; kb < n_stage; ++kb) {
        const int nblk = int(min(int64_t(8), (K - kb * STAGE) / 32));  // legacy blocks in this stage
        // weights: thread pair per row
        {
            const int r = tid / 2, h = tid % 2;
            const int64_t row = min(row0 + r, N - 1);
            unpack_row<TY>(w, row, kb, nblk, h, s, r);
        }
        // activations: 64 tokens x 256 bytes, 16 bytes per thread per step
        for (int i = tid; i < BN * (STAGE / 16); i += MMA_THREADS) {
            const int t = i / (STAGE / 16), c = i % (STAGE / 16);
            const int64_t tok = min(tok0 + t, T - 1);
            int4 v = make_int4(0, 0, 0, 0);
            if (kb * STAGE + 16 * c < K) v = ld16(A.qs + tok * K + kb * STAGE + 16 * c);
            *reinterpret_cast<int4*>(&s.b[t][16 * c]) = v;
        }
        if (tid < BN) {
            const int64_t tok = min(tok0 + tid, T - 1);
            if (KQ) {
                s.da[tid][0] = A.d[tok * (K / 256) + kb];
                if (HAS_MIN) {
                    const int16_t* bs = A.bsum + tok * (K / 16) + kb * 16;
#pragma unroll
                    for (int j = 0; j < 8; ++j) s.bs[tid][j] = bs[2 * j] + bs[2 * j + 1];
                }
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) s.da[tid][j] = j < nblk ? A.d[tok * (K / 32) + kb * 8 + j] : 0.f;
            }
        }
        __syncthreads();

        int isum[2][4][4];
        int msum[2][4][4];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int c = 0; c < 4; ++c)
#pragma unroll
                for (int e = 0; e < 4; ++e) isum[i][c][e] = msum[i][c][e] = 0;

        const int ar = wm * 32, bt = wn * 32;
        if (TY == GgmlType::Q6_K) {
#pragma unroll 4
            for (int j = 0; j < 16; ++j) {
                int cc[2][4][4];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int a0 = *reinterpret_cast<const int*>(&s.a[ar + 16 * i + g][16 * j + 4 * t4]);
                    const int a1 = *reinterpret_cast<const int*>(&s.a[ar + 16 * i + g + 8][16 * j + 4 * t4]);
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        const int b0 = *reinterpret_cast<const int*>(&s.b[bt + 8 * c + g][16 * j + 4 * t4]);
                        cc[i][c][0] = cc[i][c][1] = cc[i][c][2] = cc[i][c][3] = 0;
                        mma_k16(cc[i][c], a0, a1, b0);
                    }
                }
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int s0 = s.sc[ar + 16 * i + g][j], s1 = s.sc[ar + 16 * i + g + 8][j];
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        isum[i][c][0] += s0 * cc[i][c][0];
                        isum[i][c][1] += s0 * cc[i][c][1];
                        isum[i][c][2] += s1 * cc[i][c][2];
                        isum[i][c][3] += s1 * cc[i][c][3];
                    }
                }
            }
        } else {
#pragma unroll 2
            for (int j = 0; j < 8; ++j) {
                int cc[2][4][4];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int8_t* r0 = &s.a[ar + 16 * i + g][32 * j + 4 * t4];
                    const int8_t* r1 = &s.a[ar + 16 * i + g + 8][32 * j + 4 * t4];
                    const int a0 = *reinterpret_cast<const int*>(r0), a2 = *reinterpret_cast<const int*>(r0 + 16);
                    const int a1 = *reinterpret_cast<const int*>(r1), a3 = *reinterpret_cast<const int*>(r1 + 16);
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        const int8_t* br = &s.b[bt + 8 * c + g][32 * j + 4 * t4];
                        const int b0 = *reinterpret_cast<const int*>(br), b1 = *reinterpret_cast<const int*>(br + 16);
                        cc[i][c][0] = cc[i][c][1] = cc[i][c][2] = cc[i][c][3] = 0;
                        mma_k32(cc[i][c], a0, a1, a2, a3, b0, b1);
                    }
                }
                if (KQ) {
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const int ra = ar + 16 * i + g, rb = ra + 8;
                        const int s0 = s.sc[ra][j], s1 = s.sc[rb][j];
                        const int m0 = s.mn[ra][j], m1 = s.mn[rb][j];
#pragma unroll
                        for (int c = 0; c < 4; ++c) {
                            const int ta = bt + 8 * c + 2 * t4;
                            const int bs0 = s.bs[ta][j], bs1 = s.bs[ta + 1][j];
                            isum[i][c][0] += s0 * cc[i][c][0];
                            isum[i][c][1] += s0 * cc[i][c][1];
                            isum[i][c][2] += s1 * cc[i][c][2];
                            isum[i][c][3] += s1 * cc[i][c][3];
                            msum[i][c][0] += m0 * bs0;
                            msum[i][c][1] += m0 * bs1;
                            msum[i][c][2] += m1 * bs0;
                            msum[i][c][3] += m1 * bs1;
                        }
                    }
                } else {
                    // legacy: per-32 float scales on both sides
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const int ra = ar + 16 * i + g, rb = ra + 8;
                        const float d0 = s.dw[ra][j], d1 = s.dw[rb][j];
#pragma unroll
                        for (int c = 0; c < 4; ++c) {
                            const int ta = bt + 8 * c + 2 * t4;
                            const float e0 = s.da[ta][j], e1 = s.da[ta + 1][j];
                            acc[i][c][0] += float(cc[i][c][0]) * (d0 * e0);
                            acc[i][c][1] += float(cc[i][c][1]) * (d0 * e1);
                            acc[i][c][2] += float(cc[i][c][2]) * (d1 * e0);
                            acc[i][c][3] += float(cc[i][c][3]) * (d1 * e1);
                        }
                    }
                }
            }
        }
        if (KQ) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int ra = ar + 16 * i + g, rb = ra + 8;
                const float dwa = s.dw[ra][0], dwb = s.dw[rb][0];
                const float dma = HAS_MIN ? s.dmin[ra] : 0.f, dmb = HAS_MIN ? s.dmin[rb] : 0.f;
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int ta = bt + 8 * c + 2 * t4;
                    const float e0 = s.da[ta][0], e1 = s.da[ta + 1][0];
                    acc[i][c][0] += e0 * (dwa * float(isum[i][c][0]) - dma * float(msum[i][c][0]));
                    acc[i][c][1] += e1 * (dwa * float(isum[i][c][1]) - dma * float(msum[i][c][1]));
                    acc[i][c][2] += e0 * (dwb * float(isum[i][c][2]) - dmb * float(msum[i][c][2]));
                    acc[i][c][3] += e1 * (dwb * float(isum[i][c][3]) - dmb * float(msum[i][c][3]));
                }
            }
        }
        __syncthreads();  // the next stage overwrites the tiles
    }

#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t row = row0 + wm * 32 + 16 * i + g + (e >= 2 ? 8 : 0);
                const int tok = tok0 + wn * 32 + 8 * c + 2 * t4 + (e & 1);
                if (row < N && tok < T) y[int64_t(tok) * ldy + row] = acc[i][c][e] + (bias ? bias[row] : 0.f);
            }
}

template <GgmlType TY>
void launch(const DeviceWeight& w, const ActQ& a, int64_t T, float* y, int64_t ldy, const float* bias, cudaStream_t s) {
    const size_t smem = sizeof(Smem);
    allow_dynamic_smem(mma_kernel<TY>, smem);
    WArgs wa;
    wa.base = w.data;
    wa.qh = w.layout.qh_bytes ? w.data + w.layout.off_qh : nullptr;
    wa.d = w.layout.d_bytes ? w.data + w.layout.off_d : nullptr;
    wa.bpr = w.K / traits(w.type).block_size;
    const dim3 grid(static_cast<unsigned>(ceil_div(w.N, BM)), static_cast<unsigned>(ceil_div(T, BN)));
    mma_kernel<TY><<<grid, MMA_THREADS, smem, s>>>(wa, a, w.N, int(T), y, ldy, bias);
}

}  // namespace

bool mma_applies(int64_t N, int64_t T) {
    const char* env = std::getenv("QINFER_CUDA_MMA");  // "0": matvec path for prefill too; "int8": no f16 kernel
    if ((env && env[0] == '0') || T <= 8) return false;
    // A few output rows (Qwen3.5's ssm_alpha / ssm_beta: N = 32) make one
    // block of tiles that walks all of K alone: 44 us at T = 64 on an H200,
    // 12 us on the matvec kernel, whose token chunks spread over more blocks.
    return !(N < 128 && T <= 64);
}

bool matmul_mma(const DeviceWeight& w, const ActQ& a, int64_t T, float* y, int64_t ldy, const float* bias,
                cudaStream_t s) {
    if (!mma_applies(w.N, T)) return false;
    const bool int8_only = env_is("QINFER_CUDA_MMA", "int8");
    if (!int8_only && matmul_hmma(w, a, T, y, ldy, bias, s)) return true;
    switch (w.type) {
        case GgmlType::Q4_K: launch<GgmlType::Q4_K>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q5_K: launch<GgmlType::Q5_K>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q6_K: launch<GgmlType::Q6_K>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q8_0: launch<GgmlType::Q8_0>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q4_0: launch<GgmlType::Q4_0>(w, a, T, y, ldy, bias, s); break;
        case GgmlType::Q5_0: launch<GgmlType::Q5_0>(w, a, T, y, ldy, bias, s); break;
        default: return false;
    }
    QINFER_CUDA_LAUNCHED("matmul_mma");
    return true;
}

}  // namespace qinfer::cuda
