// Per-type pieces of the quantized matrix products, over the GPU weight layout
// of layout.h. A "unit" is the work of one thread in one step: one 16-byte load
// of the main quant stream (plus the small scale loads that go with it), dotted
// with up to NT tokens' activations. Integer sums are exact; the float scaling
// follows ggml's vec_dot_<type>_q8_<x> so CPU and GPU agree to rounding order.
#pragma once
#include "quant/blocks.h"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

struct WArgs {
    const uint8_t* base;  // main section
    const uint8_t* qh;    // qh section (Q5_0 / Q5_1)
    const uint8_t* d;     // scale section (repacked types)
    int64_t bpr;          // blocks per row
};


__device__ __forceinline__ int dot16(const int4 q, const int4 a, int acc) {
    acc = dp4a(q.x, a.x, acc);
    acc = dp4a(q.y, a.y, acc);
    acc = dp4a(q.z, a.z, acc);
    return dp4a(q.w, a.w, acc);
}

__device__ __forceinline__ int4 and4(int4 v, int m) { return make_int4(v.x & m, v.y & m, v.z & m, v.w & m); }
__device__ __forceinline__ int4 shr4(int4 v, int s) {
    return make_int4(int(uint32_t(v.x) >> s), int(uint32_t(v.y) >> s), int(uint32_t(v.z) >> s), int(uint32_t(v.w) >> s));
}
__device__ __forceinline__ int4 or4(int4 a, int4 b) { return make_int4(a.x | b.x, a.y | b.y, a.z | b.z, a.w | b.w); }

// Bits 0..3 of x moved to bit 4 of bytes 0..3 (the 5th bit of four Q5 quants).
// The mask first: the multiply also carries bits 8+ of x into the selected bit
// positions (bit 8 lands on byte 1, bit 9 on byte 2, ...).
__device__ __forceinline__ int spread4(uint32_t x) { return int((((x & 0xFu) * 0x00204081u) & 0x01010101u) << 4); }

// Signed byte i (0..15) of a 16-byte register value (no local-memory indexing).
__device__ __forceinline__ int sbyte16(const int4 v, int i) {
    const int w = i < 8 ? (i < 4 ? v.x : v.y) : (i < 12 ? v.z : v.w);
    return int(int8_t((uint32_t(w) >> (8 * (i & 3))) & 0xFF));
}

template <GgmlType T> struct QDot;

// ---- Q4_0 x Q8_0: unit = one 32-element block.
template <> struct QDot<GgmlType::Q4_0> {
    static constexpr int BS = 32, UPB = 1;
    template <int NT>
    __device__ static void dot(const WArgs& w, int64_t blk, int64_t jb, int, const ActQ& A, const int* tk, float (&acc)[NT]) {
        const int4 q = ld16(w.base + 16 * blk);
        const float dw = h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]);
        const int4 lo = and4(q, 0x0F0F0F0F), hi = and4(shr4(q, 4), 0x0F0F0F0F);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int8_t* aq = (A.qs + tk[t] * A.K) + 32 * jb;
            int s = dot16(lo, ld16(aq), 0);
            s = dot16(hi, ld16(aq + 16), s);
            s -= 8 * ((A.bsum + tk[t] * (A.K / 16))[2 * jb] + (A.bsum + tk[t] * (A.K / 16))[2 * jb + 1]);
            acc[t] += float(s) * (dw * A.d[tk[t] * (A.K / BS) + jb]);
        }
    }
};

// ---- Q4_1 x Q8_1
template <> struct QDot<GgmlType::Q4_1> {
    static constexpr int BS = 32, UPB = 1;
    template <int NT>
    __device__ static void dot(const WArgs& w, int64_t blk, int64_t jb, int, const ActQ& A, const int* tk, float (&acc)[NT]) {
        const int4 q = ld16(w.base + 16 * blk);
        const uint32_t dm = reinterpret_cast<const uint32_t*>(w.d)[blk];
        const float dw = h2f(uint16_t(dm & 0xFFFF)), mw = h2f(uint16_t(dm >> 16));
        const int4 lo = and4(q, 0x0F0F0F0F), hi = and4(shr4(q, 4), 0x0F0F0F0F);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int8_t* aq = (A.qs + tk[t] * A.K) + 32 * jb;
            int s = dot16(lo, ld16(aq), 0);
            s = dot16(hi, ld16(aq + 16), s);
            acc[t] += float(s) * (dw * A.d[tk[t] * (A.K / BS) + jb]) + mw * A.s[tk[t] * (A.K / 32) + jb];
        }
    }
};

