// HF checkpoint tensor -> GGUF tensor plan (spec/models.md §6, §8): names,
// shapes, and the stored transforms (+1 on zero-centred qwen35 norms,
// ssm_a = -exp(A_log), conv1d squeeze, the V-head reorder of §6.3).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "convert/hf_config.h"
#include "convert/safetensors.h"

namespace qinfer::convert {

enum class RowOp { Copy, AddOne, NegExp };

struct PlannedTensor {
    std::string name;               // GGUF name
    std::vector<int64_t> ne;        // GGUF shape, ne0 first
    bool keep_f32 = false;          // 1-D tensors, norms, biases, ssm_conv1d: always F32
    const StTensor* src = nullptr;  // rows of ne[0] contiguous source elements
    std::vector<int64_t> row_src;   // GGUF row r reads source row row_src[r] (empty: r)
    int64_t col_block = 0;          // if > 0: GGUF column block b reads source block col_src[b]
    std::vector<int64_t> col_src;
    RowOp op = RowOp::Copy;

    int64_t rows() const;
    // Fills GGUF rows [row0, row0 + n) as f32.
    void read_rows(int64_t row0, int64_t n, float* dst) const;
};

struct TensorPlan {
    std::vector<PlannedTensor> tensors;
    std::vector<std::string> notes;  // skipped parts (vision tower, MTP head), ties
    bool tied_output = true;
};

// Maps every tensor of the checkpoint, checking names, shapes and dtypes against
// the config. Unknown tensors, missing tensors and mismatches are errors.
TensorPlan plan_tensors(const HfConfig& cfg, const Checkpoint& ck);

// GGUF value head j <- HF value head, for H_v value heads grouped over H_k key
// heads (§6.3): (j mod H_k) * (H_v / H_k) + j / H_k.
int64_t hf_value_head(int64_t j, int64_t h_k, int64_t h_v);

}  // namespace qinfer::convert
