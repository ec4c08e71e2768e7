#include "convert/gguf_meta.h"

#include <string>
#include <vector>

#include "common/error.h"
#include "gguf/writer.h"

namespace qinfer::convert {

uint32_t file_type_of(GgmlType t) {
    switch (t) {
        case GgmlType::F32: return 0;
        case GgmlType::F16: return 1;
        case GgmlType::Q4_0: return 2;
        case GgmlType::Q4_1: return 3;
        case GgmlType::Q8_0: return 7;
        case GgmlType::Q5_0: return 8;
        case GgmlType::Q5_1: return 9;
        case GgmlType::Q6_K: return 18;
        case GgmlType::BF16: return 32;
        default: fail(strfmt("convert: no file type for %s", type_name(t)));
    }
}

void write_hparams(gguf::Writer& w, const HfConfig& c, uint32_t file_type) {
    const std::string a = arch_name(c.arch);
    auto key = [&](const char* k) { return a + "." + k; };
    w.set_string("general.architecture", a);
    w.set_string("general.type", "model");
    if (!c.name.empty()) w.set_string("general.name", c.name);
    w.set_u32("general.file_type", file_type);
    w.set_u32(key("context_length"), uint32_t(c.n_ctx_train));
    w.set_u32(key("embedding_length"), uint32_t(c.n_embd));
    w.set_u32(key("block_count"), uint32_t(c.n_layer));
    w.set_u32(key("feed_forward_length"), uint32_t(c.n_ff));
    w.set_u32(key("attention.head_count"), uint32_t(c.n_head));
    w.set_u32(key("attention.head_count_kv"), uint32_t(c.n_head_kv));
    w.set_f32(key("rope.freq_base"), float(c.rope_theta));
    w.set_f32(key("attention.layer_norm_rms_epsilon"), float(c.rms_eps));
    // qwen2 derives d = E / n_head; qwen3 and qwen35 must state it (4B: 2560/32 != 128).
    if (c.arch != Arch::Qwen2 || c.head_dim_explicit) {
        w.set_u32(key("attention.key_length"), uint32_t(c.head_dim));
        w.set_u32(key("attention.value_length"), uint32_t(c.head_dim));
    }
    if (!c.rope_scaling_type.empty() && c.rope_scaling_factor > 0) {
        w.set_string(key("rope.scaling.type"), c.rope_scaling_type);
        w.set_f32(key("rope.scaling.factor"), float(c.rope_scaling_factor));
        if (c.rope_scaling_orig_ctx > 0)
            w.set_u32(key("rope.scaling.original_context_length"), uint32_t(c.rope_scaling_orig_ctx));
    }
    if (c.arch != Arch::Qwen35) return;

    w.set_u32(key("rope.dimension_count"), uint32_t(c.n_rot));
    std::vector<int32_t> sections = c.rope_sections;
    sections.resize(4, 0);
    w.set_array(key("rope.dimension_sections"), sections);
    w.set_u32(key("ssm.conv_kernel"), uint32_t(c.conv_kernel));
    w.set_u32(key("ssm.state_size"), uint32_t(c.ssm_head_dim));
    w.set_u32(key("ssm.group_count"), uint32_t(c.ssm_k_heads));
    w.set_u32(key("ssm.time_step_rank"), uint32_t(c.ssm_v_heads));
    w.set_u32(key("ssm.inner_size"), uint32_t(c.ssm_v_heads * c.ssm_head_dim));
    if (c.full_attention_interval > 0) {
        w.set_u32(key("full_attention_interval"), uint32_t(c.full_attention_interval));
    } else {
        // No interval reproduces layer_types: state the schedule per layer (§5.2).
        std::vector<bool> rec(c.recurrent.begin(), c.recurrent.end());
        w.set_bool_array(key("attention.recurrent_layers"), rec);
    }
}

}  // namespace qinfer::convert
