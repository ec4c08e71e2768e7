// Byte layouts of the ggml block types (spec/quants.md §4-§5), defined once and
// shared by dequantization, quantization, the CPU kernels and the CUDA kernels.
// Plain structs only (no STL): this header is also compiled by nvcc. Halves are
// stored as raw uint16_t bits; convert with common/fp16.h (host) or the CUDA
// intrinsics (device). Blocks are packed back to back in tensor data, so every
// struct must have exactly the ggml size: the static_asserts below guard that.
#pragma once
#include <stdint.h>

namespace qinfer {

constexpr int QK4_0 = 32;
constexpr int QK4_1 = 32;
constexpr int QK5_0 = 32;
constexpr int QK5_1 = 32;
constexpr int QK8_0 = 32;
constexpr int QK8_1 = 32;
constexpr int QK_K = 256;
constexpr int K_SCALE_SIZE = 12;  // packed 6-bit scales + mins of Q4_K / Q5_K

// ---- legacy 32-element blocks ---------------------------------------------------

struct block_q4_0 {
    uint16_t d;              // f16 scale
    uint8_t qs[QK4_0 / 2];   // element e: nibble(qs[e % 16], e >= 16)
};

struct block_q4_1 {
    uint16_t d;              // f16 scale
    uint16_t m;              // f16 min
    uint8_t qs[QK4_1 / 2];
};

struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4];           // bit e = 5th bit of element e (a u32 LE, only 2-byte aligned)
    uint8_t qs[QK5_0 / 2];
};

struct block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};

struct block_q8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};

// Activation helper for Q4_1 / Q5_1 dot products: s = d * sum(qs).
struct block_q8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[QK8_1];
};

// ---- K-quants: super-blocks of 256 -------------------------------------------

struct block_q2_K {
    uint8_t scales[QK_K / 16];  // low nibble scale, high nibble min, per 16 elements
    uint8_t qs[QK_K / 4];       // 2-bit quants
    uint16_t d;                 // f16 scale of scales
    uint16_t dmin;              // f16 scale of mins
};

struct block_q3_K {
    uint8_t hmask[QK_K / 8];    // 3rd bit of each quant (set = no -4 offset)
    uint8_t qs[QK_K / 4];       // low 2 bits
    uint8_t scales[12];         // sixteen 6-bit signed scales, packed
    uint16_t d;
};

struct block_q4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];  // eight 6-bit scales and mins (get_scale_min_k4)
    uint8_t qs[QK_K / 2];
};

struct block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};

struct block_q6_K {
    uint8_t ql[QK_K / 2];      // low 4 bits
    uint8_t qh[QK_K / 4];      // high 2 bits
    int8_t scales[QK_K / 16];  // per 16 elements
    uint16_t d;
};

// Activation helper for all K-quant dot products (never stored in files).
struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];  // sum of qs over each group of 16
};

static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
static_assert(sizeof(block_q8_1) == 36, "block_q8_1 size");
static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");
static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");
static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");
static_assert(alignof(block_q4_0) == 2 && alignof(block_q3_K) == 2, "blocks are only 2-byte aligned");

#ifdef __CUDACC__
#define QINFER_HD __host__ __device__
#else
#define QINFER_HD
#endif

// 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K (ggml get_scale_min_k4).
QINFER_HD inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// get_scale_min_k4 of sub-blocks 2g and 2g + 1 (g = 0..3) at once, from the
// 12 scale bytes held as three little-endian words w0 w1 w2, without
// branches (the GPU products' form: g differs between a warp's lanes, and two
// one-j extractions compiled to branches that diverge). The two sub-blocks'
// bytes are neighbours in each word, so both come from one 16-bit pair with
// byte-wise masks (no shift carries a bit into a byte that keeps it); j < 4
// and j >= 4 are joined by selects.
QINFER_HD inline void get_scale_min_k4_pair(int g, uint32_t w0, uint32_t w1, uint32_t w2, int& sc0, int& m0,
                                            int& sc1, int& m1) {
    const int k = 16 * (g & 1);
    const uint32_t y = w0 >> k, z = w1 >> k, w = w2 >> k;
    const uint32_t sc_lo = y & 0x3F3Fu, m_lo = z & 0x3F3Fu;
    const uint32_t sc_hi = (w & 0x0F0Fu) | ((y >> 2) & 0x3030u), m_hi = ((w >> 4) & 0x0F0Fu) | ((z >> 2) & 0x3030u);
    const uint32_t sc = g >= 2 ? sc_hi : sc_lo, m = g >= 2 ? m_hi : m_lo;
    sc0 = int(sc & 0xFFu);
    sc1 = int((sc >> 8) & 0xFFu);
    m0 = int(m & 0xFFu);
    m1 = int((m >> 8) & 0xFFu);
}

// Signed 6-bit scale s (0..15) of Q3_K, in [-32, 31].
QINFER_HD inline int q3_K_scale(const uint8_t* scales, int s) {
    const int lo4 = s < 8 ? (scales[s] & 0xF) : (scales[s - 8] >> 4);
    const int hi2 = (scales[8 + (s % 4)] >> (2 * (s / 4))) & 3;
    return (lo4 | (hi2 << 4)) - 32;
}

// qh of Q5_0 / Q5_1 as a u32 (the field is only 2-byte aligned).
QINFER_HD inline uint32_t load_qh32(const uint8_t* qh) {
    return uint32_t(qh[0]) | (uint32_t(qh[1]) << 8) | (uint32_t(qh[2]) << 16) | (uint32_t(qh[3]) << 24);
}

}  // namespace qinfer
