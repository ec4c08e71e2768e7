// How quantized weights sit in GPU memory. GGUF blocks are only 2-byte aligned
// (Q8_0 is 34 bytes, Q6_K 210), which rules out 16-byte loads; at upload the
// blocks of such types are split into sections ("struct of arrays" over the
// whole tensor) so that every quant stream is 16-byte aligned:
//
//   Q4_0:  qs[nb][16]              | d[nb]  (f16)
//   Q4_1:  qs[nb][16]              | dm[nb] (f16 d, f16 m)
//   Q5_0:  qs[nb][16] | qh[nb] u32 | d[nb]
//   Q5_1:  qs[nb][16] | qh[nb] u32 | dm[nb]
//   Q8_0:  qs[nb][32]              | d[nb]
//   Q6_K:  {ql[128] qh[64] scales[16]}[nb] | d[nb]
//
// Q4_K (144 B) and Q5_K (176 B) blocks are already multiples of 16 and stay as
// in the file, as do F32, F16 and BF16. Each section starts 16-byte aligned;
// nb counts the blocks of the whole tensor (row r, block j is r * K/bs + j).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "quant/types.h"

namespace qinfer::cuda {

struct WeightLayout {
    size_t main_bytes = 0;  // per block in the main section
    size_t qh_bytes = 0;    // per block in the qh section (0: none)
    size_t d_bytes = 0;     // per block in the scale section (0: none)
    size_t off_qh = 0;      // section offsets from the tensor start
    size_t off_d = 0;
    size_t total = 0;       // bytes of the whole tensor on the GPU
    bool repacked = false;  // layout differs from the file
};

inline size_t align16(size_t n) { return (n + 15) & ~size_t(15); }

// Layout of a tensor of n_blocks blocks of type t.
WeightLayout weight_layout(GgmlType t, int64_t n_blocks);

// Whether the CUDA kernels compute with this weight type.
bool cuda_supports_weight_type(GgmlType t);

// Splits `count` consecutive GGUF blocks of type t (src) into the sections of
// the GPU layout: count entries each into main, qh and d (qh / d may be null
// when the layout has no such section). Types that are not repacked are copied
// to main unchanged. Used chunk by chunk while streaming weights to the GPU.
void repack_blocks(GgmlType t, const void* src, int64_t count, void* main, void* qh, void* d);

// The whole tensor at once: dst has weight_layout(t, n_blocks).total bytes.
void repack_weight(GgmlType t, const void* src, int64_t n_blocks, void* dst);

}  // namespace qinfer::cuda