// Q5 quants of one block: low nibble | 5th bit from qh (elements 0-15 in lo, 16-31 in hi).
__device__ __forceinline__ void q5_unpack(const int4 q, uint32_t qh, int4& lo, int4& hi) {
    lo = or4(and4(q, 0x0F0F0F0F), make_int4(spread4(qh), spread4(qh >> 4), spread4(qh >> 8), spread4(qh >> 12)));
    hi = or4(and4(shr4(q, 4), 0x0F0F0F0F),
             make_int4(spread4(qh >> 16), spread4(qh >> 20), spread4(qh >> 24), spread4(qh >> 28)));
}

// ---- Q5_0 x Q8_0
template <> struct QDot<GgmlType::Q5_0> {
    static constexpr int BS = 32, UPB = 1;
    template <int NT>
    __device__ static void dot(const WArgs& w, int64_t blk, int64_t jb, int, const ActQ& A, const int* tk, float (&acc)[NT]) {
        int4 lo, hi;
        q5_unpack(ld16(w.base + 16 * blk), reinterpret_cast<const uint32_t*>(w.qh)[blk], lo, hi);
        const float dw = h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int8_t* aq = (A.qs + tk[t] * A.K) + 32 * jb;
            int s = dot16(lo, ld16(aq), 0);
            s = dot16(hi, ld16(aq + 16), s);
            s -= 16 * ((A.bsum + tk[t] * (A.K / 16))[2 * jb] + (A.bsum + tk[t] * (A.K / 16))[2 * jb + 1]);
            acc[t] += float(s) * (dw * A.d[tk[t] * (A.K / BS) + jb]);
        }
    }
};

// ---- Q5_1 x Q8_1
template <> struct QDot<GgmlType::Q5_1> {
    static constexpr int BS = 32, UPB = 1;
    template <int NT>
    __device__ static void dot(const WArgs& w, int64_t blk, int64_t jb, int, const ActQ& A, const int* tk, float (&acc)[NT]) {
        int4 lo, hi;
        q5_unpack(ld16(w.base + 16 * blk), reinterpret_cast<const uint32_t*>(w.qh)[blk], lo, hi);
        const uint32_t dm = reinterpret_cast<const uint32_t*>(w.d)[blk];
        const float dw = h2f(uint16_t(dm & 0xFFFF)), mw = h2f(uint16_t(dm >> 16));
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int8_t* aq = (A.qs + tk[t] * A.K) + 32 * jb;
            int s = dot16(lo, ld16(aq), 0);
            s = dot16(hi, ld16(aq + 16), s);
            acc[t] += float(s) * (dw * A.d[tk[t] * (A.K / BS) + jb]) + mw * A.s[tk[t] * (A.K / 32) + jb];
        }
    }
};

// ---- Q8_0 x Q8_0: unit = one block (two 16-byte loads).
template <> struct QDot<GgmlType::Q8_0> {
    static constexpr int BS = 32, UPB = 1;
    template <int NT>
    __device__ static void dot(const WArgs& w, int64_t blk, int64_t jb, int, const ActQ& A, const int* tk, float (&acc)[NT]) {
        const int4 q0 = ld16(w.base + 32 * blk), q1 = ld16(w.base + 32 * blk + 16);
        const float dw = h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int8_t* aq = (A.qs + tk[t] * A.K) + 32 * jb;
            int s = dot16(q0, ld16(aq), 0);
            s = dot16(q1, ld16(aq + 16), s);
            acc[t] += float(s) * (dw * A.d[tk[t] * (A.K / BS) + jb]);
        }
    }
};

