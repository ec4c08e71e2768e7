// Int8 tile kernels for prompt processing (matrix x many activation rows) on
// K-quant weights. The activations are the Q8_K rows cpu_matmul already makes
// (one float scale per 256 values, int8 quants, int16 sums per 16), so every
// output is the same integer sum as in the matrix-vector kernels and batch
// results agree with token-by-token decoding up to float summation order.
//
// What changes is the weight side. The matrix-vector kernels unpack a weight
// block and dot it with up to 4 activation rows, one horizontal sum per output.
// Here NR weight rows are first repacked into a "panel" (once per call), with
// four consecutive unsigned quants of each row side by side:
//   quants of super-block i: for step s (K offset 4s) and row j: u[j][4s..4s+3]
// so one 32-bit lane of a SIMD vector is one weight row. A kernel broadcasts 4
// activation bytes and multiplies them with the whole vector (u8 x s8 ->
// int32 lanes: maddubs+madd on AVX2, vpdpbusd on AVX512-VNNI): every lane
// accumulates its own output, no horizontal sums, no per-row unpacking, and
// an MR x NR register tile reuses each load MR (or NR) times.
//
// Generic form of a K-quant super-block (as in cpu_kernels_scalar.cpp):
//   dot = d_a * (dA * sum_g sc[g] * sum_{e in g} u_e a_e  -  dB * sum_p mn . bsums)
// with scale groups g of S = 16 or 32 values and the "min" coefficients per 16.
// Panel layout per super-block (NR rows), after the 256*NR quant bytes:
//   int32 sc[256/S][NR]    the scale of group g for row j
//   int32 mn[8][NR]        two int16 min coefficients (groups 2p, 2p+1) per row
//   float dA[NR], dB[NR]
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/cpu_kernels.h"
#include "quant/types.h"

namespace qinfer::kernels {

// Scale-group size S of a K-quant weight type in the panel (0: no int8 tile
// kernel for this type).
int q8_group_size(GgmlType wt);

constexpr size_t q8_superblock_bytes(int S, int nr) {
    return size_t(nr) * (256 + 4 * (256 / S) + 4 * 8 + 8);
}

// Bytes of a panel of nr rows of K (multiple of 256) elements.
size_t q8_panel_bytes(GgmlType wt, int64_t K, int nr);

// Packs n <= nr weight rows (row i at W + i * row_bytes) into a panel; rows
// n..nr-1 are zero (their outputs are computed and dropped).
void q8_pack_panel(GgmlType wt, const uint8_t* W, size_t row_bytes, int n, int nr, int64_t K, uint8_t* panel);

// y[r * ldy + j] = dot(panel row j, Q8_K activation row r) for r < R, j < n.
// Activation row r starts at act + r * act_stride. 1 <= R <= mr, n <= nr.
using GemmFn = void (*)(int64_t K, const uint8_t* panel, const uint8_t* act, size_t act_stride, int R, float* y,
                        int64_t ldy, int n);

// A faster q8_pack_panel for one type and panel width.
using PackFn = void (*)(const uint8_t* W, size_t row_bytes, int n, int64_t K, uint8_t* panel);

struct GemmKernel {
    GemmFn fn = nullptr;
    PackFn pack = nullptr;  // nullptr: q8_pack_panel
    int nr = 0;  // weight rows per panel (= SIMD lanes of int32)
    int mr = 0;  // most activation rows per call
};

struct GemmTable {
    GemmKernel k[kTypeSlots];
};

// Per ISA, like the dot tables; nullptr when not compiled in. The AVX-512 table
// needs AVX512-VNNI (Isa::Avx512 implies it).
const GemmTable* q8_gemm_scalar_table();
const GemmTable* q8_gemm_avx2_table();
const GemmTable* q8_gemm_avx512_table();

// The tile kernel for this ISA and type, or {} (use the dot kernels).
GemmKernel pick_gemm(Isa isa, GgmlType wt);

// Prompts shorter than this use the dot kernels: repacking the weights costs
// about as much as a few activation rows of work.
int q8_gemm_min_rows(GgmlType wt);

}  // namespace qinfer::kernels
