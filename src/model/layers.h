// What an architecture file sees: the weights of one layer, the per-step
// context of the backend that runs it (scratch buffers, token metadata, state),
// and the shared building blocks (attention, FFN). Each architecture file
// (qwen2.cpp, qwen3.cpp, qwen35.cpp) binds its tensors and writes its layer as
// a short recipe over these; model.cpp does the rest (embedding, placement,
// head, state bookkeeping).
#pragma once
#include <string>

#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/backend.h"
#include "runtime/state.h"

namespace qinfer {

// Tensors of one main layer; absent ones are empty. Names follow GGUF.
struct LayerWeights {
    Tensor attn_norm;                  // pre-mixer RMSNorm
    Tensor ffn_norm;                   // pre-FFN RMSNorm (qwen35: post_attention_norm)
    Tensor ffn_gate, ffn_up, ffn_down;
    // attention
    Tensor attn_q, attn_k, attn_v, attn_output;
    Tensor attn_q_b, attn_k_b, attn_v_b;   // qwen2 biases
    Tensor attn_q_norm, attn_k_norm;       // qwen3, qwen35
    // Gated DeltaNet (qwen35)
    Tensor ssm_qkv, ssm_gate, ssm_beta, ssm_alpha, ssm_dt_b, ssm_a, ssm_conv1d, ssm_norm, ssm_out;
};

// Calls f on every tensor of a layer that is present (a layer's weights as a
// set: prompt offload streams them).
template <class W, class F> void for_each_tensor(W& w, F&& f) {
    for (auto* t : {&w.attn_norm, &w.ffn_norm, &w.ffn_gate, &w.ffn_up, &w.ffn_down, &w.attn_q, &w.attn_k,
                      &w.attn_v, &w.attn_output, &w.attn_q_b, &w.attn_k_b, &w.attn_v_b, &w.attn_q_norm,
                      &w.attn_k_norm, &w.ssm_qkv, &w.ssm_gate, &w.ssm_beta, &w.ssm_alpha, &w.ssm_dt_b, &w.ssm_a,
                      &w.ssm_conv1d, &w.ssm_norm, &w.ssm_out})
        if (*t) f(*t);
}

// Activation buffers of one backend, [width, n_batch] f32 each, allocated once
// at load so their addresses never change (CUDA graphs capture them).
struct Scratch {
    Tensor x;        // residual stream [E]
    Tensor h;        // normed input of a block [E]
    Tensor mix;      // mixer / FFN output before the residual add [E]
    Tensor q;        // queries [n_head d] (qwen35: q|gate interleaved, 2 n_head d)
    Tensor qn;       // normed queries [n_head d] (qwen35)
    Tensor k, v;     // [n_kv d]
    Tensor att;      // attention output [n_head d]
    Tensor ffn_g, ffn_u;  // [F]
    // Gated DeltaNet
    Tensor qkv, conv;  // [C]
    Tensor z, o, y;    // [D_v]
    Tensor a, b;       // [H_v]
};

class Dumper;

// Everything a layer's forward needs, for the backend that runs it.
struct LayerCtx {
    Backend& be;
    const HParams& hp;
    const Scratch& s;       // full-capacity buffers; use the T-token views below
    const StepInfo& step;
    const KvCache* kv;            // this layer's state: attention layers
    const RecurrentState* rs;     // Gated DeltaNet layers
    int il;                 // layer index
    int T;                  // tokens in this step
    Dumper* dumper;

    // First T tokens of a scratch buffer.
    Tensor tok(const Tensor& buf) const { return first_rows(buf, T); }
    // Records a named intermediate (no-op unless QINFER_DUMP is set).
    void dump(const char* name, const Tensor& t) const;
};

// ---- shared building blocks (blocks.cpp)

// x += W_down(silu(W_gate h) * W_up h), h = RMSNorm(x; norm).  spec §2.2
void ffn_block(const LayerCtx& c, const Tensor& norm, const LayerWeights& w);

struct AttnOptions {
    bool qk_norm = false;  // qwen3: per-head RMSNorm of q and k before RoPE
};
// x += W_o Attn(RMSNorm(x; attn_norm)) with optional q/k/v biases.  spec §3, §4
void attention_block(const LayerCtx& c, const LayerWeights& w, const AttnOptions& opt);

// ---- architecture registry

struct ArchDef {
    // Binds layer il's tensors (validating shapes) on the given backend.
    void (*bind_layer)(WeightBinder& b, const HParams& hp, int il, LayerWeights& w);
    // Runs layer il on c.s.x (first T tokens) in place.
    void (*forward_layer)(const LayerCtx& c, const LayerWeights& w);
};
const ArchDef& qwen2_arch();
const ArchDef& qwen3_arch();
const ArchDef& qwen35_arch();
const ArchDef& arch_def(Arch a);

}  // namespace qinfer
