// Building blocks shared by the architectures: the plain GQA attention block
// (qwen2, qwen3) and the SwiGLU FFN (all three).
#include <cmath>

#include "model/dump.h"
#include "model/layers.h"

namespace qinfer {

void LayerCtx::dump(const char* name, const Tensor& t) const {
    if (dumper) dumper->write(il, name, t);
}

void ffn_block(const LayerCtx& c, const Tensor& norm, const LayerWeights& w) {
    Backend& be = c.be;
    const Tensor x = c.tok(c.s.x), h = c.tok(c.s.h), g = c.tok(c.s.ffn_g), u = c.tok(c.s.ffn_u),
                 out = c.tok(c.s.mix);
    be.rms_norm(x, norm, c.hp.rms_eps, h);      c.dump("ffn_norm", h);
    be.matmul(w.ffn_gate, h, g);
    be.matmul(w.ffn_up, h, u);
    be.swiglu(g, u, g);                         c.dump("ffn_act", g);
    be.matmul(w.ffn_down, g, out);              c.dump("ffn_out", out);
    be.add(x, out, x);                          c.dump("l_out", x);
}

void attention_block(const LayerCtx& c, const LayerWeights& w, const AttnOptions& opt) {
    Backend& be = c.be;
    const HParams& hp = c.hp;
    const int64_t d = hp.head_dim, T = c.T;
    const Tensor x = c.tok(c.s.x), h = c.tok(c.s.h), out = c.tok(c.s.mix);
    const Tensor q = reshape(c.tok(c.s.q), {d, hp.n_head, T});
    const Tensor k = reshape(c.tok(c.s.k), {d, hp.n_head_kv, T});
    const Tensor v = reshape(c.tok(c.s.v), {d, hp.n_head_kv, T});
    const Tensor att = reshape(c.tok(c.s.att), {d, hp.n_head, T});

    be.rms_norm(x, w.attn_norm, hp.rms_eps, h);        c.dump("attn_norm", h);
    be.matmul(w.attn_q, h, c.tok(c.s.q), &w.attn_q_b);
    be.matmul(w.attn_k, h, c.tok(c.s.k), &w.attn_k_b);
    be.matmul(w.attn_v, h, c.tok(c.s.v), &w.attn_v_b);
    if (opt.qk_norm) {
        be.rms_norm(q, w.attn_q_norm, hp.rms_eps, q);  c.dump("Qcur_normed", q);
        be.rms_norm(k, w.attn_k_norm, hp.rms_eps, k);  c.dump("Kcur_normed", k);
    }
    be.rope_neox(q, c.step, int(hp.n_rot), hp.rope_base, 1.f / hp.rope_scale_linear);
    be.rope_neox(k, c.step, int(hp.n_rot), hp.rope_base, 1.f / hp.rope_scale_linear);
    c.dump("Qcur", q);
    c.dump("Kcur", k);
    c.dump("Vcur", v);
    be.attention(q, k, v, *c.kv, c.step, 1.f / std::sqrt(float(d)), att);
    c.dump("attn_pre_out", att);
    be.matmul(w.attn_output, c.tok(c.s.att), out);     c.dump("attn_out", out);
    be.add(x, out, x);                                  c.dump("attn_residual", x);
}

}  // namespace qinfer
