// The GPU side of weight streaming from pinned (host-registered) memory: raw
// GGUF blocks copied to the device as they are, then split into the sections of
// the GPU layout (layout.h) by a kernel, so the host does no per-byte work.
#pragma once
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "quant/types.h"

namespace qinfer::cuda {

// dst has weight_layout(t, n_blocks).total bytes; src holds n_blocks GGUF
// blocks of type t (a repacked type: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K).
void repack_blocks_on_device(GgmlType t, const void* src, int64_t n_blocks, void* dst, cudaStream_t s);

}  // namespace qinfer::cuda
