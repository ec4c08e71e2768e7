// Which tensor gets which type for a llama.cpp file type ("ftype") such as
// Q4_K_M (spec/quants.md §9): category rules, the use_more_bits layer
// promotion, and the block-size fallbacks. Tensors must be visited in file
// order (the attn_v-like counter depends on it).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "quant/types.h"

namespace qinfer::convert {

enum class Ftype { F32, F16, BF16, Q8_0, Q4_0, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K };

std::optional<Ftype> ftype_from_name(std::string_view name);  // "q4_k_m", case-insensitive
const char* ftype_name(Ftype f);
uint32_t llama_ftype(Ftype f);  // general.file_type value
const char* ftype_list();       // "f32, f16, ..." for messages

// Tensors that are never quantized: fewer than 2 dims, names not ending in
// "weight", norms, ssm_conv1d (quants.md §9.1 step 2).
bool quantizable(std::string_view name, int n_dims);

class TypeMix {
public:
    // n_layer_all: block_count; n_attn_v_like: tensors named attn_v/attn_qkv/attn_kv_b;
    // has_output: the file has output.weight (otherwise token_embd is the tied head).
    TypeMix(Ftype f, int64_t n_layer_all, int64_t n_attn_v_like, bool has_output);

    // Type for the next tensor in file order. Non-quantizable tensors get F32.
    GgmlType next(std::string_view name, int n_dims, int64_t ne0);

private:
    GgmlType rule(std::string_view name, int64_t ne0);
    Ftype f_;
    int64_t n_layer_, n_attn_v_, i_attn_v_ = 0, i_ffn_down_ = 0;
    bool has_output_;
};

}  // namespace qinfer::convert
