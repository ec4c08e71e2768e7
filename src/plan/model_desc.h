// A model as the memory planner sees it: hyperparameters plus a tensor table
// (name, type, shape, bytes). It comes either from a GGUF file's tensor infos
// or from a shape preset with a llama-quantize type mix (plan/presets.h), so a
// model that is not on disk can be planned with the same code.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/hparams.h"
#include "quant/types.h"

namespace qinfer {
namespace gguf { class File; }

struct TensorEntry {
    std::string name;
    GgmlType type = GgmlType::F32;
    int64_t ne[4] = {1, 1, 1, 1};
    uint64_t nbytes = 0;

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

struct ModelDesc {
    std::string name;  // file path or preset name, for messages and reports
    HParams hp;
    std::vector<TensorEntry> tensors;

    const TensorEntry* find(std::string_view tensor_name) const;
    uint64_t total_bytes() const;
};

// The tensor table of an opened file (per-tensor types as stored: never
// inferred from general.file_type, which community files often contradict).
ModelDesc describe_model(const gguf::File& f, const HParams& hp);

// Bytes of a tensor of `type` with extents ne (ne[0] must be a whole number of blocks).
uint64_t tensor_nbytes(GgmlType type, const int64_t ne[4]);

// Layer index of a "blk.N.*" name, or -1 for global tensors (token_embd, output, ...).
int64_t tensor_layer(std::string_view name);

}  // namespace qinfer
