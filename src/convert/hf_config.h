// Hugging Face config.json -> the hyperparameters a GGUF needs (spec/models.md
// §5.1, §7). Qwen3.5 checkpoints nest the text model under "text_config"; its
// keys take precedence over the top level, as in llama.cpp's converter.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/hparams.h"

namespace qinfer::convert {

struct HfConfig {
    std::string hf_arch;         // "Qwen3ForCausalLM", ...
    Arch arch = Arch::Qwen3;
    int64_t n_embd = 0;
    int64_t n_layer = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;
    bool head_dim_explicit = false;  // config had "head_dim" (written as attention.key_length)
    int64_t n_ff = 0;
    int64_t vocab_size = 0;
    int64_t n_ctx_train = 0;
    double rms_eps = 1e-6;
    double rope_theta = 10000;
    bool tie_embeddings = false;
    bool attention_bias = false;     // qwen2 q/k/v biases (always present in Qwen2 checkpoints)

    // rope scaling ("linear" or "yarn"; empty = none)
    std::string rope_scaling_type;
    double rope_scaling_factor = 0;
    int64_t rope_scaling_orig_ctx = 0;

    // qwen35
    int64_t n_rot = 0;                     // head_dim * partial_rotary_factor
    std::vector<int32_t> rope_sections;    // 4 entries
    int64_t conv_kernel = 0;
    int64_t ssm_head_dim = 0;              // linear_key_head_dim == linear_value_head_dim
    int64_t ssm_k_heads = 0;
    int64_t ssm_v_heads = 0;
    std::vector<bool> recurrent;           // per layer
    int64_t full_attention_interval = 0;   // 0: layer_types follow no interval pattern
    int64_t mtp_layers = 0;                // skipped by the converter

    // special token ids from config.json (fallbacks for tokenizer_config.json)
    std::optional<int64_t> bos_id, eos_id, pad_id;

    std::string name;  // folder name, for general.name
};

// Reads and validates `dir`/config.json. Throws Error naming the file and key.
HfConfig read_hf_config(const std::string& dir);
// Same from JSON text (`where` names the source in messages).
HfConfig parse_hf_config(const std::string& json_text, const std::string& where);

}  // namespace qinfer::convert
