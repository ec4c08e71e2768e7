// Hyperparameters of a Qwen-family model, read from GGUF metadata (spec/models.md §7),
// and the one memory-size function used by the planner, the allocator and `info`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quant/types.h"

namespace qinfer {
namespace gguf { class File; }

enum class Arch { Qwen2, Qwen3, Qwen35 };
const char* arch_name(Arch a);

struct HParams {
    Arch arch = Arch::Qwen3;
    std::string arch_str;          // general.architecture
    int64_t n_embd = 0;            // E
    int64_t n_layer = 0;           // main decoder layers L (block_count - nextn_predict_layers)
    int64_t n_layer_all = 0;       // block_count (qwen35 may include MTP layers)
    int64_t n_ff = 0;              // F
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;          // d = key_length (qwen2: E / n_head)
    int64_t n_rot = 0;             // rotated dims per head (qwen35 partial rotary)
    float rope_base = 10000.f;
    float rope_scale_linear = 1.f; // rope.scaling.factor for type "linear" (1 = none)
    float rms_eps = 1e-6f;
    int64_t n_ctx_train = 0;
    int64_t n_vocab = 0;           // rows of token_embd
    bool tied_output = true;       // output.weight absent
    bool has_qkv_bias = false;     // qwen2

    // qwen35 (Gated DeltaNet)
    int64_t ssm_conv_kernel = 0;   // K
    int64_t ssm_state = 0;         // d_k = d_v
    int64_t ssm_k_heads = 0;       // H_k (group_count)
    int64_t ssm_v_heads = 0;       // H_v (time_step_rank)
    int64_t ssm_inner = 0;         // D_v = H_v * d_v
    int64_t ssm_conv_channels() const { return 2 * ssm_k_heads * ssm_state + ssm_inner; }
    std::vector<bool> recurrent;   // per main layer: true = DeltaNet, false = full attention

    bool is_recurrent(int64_t layer) const { return layer < int64_t(recurrent.size()) && recurrent[size_t(layer)]; }
    int64_t n_attention_layers() const;
    int64_t n_recurrent_layers() const { return n_layer - n_attention_layers(); }

    // Reads and validates; throws Error naming the key on a missing/invalid value.
    static HParams from_gguf(const gguf::File& f);
};

// Memory needed by state, per the formulas of spec/models.md §9.
struct StateSizes {
    uint64_t kv_bytes_per_token = 0;        // all attention layers, K and V
    uint64_t kv_bytes_per_token_layer = 0;  // one attention layer
    uint64_t recurrent_bytes_per_seq = 0;   // all DeltaNet layers: conv + S (f32)
    uint64_t recurrent_bytes_per_seq_layer = 0;
};
StateSizes state_sizes(const HParams& hp, GgmlType kv_type);

}  // namespace qinfer
