// Rewrites a GGUF file with new tensor types (the engine of `qinfer quantize`).
// Which type each tensor gets is the caller's policy (convert/type_mix.h holds
// llama.cpp's ftype mixes); this file does the rest the way llama-quantize does:
// tensors in llama.cpp's order, metadata copied with split.* dropped and
// general.quantization_version / general.file_type set, every row converted to
// f32 and quantized with the reference quantizers (quant.h), rows spread over
// threads. Without an importance matrix the output is byte-identical to
// llama-quantize's.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace qinfer {

struct RequantizeOptions {
    int n_threads = 1;
    uint32_t file_type = 0;  // general.file_type (llama_ftype) of the output
    // Output type of a tensor; called once per tensor, in tensor_visit_order().
    // Returning the tensor's own type copies it unchanged.
    std::function<GgmlType(const gguf::TensorInfo&)> choose_type;
    std::function<void(const std::string&)> log;  // one line per tensor (optional)
};

struct RequantizeStats {
    int n_tensors = 0, n_converted = 0;
    uint64_t n_elements = 0;
    uint64_t in_data_bytes = 0, out_data_bytes = 0;  // tensor data, unpadded
    uint64_t out_file_bytes = 0;
    double seconds = 0;
    double bits_per_weight() const { return n_elements ? 8.0 * double(out_data_bytes) / double(n_elements) : 0; }
};

// llama.cpp's order (weight_name_comparer): tensors outside blk.N first, then by
// layer number; by name within each group. llama-quantize visits and writes in it.
std::vector<const gguf::TensorInfo*> tensor_visit_order(const gguf::File& in);

// Throws Error (naming the tensor) for types that cannot be read or written, or
// rows that are not a multiple of the new type's block size.
RequantizeStats requantize_file(const gguf::File& in, const std::string& out_path, const RequantizeOptions& opt);

}  // namespace qinfer
