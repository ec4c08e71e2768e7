// qwen2 (Qwen2, Qwen2.5 dense), spec/models.md §3:
//   x += W_o Attn(RoPE(W_q h + b_q), RoPE(W_k h + b_k), W_v h + b_v),  h = RMSNorm(x; attn_norm)
//   x += FFN(RMSNorm(x; ffn_norm))
#include "model/layers.h"

namespace qinfer {

namespace {

void bind_layer(WeightBinder& b, const HParams& hp, int il, LayerWeights& w) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const int64_t E = hp.n_embd, Q = hp.n_head * hp.head_dim, G = hp.n_head_kv * hp.head_dim;
    w.attn_norm = b.f32(p + "attn_norm.weight", {E});
    w.attn_q = b.matrix(p + "attn_q.weight", E, Q);
    w.attn_k = b.matrix(p + "attn_k.weight", E, G);
    w.attn_v = b.matrix(p + "attn_v.weight", E, G);
    w.attn_q_b = b.optional_f32(p + "attn_q.bias", {Q});  // present in released Qwen2/2.5 files
    w.attn_k_b = b.optional_f32(p + "attn_k.bias", {G});
    w.attn_v_b = b.optional_f32(p + "attn_v.bias", {G});
    w.attn_output = b.matrix(p + "attn_output.weight", Q, E);
    w.ffn_norm = b.f32(p + "ffn_norm.weight", {E});
    w.ffn_gate = b.matrix(p + "ffn_gate.weight", E, hp.n_ff);
    w.ffn_up = b.matrix(p + "ffn_up.weight", E, hp.n_ff);
    w.ffn_down = b.matrix(p + "ffn_down.weight", hp.n_ff, E);
}

void forward_layer(const LayerCtx& c, const LayerWeights& w) {
    attention_block(c, w, {.qk_norm = false});
    ffn_block(c, w.ffn_norm, w);
}

}  // namespace

const ArchDef& qwen2_arch() {
    static const ArchDef def{bind_layer, forward_layer};
    return def;
}

}  // namespace qinfer