// ---- Q4_K x Q8_K: unit u = 16 bytes of qs: group g = u/2 of 64 elements, half c.
// Low nibbles: 16 elements of sub-block 2g; high nibbles: 16 of sub-block 2g+1.
template <> struct QDot<GgmlType::Q4_K> {
    static constexpr int BS = 256, UPB = 8;
    template <int NT>
    __device__ static void dot(const WArgs& w, int64_t blk, int64_t jb, int u, const ActQ& A, const int* tk, float (&acc)[NT]) {
        const uint8_t* b = w.base + 144 * blk;
        const int4 hd = ld16(b);  // d, dmin, scales[12]
        const int g = u >> 1, c = u & 1;
        const int4 q = ld16(b + 16 + 32 * g + 16 * c);
        int sc0, m0, sc1, m1;
        get_scale_min_k4_pair(g, hd.y, hd.z, hd.w, sc0, m0, sc1, m1);
        const float dw = h2f(uint16_t(hd.x & 0xFFFF)), dmin = h2f(uint16_t(uint32_t(hd.x) >> 16));
        const int4 lo = and4(q, 0x0F0F0F0F), hi = and4(shr4(q, 4), 0x0F0F0F0F);
        const int e = 256 * int(jb) + 64 * g + 16 * c;  // first element of the low part
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int s0 = dot16(lo, ld16((A.qs + tk[t] * A.K) + e), 0);
            const int s1 = dot16(hi, ld16((A.qs + tk[t] * A.K) + e + 32), 0);
            const int mins = m0 * (A.bsum + tk[t] * (A.K / 16))[e / 16] + m1 * (A.bsum + tk[t] * (A.K / 16))[e / 16 + 2];
            const float da = A.d[tk[t] * (A.K / BS) + jb];
            acc[t] += da * (dw * float(sc0 * s0 + sc1 * s1) - dmin * float(mins));
        }
    }
};

// ---- Q5_K x Q8_K: as Q4_K plus the 5th bits (qh[l] bit 2g / 2g+1 for element l of group g).
template <> struct QDot<GgmlType::Q5_K> {
    static constexpr int BS = 256, UPB = 8;
    template <int NT>
    __device__ static void dot(const WArgs& w, int64_t blk, int64_t jb, int u, const ActQ& A, const int* tk, float (&acc)[NT]) {
        const uint8_t* b = w.base + 176 * blk;
        const int4 hd = ld16(b);
        const int g = u >> 1, c = u & 1;
        const int4 qh = ld16(b + 16 + 16 * c);
        const int4 q = ld16(b + 48 + 32 * g + 16 * c);
        int sc0, m0, sc1, m1;
        get_scale_min_k4_pair(g, hd.y, hd.z, hd.w, sc0, m0, sc1, m1);
        const float dw = h2f(uint16_t(hd.x & 0xFFFF)), dmin = h2f(uint16_t(uint32_t(hd.x) >> 16));
        // bit 2g (low nibbles) / 2g+1 (high nibbles) of each qh byte becomes bit 4 of the quant
        const int4 bl = and4(shr4(qh, 2 * g), 0x01010101), bh = and4(shr4(qh, 2 * g + 1), 0x01010101);
        const int4 l = or4(and4(q, 0x0F0F0F0F), make_int4(bl.x << 4, bl.y << 4, bl.z << 4, bl.w << 4));
        const int4 h = or4(and4(shr4(q, 4), 0x0F0F0F0F), make_int4(bh.x << 4, bh.y << 4, bh.z << 4, bh.w << 4));
        const int e = 256 * int(jb) + 64 * g + 16 * c;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int s0 = dot16(l, ld16((A.qs + tk[t] * A.K) + e), 0);
            const int s1 = dot16(h, ld16((A.qs + tk[t] * A.K) + e + 32), 0);
            const int mins = m0 * (A.bsum + tk[t] * (A.K / 16))[e / 16] + m1 * (A.bsum + tk[t] * (A.K / 16))[e / 16 + 2];
            const float da = A.d[tk[t] * (A.K / BS) + jb];
            acc[t] += da * (dw * float(sc0 * s0 + sc1 * s1) - dmin * float(mins));
        }
    }
};

