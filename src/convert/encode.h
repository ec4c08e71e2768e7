// Turning f32 rows into a GGUF tensor's bytes, streamed to the writer in
// row batches that are produced and encoded on all threads. Shared by
// `convert` (HF weights) and the random-model generator.
#pragma once
#include <cstdint>
#include <functional>

#include "gguf/writer.h"
#include "quant/types.h"

namespace qinfer {
class ThreadPool;
}

namespace qinfer::convert {

// Encodes n_rows rows of ne0 floats each into dst (n_rows * row_bytes(t, ne0) bytes).
// F32, F16, BF16 directly; quantized types through quantize_row().
void encode_rows(GgmlType t, const float* src, int64_t ne0, int64_t n_rows, uint8_t* dst);

// Fills rows [row0, row0 + n) of a tensor as f32 (n * ne0 floats). Called
// concurrently from several threads for disjoint ranges.
using RowProducer = std::function<void(int64_t row0, int64_t n, float* dst)>;

// Writes a tensor of n_rows rows x ne0 to `sink`, in order. `pool` may be null
// (single-threaded).
void stream_rows(const gguf::ByteSink& sink, GgmlType t, int64_t ne0, int64_t n_rows, const RowProducer& produce,
                 ThreadPool* pool);

// Same, for producers that write rows already encoded as type t
// (n * row_bytes(t, ne0) bytes).
using EncodedRowProducer = std::function<void(int64_t row0, int64_t n, uint8_t* dst)>;
void stream_encoded_rows(const gguf::ByteSink& sink, GgmlType t, int64_t ne0, int64_t n_rows,
                         const EncodedRowProducer& produce, ThreadPool* pool);

}  // namespace qinfer::convert
