// Internal interface between cpu_matmul (driver: activation quantization,
// threading, tiling, ISA dispatch) and the per-ISA dot-product kernels
// (cpu_kernels_scalar.cpp, cpu_kernels_avx2.cpp, cpu_kernels_avx512.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/cpu_matmul.h"
#include "quant/types.h"

namespace qinfer {
class ThreadPool;
struct block_q8_K;
struct block_q8_0;
}

namespace qinfer::kernels {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };
const char* isa_name(Isa isa);  // "scalar", "avx2", "avx512vnni"

// What the activations are converted to before the dot products with a weight type.
enum class ActFormat { F32, Q8_0, Q8_1, Q8_K };
ActFormat act_format(GgmlType wt);
size_t act_row_bytes(ActFormat f, int64_t K);

// Most activation rows one kernel call handles: each weight block is unpacked
// once and multiplied with up to kMaxTile activation rows.
constexpr int kMaxTile = 4;

// out[r * out_stride] = dot(weight row w, activation row r), r < R (1 <= R <= kMaxTile).
// Activation row r starts at a + r * a_stride bytes (in the format act_format(wt)).
using DotFn = void (*)(int64_t K, const void* w, const void* a, size_t a_stride, int R, float* out,
                       int64_t out_stride);

constexpr int kTypeSlots = 43;  // ggml type ids 0..42
struct KernelTable {
    DotFn dot[kTypeSlots] = {};
    // K-quants, one activation row (decode): the same dot continued from the
    // value already in out[0], so a row computed in chunks of super-blocks, the
    // first starting from 0, gives exactly the one-pass result. Only where a
    // SIMD file provides it.
    DotFn dot_continue[kTypeSlots] = {};
    // f32 activations -> Q8_K blocks, bit-identical to quantize_ref_q8_K
    // (nullptr: that reference quantizer).
    void (*quantize_q8_K)(const float* x, block_q8_K* y, int64_t n) = nullptr;
    // f32 -> Q8_0 blocks, bit-identical to quantize_ref_q8_0 (a q8_0 KV cache's
    // rows; nullptr: that reference quantizer).
    void (*quantize_q8_0)(const float* x, block_q8_0* y, int64_t n) = nullptr;
};

// Tables per ISA; nullptr when the ISA was not compiled in. Entries missing in a
// SIMD table fall back to the next lower level.
const KernelTable* scalar_table();
const KernelTable* avx2_table();
const KernelTable* avx512_table();

// Best level this CPU supports, lowered by env QINFER_CPU_ISA if set.
Isa detected_isa();

// Which kernels a matrix-matrix product uses: Auto = the int8 tile kernels
// (cpu_q8_gemm.h) for supported types from q8_gemm_min_rows() activation rows
// on SIMD CPUs, else the dot kernels; Dot / Gemm force one (tests, benchmarks;
// Gemm falls back to Dot for types without a tile kernel).
enum class TilePath { Auto, Dot, Gemm };

// cpu_matmul with an explicit ISA (tests compare levels against each other).
// Throws Error if the CPU does not support the requested level.
void matmul_isa(Isa isa, GgmlType wt, const void* W, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                int64_t ldy, ThreadPool& pool, TilePath path = TilePath::Auto);
void matmul_group_isa(Isa isa, const MatmulJob* jobs, size_t n_jobs, int64_t K, const float* x, int64_t T,
                      ThreadPool& pool, TilePath path = TilePath::Auto);
bool cpu_supports(Isa isa);
std::vector<Isa> supported_isas();  // every level this CPU and build can run, scalar first
// The kernel for one job, after checking its type and shape (throws Error).
DotFn check_job(Isa isa, const MatmulJob& job, int64_t K, int64_t T);

}  // namespace qinfer::kernels