// ---- Q6_K x Q8_K: unit u = half n = u/2 (128 elements), l0 = 16 (u%2).
// Covers elements 128n + l0 + {0, 32, 64, 96} + [0, 16): four groups of 16, each
// with its own int8 scale. Quants are 0..63 with an offset of 32.
template <> struct QDot<GgmlType::Q6_K> {
    static constexpr int BS = 256, UPB = 4;
    template <int NT>
    __device__ static void dot(const WArgs& w, int64_t blk, int64_t jb, int u, const ActQ& A, const int* tk, float (&acc)[NT]) {
        const uint8_t* b = w.base + 208 * blk;
        const int n = u >> 1, l0 = 16 * (u & 1);
        const int4 qa = ld16(b + 64 * n + l0);
        const int4 qb = ld16(b + 64 * n + 32 + l0);
        const int4 qh = ld16(b + 128 + 32 * n + l0);
        const int4 scv = ld16(b + 192);
        const float dw = h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]);
        const int4 q1 = or4(and4(qa, 0x0F0F0F0F), and4(make_int4(qh.x << 4, qh.y << 4, qh.z << 4, qh.w << 4), 0x30303030));
        const int4 q2 = or4(and4(qb, 0x0F0F0F0F), and4(make_int4(qh.x << 2, qh.y << 2, qh.z << 2, qh.w << 2), 0x30303030));
        const int4 q3 = or4(and4(shr4(qa, 4), 0x0F0F0F0F), and4(qh, 0x30303030));
        const int4 q4 = or4(and4(shr4(qb, 4), 0x0F0F0F0F), and4(shr4(qh, 2), 0x30303030));
        const int is = 8 * n + (l0 >> 4);
        int s_1, s_2, s_3, s_4;
        const int sc1 = sbyte16(scv, is), sc2 = sbyte16(scv, is + 2), sc3 = sbyte16(scv, is + 4),
                  sc4 = sbyte16(scv, is + 6);
        const int e = 256 * int(jb) + 128 * n + l0;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int8_t* aq = (A.qs + tk[t] * A.K) + e;
            const int16_t* bs = (A.bsum + tk[t] * (A.K / 16)) + e / 16;
            s_1 = dot16(q1, ld16(aq), 0) - 32 * bs[0];
            s_2 = dot16(q2, ld16(aq + 32), 0) - 32 * bs[2];
            s_3 = dot16(q3, ld16(aq + 64), 0) - 32 * bs[4];
            s_4 = dot16(q4, ld16(aq + 96), 0) - 32 * bs[6];
            acc[t] += A.d[tk[t] * (A.K / BS) + jb] * (dw * float(sc1 * s_1 + sc2 * s_2 + sc3 * s_3 + sc4 * s_4));
        }
    }
};

// ---- The same unit products for a warp that computes R rows at once (matvec.cu,
// one token). A unit's work is split into its weight bytes (W: one row's, the
// DRAM traffic) and its activations (A: shared by the R rows, so read once per
// step instead of once per row); dot() then does QDot's arithmetic for token 0
// term for term, so a row sums to the same bits as in the one-row-per-warp
// kernels. u is the unit's index within its row (block u / UPB).
template <GgmlType T> struct RowUnit;

// Where load_a reads the quantized activations: global memory through the
// read-only cache, or a block's copy in shared memory (the fused FFN kernel).
struct FromGlobal {
    __device__ static int4 ld16(const void* p) { return cuda::ld16(p); }
    __device__ static int2 ld8(const void* p) { return __ldg(reinterpret_cast<const int2*>(p)); }
    __device__ static float ldf(const float* p) { return __ldg(p); }
};
struct FromShared {
    __device__ static int4 ld16(const void* p) { return *reinterpret_cast<const int4*>(p); }
    __device__ static int2 ld8(const void* p) { return *reinterpret_cast<const int2*>(p); }
    __device__ static float ldf(const float* p) { return *p; }
};

// Signed 16-bit half `hi` (0 low, 1 high) of a word.
__device__ __forceinline__ int half16(int w, int hi) { return hi ? (w >> 16) : int(int16_t(w & 0xFFFF)); }

