// qwen3 (Qwen3 dense), spec/models.md §4: qwen2 without biases, plus a per-head
// RMSNorm of q and k (weights {head_dim}) before RoPE; head_dim is independent of E.
#include "model/layers.h"

namespace qinfer {

namespace {

void bind_layer(WeightBinder& b, const HParams& hp, int il, LayerWeights& w) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const int64_t E = hp.n_embd, d = hp.head_dim, Q = hp.n_head * d, G = hp.n_head_kv * d;
    w.attn_norm = b.f32(p + "attn_norm.weight", {E});
    w.attn_q = b.matrix(p + "attn_q.weight", E, Q);
    w.attn_k = b.matrix(p + "attn_k.weight", E, G);
    w.attn_v = b.matrix(p + "attn_v.weight", E, G);
    w.attn_q_b = b.optional_f32(p + "attn_q.bias", {Q});  // loader-optional, absent in Qwen3 files
    w.attn_k_b = b.optional_f32(p + "attn_k.bias", {G});
    w.attn_v_b = b.optional_f32(p + "attn_v.bias", {G});
    w.attn_q_norm = b.f32(p + "attn_q_norm.weight", {d});
    w.attn_k_norm = b.f32(p + "attn_k_norm.weight", {d});
    w.attn_output = b.matrix(p + "attn_output.weight", Q, E);
    w.ffn_norm = b.f32(p + "ffn_norm.weight", {E});
    w.ffn_gate = b.matrix(p + "ffn_gate.weight", E, hp.n_ff);
    w.ffn_up = b.matrix(p + "ffn_up.weight", E, hp.n_ff);
    w.ffn_down = b.matrix(p + "ffn_down.weight", hp.n_ff, E);
}

void forward_layer(const LayerCtx& c, const LayerWeights& w) {
    attention_block(c, w, {.qk_norm = true});
    ffn_block(c, w.ffn_norm, w);
}

}  // namespace

const ArchDef& qwen3_arch() {
    static const ArchDef def{bind_layer, forward_layer};
    return def;
}

}  // namespace qinfer
