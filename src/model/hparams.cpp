#include "model/hparams.h"

#include <algorithm>

#include "common/error.h"
#include "gguf/gguf.h"

namespace qinfer {

const char* arch_name(Arch a) {
    switch (a) {
        case Arch::Qwen2: return "qwen2";
        case Arch::Qwen3: return "qwen3";
        case Arch::Qwen35: return "qwen35";
    }
    return "?";
}

int64_t HParams::n_attention_layers() const {
    int64_t n = 0;
    for (int64_t i = 0; i < n_layer; ++i) n += is_recurrent(i) ? 0 : 1;
    return n;
}

namespace {
// Per-layer arrays are allowed for some counts; all layers must agree here (dense models).
int64_t uint_or_array(const gguf::File& f, const std::string& key, int64_t def, bool required) {
    const gguf::Value* v = f.find(key);
    if (!v) {
        if (required) fail(strfmt("model: %s: required key '%s' is missing", f.path().c_str(), key.c_str()));
        return def;
    }
    if (v->is_array()) {
        // Ollama-style per-layer arrays: take the largest (recurrent layers may say 0).
        int64_t best = 0;
        for (uint64_t i = 0; i < v->count; ++i) best = std::max(best, v->int_at(i));
        return best;
    }
    return int64_t(f.require_uint(key));
}
}  // namespace

HParams HParams::from_gguf(const gguf::File& f) {
    HParams hp;
    hp.arch_str = std::string(f.require_string("general.architecture"));
    if (hp.arch_str == "qwen2") hp.arch = Arch::Qwen2;
    else if (hp.arch_str == "qwen3") hp.arch = Arch::Qwen3;
    else if (hp.arch_str == "qwen35") hp.arch = Arch::Qwen35;
    else fail(strfmt("model: %s: unsupported architecture '%s' (supported: qwen35, qwen3, qwen2)", f.path().c_str(),
                     hp.arch_str.c_str()));
    const std::string a = hp.arch_str + ".";
    auto key = [&](const char* k) { return a + k; };

    hp.n_embd = int64_t(f.require_uint(key("embedding_length")));
    hp.n_layer_all = int64_t(f.require_uint(key("block_count")));
    int64_t nextn = int64_t(f.get_uint(key("nextn_predict_layers")).value_or(0));
    hp.n_layer = hp.n_layer_all - nextn;
    hp.n_ff = uint_or_array(f, key("feed_forward_length"), 0, true);
    hp.n_head = uint_or_array(f, key("attention.head_count"), 0, true);
    hp.n_head_kv = uint_or_array(f, key("attention.head_count_kv"), hp.n_head, false);
    hp.n_ctx_train = int64_t(f.require_uint(key("context_length")));
    hp.rms_eps = float(f.require_float(key("attention.layer_norm_rms_epsilon")));
    hp.rope_base = float(f.get_float(key("rope.freq_base")).value_or(10000.0));
    if (hp.n_embd <= 0 || hp.n_layer <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_ff <= 0)
        fail(strfmt("model: %s: embedding_length, block_count, head counts and feed_forward_length must be positive",
                    f.path().c_str()));
    if (hp.n_head % hp.n_head_kv != 0)
        fail(strfmt("model: %s: head_count %lld is not a multiple of head_count_kv %lld", f.path().c_str(),
                    (long long)hp.n_head, (long long)hp.n_head_kv));
    hp.head_dim = int64_t(f.get_uint(key("attention.key_length")).value_or(uint64_t(hp.n_embd / hp.n_head)));
    int64_t vdim = int64_t(f.get_uint(key("attention.value_length")).value_or(uint64_t(hp.head_dim)));
    if (vdim != hp.head_dim)
        fail(strfmt("model: %s: attention.value_length %lld != key_length %lld is not supported", f.path().c_str(),
                    (long long)vdim, (long long)hp.head_dim));
    hp.n_rot = int64_t(f.get_uint(key("rope.dimension_count")).value_or(uint64_t(hp.head_dim)));
    if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0)
        fail(strfmt("model: %s: rope.dimension_count %lld is invalid for head dim %lld", f.path().c_str(),
                    (long long)hp.n_rot, (long long)hp.head_dim));
    if (auto st = f.get_string(key("rope.scaling.type")); st && *st == "linear") {
        double factor = f.get_float(key("rope.scaling.factor")).value_or(0.0);
        if (factor > 0) hp.rope_scale_linear = float(factor);
    }

    const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
    if (!emb) fail(strfmt("model: %s: tensor 'token_embd.weight' is missing", f.path().c_str()));
    hp.n_vocab = emb->ne[1];
    hp.tied_output = f.find_tensor("output.weight") == nullptr;
    hp.has_qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;

    hp.recurrent.assign(size_t(hp.n_layer), false);
    if (hp.arch == Arch::Qwen35) {
        hp.ssm_conv_kernel = int64_t(f.require_uint(key("ssm.conv_kernel")));
        hp.ssm_state = int64_t(f.require_uint(key("ssm.state_size")));
        hp.ssm_k_heads = int64_t(f.require_uint(key("ssm.group_count")));
        hp.ssm_v_heads = int64_t(f.require_uint(key("ssm.time_step_rank")));
        hp.ssm_inner = int64_t(f.require_uint(key("ssm.inner_size")));
        if (hp.ssm_k_heads <= 0 || hp.ssm_v_heads <= 0 || hp.ssm_v_heads % hp.ssm_k_heads != 0 || hp.ssm_state <= 0 ||
            hp.ssm_inner != hp.ssm_v_heads * hp.ssm_state || hp.ssm_conv_kernel < 1)
            fail(strfmt("model: %s: inconsistent ssm.* hyperparameters", f.path().c_str()));
        if (const gguf::Value* rl = f.find(key("attention.recurrent_layers"))) {
            for (int64_t i = 0; i < hp.n_layer; ++i)
                hp.recurrent[size_t(i)] = rl->is_array() ? (uint64_t(i) < rl->count && rl->int_at(uint64_t(i)) != 0)
                                                         : rl->u != 0;
        } else {
            int64_t interval = int64_t(f.get_uint(key("full_attention_interval")).value_or(4));
            if (interval <= 0) fail(strfmt("model: %s: full_attention_interval must be positive", f.path().c_str()));
            for (int64_t i = 0; i < hp.n_layer; ++i) hp.recurrent[size_t(i)] = (i + 1) % interval != 0;
        }
    }
    return hp;
}

StateSizes state_sizes(const HParams& hp, GgmlType kv_type) {
    StateSizes s;
    // KV: 2 (K and V) * n_kv * d elements per token per attention layer.
    const TypeTraits& tt = traits(kv_type);
    uint64_t elems = uint64_t(2 * hp.n_head_kv * hp.head_dim);
    s.kv_bytes_per_token_layer = elems * tt.type_size / tt.block_size;
    s.kv_bytes_per_token = s.kv_bytes_per_token_layer * uint64_t(hp.n_attention_layers());
    if (hp.arch == Arch::Qwen35) {
        uint64_t conv = uint64_t((hp.ssm_conv_kernel - 1) * hp.ssm_conv_channels());
        uint64_t S = uint64_t(hp.ssm_v_heads * hp.ssm_state * hp.ssm_state);
        s.recurrent_bytes_per_seq_layer = 4 * (conv + S);
        s.recurrent_bytes_per_seq = s.recurrent_bytes_per_seq_layer * uint64_t(hp.n_recurrent_layers());
    }
    return s;
}

}  // namespace qinfer