template <> struct RowUnit<GgmlType::Q4_K> {
    static constexpr int UPB = 8;
    struct W {
        int4 hd, q;
    };
    struct A {
        int4 a0, a1;
        int2 bs;  // the four 16-element sums of group g: the unit's two are c and c + 2
        float da;
    };
    __device__ static W load_w(const WArgs& w, int64_t blk0, int u) {
        const uint8_t* b = w.base + 144 * (blk0 + (u >> 3));
        return W{ld16(b), ld16(b + 16 + 16 * (u & 7))};  // group (u & 7) / 2, half u & 1
    }
    template <class M = FromGlobal>
    __device__ static A load_a(const ActQ& a, int u) {
        const int jb = u >> 3, g = (u & 7) >> 1, c = u & 1;
        const int e = 256 * jb + 64 * g + 16 * c;
        return A{M::ld16(a.qs + e), M::ld16(a.qs + e + 32), M::ld8(a.bsum + 16 * jb + 4 * g), M::ldf(a.d + jb)};
    }
    __device__ static float dot(const W& w, const A& a, int u) {
        return scaled(w.hd, and4(w.q, 0x0F0F0F0F), and4(shr4(w.q, 4), 0x0F0F0F0F), a, u);
    }
    // The unit's sum from its unpacked quants (lo: sub-block 2g, hi: 2g + 1) and
    // the block header hd (d, dmin, 12 scale bytes); Q5_K passes 5-bit quants.
    __device__ static float scaled(const int4& hd, const int4& lo, const int4& hi, const A& a, int u) {
        const int g = (u & 7) >> 1, c = u & 1;
        int sc0, m0, sc1, m1;
        get_scale_min_k4_pair(g, hd.y, hd.z, hd.w, sc0, m0, sc1, m1);
        const float dw = h2f(uint16_t(hd.x & 0xFFFF)), dmin = h2f(uint16_t(uint32_t(hd.x) >> 16));
        const int s0 = dot16(lo, a.a0, 0);
        const int s1 = dot16(hi, a.a1, 0);
        const int mins = m0 * half16(a.bs.x, c) + m1 * half16(a.bs.y, c);
        return a.da * (dw * float(sc0 * s0 + sc1 * s1) - dmin * float(mins));
    }
};

template <> struct RowUnit<GgmlType::Q5_K> {
    static constexpr int UPB = 8;
    struct W {
        int4 hd, qh, q;
    };
    using A = RowUnit<GgmlType::Q4_K>::A;  // the same activation elements
    __device__ static W load_w(const WArgs& w, int64_t blk0, int u) {
        const uint8_t* b = w.base + 176 * (blk0 + (u >> 3));
        return W{ld16(b), ld16(b + 16 + 16 * (u & 1)), ld16(b + 48 + 16 * (u & 7))};
    }
    template <class M = FromGlobal>
    __device__ static A load_a(const ActQ& a, int u) { return RowUnit<GgmlType::Q4_K>::load_a<M>(a, u); }
    __device__ static float dot(const W& w, const A& a, int u) {
        const int g = (u & 7) >> 1;
        const int4 bl = and4(shr4(w.qh, 2 * g), 0x01010101), bh = and4(shr4(w.qh, 2 * g + 1), 0x01010101);
        const int4 l = or4(and4(w.q, 0x0F0F0F0F), make_int4(bl.x << 4, bl.y << 4, bl.z << 4, bl.w << 4));
        const int4 h = or4(and4(shr4(w.q, 4), 0x0F0F0F0F), make_int4(bh.x << 4, bh.y << 4, bh.z << 4, bh.w << 4));
        return RowUnit<GgmlType::Q4_K>::scaled(w.hd, l, h, a, u);
    }
};

// Unit u: half n = (u % 4) / 2 of block u / 4 (128 elements), l0 = 16 (u % 2).
template <> struct RowUnit<GgmlType::Q6_K> {
    static constexpr int UPB = 4;
    struct W {
        int4 qa, qb, qh;
        int2 sc8;  // scales 8n .. 8n + 7: the unit's four (8n + l0/16 + {0, 2, 4, 6}) are among them
        uint32_t dh;
    };
    struct A {
        int4 a[4];  // elements e + 32 i + [0, 16)
        int4 bs;    // the 16-element sums 8n .. 8n + 7 of the block: the unit's are l0/16 + {0, 2, 4, 6}
        float da;
    };
    __device__ static W load_w(const WArgs& w, int64_t blk0, int u) {
        const int64_t blk = blk0 + (u >> 2);
        const uint8_t* b = w.base + 208 * blk;
        const int n = (u & 3) >> 1, l0 = 16 * (u & 1);
        return W{ld16(b + 64 * n + l0), ld16(b + 64 * n + 32 + l0), ld16(b + 128 + 32 * n + l0),
                 __ldg(reinterpret_cast<const int2*>(b + 192 + 8 * n)),
                 uint32_t(__ldg(reinterpret_cast<const uint16_t*>(w.d) + blk))};
    }
    template <class M = FromGlobal>
    __device__ static A load_a(const ActQ& a, int u) {
        const int jb = u >> 2, n = (u & 3) >> 1, l0 = 16 * (u & 1);
        const int8_t* aq = a.qs + 256 * jb + 128 * n + l0;
        return A{{M::ld16(aq), M::ld16(aq + 32), M::ld16(aq + 64), M::ld16(aq + 96)},
                 M::ld16(a.bsum + 16 * jb + 8 * n), M::ldf(a.d + jb)};
    }
    __device__ static float dot(const W& w, const A& a, int u) {
        const int is = u & 1;
        const float dw = h2f(uint16_t(w.dh));
        const int4 q1 = or4(and4(w.qa, 0x0F0F0F0F), and4(make_int4(w.qh.x << 4, w.qh.y << 4, w.qh.z << 4, w.qh.w << 4), 0x30303030));
        const int4 q2 = or4(and4(w.qb, 0x0F0F0F0F), and4(make_int4(w.qh.x << 2, w.qh.y << 2, w.qh.z << 2, w.qh.w << 2), 0x30303030));
        const int4 q3 = or4(and4(shr4(w.qa, 4), 0x0F0F0F0F), and4(w.qh, 0x30303030));
        const int4 q4 = or4(and4(shr4(w.qb, 4), 0x0F0F0F0F), and4(shr4(w.qh, 2), 0x30303030));
        const int4 scv = make_int4(w.sc8.x, w.sc8.y, 0, 0);
        const int sc1 = sbyte16(scv, is), sc2 = sbyte16(scv, is + 2), sc3 = sbyte16(scv, is + 4),
                  sc4 = sbyte16(scv, is + 6);
        const int s_1 = dot16(q1, a.a[0], 0) - 32 * half16(a.bs.x, is);
        const int s_2 = dot16(q2, a.a[1], 0) - 32 * half16(a.bs.y, is);
        const int s_3 = dot16(q3, a.a[2], 0) - 32 * half16(a.bs.z, is);
        const int s_4 = dot16(q4, a.a[3], 0) - 32 * half16(a.bs.w, is);
        return a.da * (dw * float(sc1 * s_1 + sc2 * s_2 + sc3 * s_3 + sc4 * s_4));
    }
};

// ---- Q4_K x Q8_K for one token, one row per warp, software-pipelined (v2).
// The same units and arithmetic as QDot<Q4_K> (so the same result to the bit),
// but all loads of a unit -- weight header and quants, the two activation quant
// runs, their sums and the block scale -- are issued at once, and the next
// unit's go out before this unit's arithmetic. One lane's share of row `row`
// (units lane, lane + 32, ...), in unit order; token 0 of A.
__device__ __forceinline__ float q4k_row_lane(const WArgs& w, int64_t row, const ActQ& A, int lane) {
    using U = RowUnit<GgmlType::Q4_K>;
    const int units = int(w.bpr) * U::UPB;
    const int64_t blk0 = row * w.bpr;
    float acc = 0.f;
    int u = lane;
    if (u >= units) return acc;
    U::W cw = U::load_w(w, blk0, u);
    U::A ca = U::load_a(A, u);
    for (;;) {
        const int next = u + WARP;
        const bool more = next < units;
        U::W nw;
        U::A na;
        if (more) {
            nw = U::load_w(w, blk0, next);
            na = U::load_a(A, next);
        }
        acc += U::dot(cw, ca, u);
        if (!more) break;
        cw = nw;
        ca = na;
        u = next;
    }
    return acc;
}

// QINFER_CUDA_MATVEC=v1 keeps the plain unit loop for Q4_K (A/B measurements).
bool q4k_pipelined();

// ---- Dequantization of one element group (get_rows, f16 dequant): element i of block blk.
template <GgmlType T> __device__ float dequant_elem(const WArgs& w, int64_t blk, int i);

template <> __device__ __forceinline__ float dequant_elem<GgmlType::F32>(const WArgs& w, int64_t blk, int) {
    return reinterpret_cast<const float*>(w.base)[blk];
}
template <> __device__ __forceinline__ float dequant_elem<GgmlType::F16>(const WArgs& w, int64_t blk, int) {
    return h2f(reinterpret_cast<const uint16_t*>(w.base)[blk]);
}
template <> __device__ __forceinline__ float dequant_elem<GgmlType::BF16>(const WArgs& w, int64_t blk, int) {
    return bf2f(reinterpret_cast<const uint16_t*>(w.base)[blk]);
}
template <> __device__ __forceinline__ float dequant_elem<GgmlType::Q4_0>(const WArgs& w, int64_t blk, int i) {
    const uint8_t q = w.base[16 * blk + (i & 15)];
    const int v = (i < 16 ? (q & 0xF) : (q >> 4)) - 8;
    return h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]) * float(v);
}
template <> __device__ __forceinline__ float dequant_elem<GgmlType::Q4_1>(const WArgs& w, int64_t blk, int i) {
    const uint8_t q = w.base[16 * blk + (i & 15)];
    const int v = i < 16 ? (q & 0xF) : (q >> 4);
    const uint16_t* dm = reinterpret_cast<const uint16_t*>(w.d) + 2 * blk;
    return h2f(dm[0]) * float(v) + h2f(dm[1]);
}
template <> __device__ __forceinline__ float dequant_elem<GgmlType::Q5_0>(const WArgs& w, int64_t blk, int i) {
    const uint8_t q = w.base[16 * blk + (i & 15)];
    const uint32_t qh = reinterpret_cast<const uint32_t*>(w.qh)[blk];
    const int v = ((i < 16 ? (q & 0xF) : (q >> 4)) | (((qh >> i) & 1) << 4)) - 16;
    return h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]) * float(v);
}
template <> __device__ __forceinline__ float dequant_elem<GgmlType::Q5_1>(const WArgs& w, int64_t blk, int i) {
    const uint8_t q = w.base[16 * blk + (i & 15)];
    const uint32_t qh = reinterpret_cast<const uint32_t*>(w.qh)[blk];
    const int v = (i < 16 ? (q & 0xF) : (q >> 4)) | (((qh >> i) & 1) << 4);
    const uint16_t* dm = reinterpret_cast<const uint16_t*>(w.d) + 2 * blk;
    return h2f(dm[0]) * float(v) + h2f(dm[1]);
}
template <> __device__ __forceinline__ float dequant_elem<GgmlType::Q8_0>(const WArgs& w, int64_t blk, int i) {
    return h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]) * float(int8_t(w.base[32 * blk + i]));
}
template <> __device__ __forceinline__ float dequant_elem<GgmlType::Q4_K>(const WArgs& w, int64_t blk, int i) {
    const uint8_t* b = w.base + 144 * blk;
    const int g = i / 64, r = i % 64, j = 2 * g + (r >= 32);
    uint8_t sc, m;
    get_scale_min_k4(j, b + 4, &sc, &m);
    const uint8_t q = b[16 + 32 * g + (r & 31)];
    const int v = r < 32 ? (q & 0xF) : (q >> 4);
    const float d = h2f(*reinterpret_cast<const uint16_t*>(b)), dmin = h2f(*reinterpret_cast<const uint16_t*>(b + 2));
    return d * float(sc) * float(v) - dmin * float(m);
}
template <> __device__ __forceinline__ float dequant_elem<GgmlType::Q5_K>(const WArgs& w, int64_t blk, int i) {
    const uint8_t* b = w.base + 176 * blk;
    const int g = i / 64, r = i % 64, j = 2 * g + (r >= 32);
    uint8_t sc, m;
    get_scale_min_k4(j, b + 4, &sc, &m);
    const uint8_t q = b[48 + 32 * g + (r & 31)];
    const uint8_t h = b[16 + (r & 31)];
    const int v = (r < 32 ? (q & 0xF) : (q >> 4)) | (((h >> j) & 1) << 4);
    const float d = h2f(*reinterpret_cast<const uint16_t*>(b)), dmin = h2f(*reinterpret_cast<const uint16_t*>(b + 2));
    return d * float(sc) * float(v) - dmin * float(m);
}
template <> __device__ __forceinline__ float dequant_elem<GgmlType::Q6_K>(const WArgs& w, int64_t blk, int i) {
    const uint8_t* b = w.base + 208 * blk;
    const int n = i / 128, r = i % 128, k = r / 32, l = r % 32;  // y[128n + 32k + l]
    const uint8_t* ql = b + 64 * n;
    const uint8_t* qh = b + 128 + 32 * n;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * n;
    const int lo = (k & 1) ? ql[l + 32] : ql[l];
    const int v = (((k < 2) ? (lo & 0xF) : (lo >> 4)) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
    return h2f(reinterpret_cast<const uint16_t*>(w.d)[blk]) * float(sc[l / 16 + 2 * k]) * float(v);
}

}  // namespace qinfer::cuda
