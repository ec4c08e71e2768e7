// qwen35 (Qwen3.5 dense hybrid), spec/models.md §5. Every main layer:
//   x += Mixer(RMSNorm(x; attn_norm));  x += FFN(RMSNorm(x; post_attention_norm))
// where Mixer is gated full attention on layers (i+1) % interval == 0 and a
// Gated DeltaNet elsewhere. Norm weights already contain the "+1" (never add it).
// MTP layers (>= n_layer) are not bound and not run.
#include <cmath>

#include "model/layers.h"

namespace qinfer {

namespace {

void bind_layer(WeightBinder& b, const HParams& hp, int il, LayerWeights& w) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const int64_t E = hp.n_embd, d = hp.head_dim;
    w.attn_norm = b.f32(p + "attn_norm.weight", {E});
    w.ffn_norm = b.f32(p + "post_attention_norm.weight", {E});
    w.ffn_gate = b.matrix(p + "ffn_gate.weight", E, hp.n_ff);
    w.ffn_up = b.matrix(p + "ffn_up.weight", E, hp.n_ff);
    w.ffn_down = b.matrix(p + "ffn_down.weight", hp.n_ff, E);
    if (!hp.is_recurrent(il)) {
        w.attn_q = b.matrix(p + "attn_q.weight", E, 2 * hp.n_head * d);  // per head [query | gate]
        w.attn_k = b.matrix(p + "attn_k.weight", E, hp.n_head_kv * d);
        w.attn_v = b.matrix(p + "attn_v.weight", E, hp.n_head_kv * d);
        w.attn_output = b.matrix(p + "attn_output.weight", hp.n_head * d, E);
        w.attn_q_norm = b.f32(p + "attn_q_norm.weight", {d});
        w.attn_k_norm = b.f32(p + "attn_k_norm.weight", {d});
        return;
    }
    const int64_t Hv = hp.ssm_v_heads, Dv = hp.ssm_inner, C = hp.ssm_conv_channels();
    w.ssm_qkv = b.matrix(p + "attn_qkv.weight", E, C);
    w.ssm_gate = b.matrix(p + "attn_gate.weight", E, Dv);
    w.ssm_beta = b.matrix(p + "ssm_beta.weight", E, Hv);
    w.ssm_alpha = b.matrix(p + "ssm_alpha.weight", E, Hv);
    w.ssm_dt_b = b.f32(p + "ssm_dt.bias", {Hv});
    w.ssm_a = b.f32(p + "ssm_a", {Hv});
    w.ssm_conv1d = b.f32(p + "ssm_conv1d.weight", {hp.ssm_conv_kernel, C});
    w.ssm_norm = b.f32(p + "ssm_norm.weight", {hp.ssm_state});
    w.ssm_out = b.matrix(p + "ssm_out.weight", Dv, E);
}

// §5.4: q_proj yields per head [query(d) | gate(d)]; q/k per-head RMSNorm;
// partial NEOX RoPE on the first n_rot dims; output * sigmoid(gate).
void gated_attention(const LayerCtx& c, const LayerWeights& w) {
    Backend& be = c.be;
    const HParams& hp = c.hp;
    const int64_t d = hp.head_dim, T = c.T, H = hp.n_head;
    const Tensor h = c.tok(c.s.h), out = c.tok(c.s.mix), qg = c.tok(c.s.q);
    const size_t row = size_t(2 * d) * 4, tok = size_t(2 * d * H) * 4;
    const Tensor q_in = view(qg, {d, H, T}, {row, tok}, 0);
    const Tensor gate = view(qg, {d, H, T}, {row, tok}, size_t(d) * 4);
    const Tensor q = reshape(c.tok(c.s.qn), {d, H, T});
    const Tensor k = reshape(c.tok(c.s.k), {d, hp.n_head_kv, T});
    const Tensor v = reshape(c.tok(c.s.v), {d, hp.n_head_kv, T});
    const Tensor att = reshape(c.tok(c.s.att), {d, H, T});

    be.matmul(w.attn_q, h, qg);                        c.dump("Qcur_full", qg);
    be.matmul(w.attn_k, h, c.tok(c.s.k));
    be.matmul(w.attn_v, h, c.tok(c.s.v));
    be.rms_norm(q_in, w.attn_q_norm, hp.rms_eps, q);   c.dump("Qcur_normed", q);
    be.rms_norm(k, w.attn_k_norm, hp.rms_eps, k);      c.dump("Kcur_normed", k);
    be.rope_neox(q, c.step, int(hp.n_rot), hp.rope_base, 1.f / hp.rope_scale_linear);
    be.rope_neox(k, c.step, int(hp.n_rot), hp.rope_base, 1.f / hp.rope_scale_linear);
    c.dump("Qcur", q);
    c.dump("Kcur", k);
    be.attention(q, k, v, *c.kv, c.step, 1.f / std::sqrt(float(d)), att);
    c.dump("attn_pregate", att);
    be.sigmoid_mul(att, gate, att);                    c.dump("attn_gated", att);
    be.matmul(w.attn_output, c.tok(c.s.att), out);
}

// §5.6: projections -> causal conv + SiLU -> L2-normed q, k -> gated delta rule
// (value head j uses key head j mod H_k) -> RMSNorm(o) * silu(z) -> ssm_out.
void gated_deltanet(const LayerCtx& c, const LayerWeights& w) {
    Backend& be = c.be;
    const HParams& hp = c.hp;
    const int64_t T = c.T, dk = hp.ssm_state, Hk = hp.ssm_k_heads, Hv = hp.ssm_v_heads;
    const int64_t Dk = dk * Hk, C = hp.ssm_conv_channels();
    const RecurrentState& rs = *c.rs;
    const Tensor h = c.tok(c.s.h), out = c.tok(c.s.mix);
    const Tensor m = c.tok(c.s.qkv), u = c.tok(c.s.conv), a = c.tok(c.s.a), b = c.tok(c.s.b);
    const size_t tok = size_t(C) * 4;
    const Tensor q = view(u, {dk, Hk, T}, {size_t(dk) * 4, tok}, 0);
    const Tensor k = view(u, {dk, Hk, T}, {size_t(dk) * 4, tok}, size_t(Dk) * 4);
    const Tensor v = view(u, {dk, Hv, T}, {size_t(dk) * 4, tok}, size_t(2 * Dk) * 4);
    const Tensor z = reshape(c.tok(c.s.z), {dk, Hv, T});
    const Tensor o = reshape(c.tok(c.s.o), {dk, Hv, T});
    const Tensor y = reshape(c.tok(c.s.y), {dk, Hv, T});

    be.matmul(w.ssm_qkv, h, m);                        c.dump("linear_attn_qkv_mixed", m);
    be.matmul(w.ssm_gate, h, c.tok(c.s.z));            c.dump("z", z);
    be.matmul(w.ssm_beta, h, b);
    be.matmul(w.ssm_alpha, h, a);
    be.conv1d_silu(m, w.ssm_conv1d, rs, c.step, u);    c.dump("conv_output_silu", u);
    be.l2_norm(q, hp.rms_eps, q);
    be.l2_norm(k, hp.rms_eps, k);
    be.gated_delta_rule(q, k, v, a, b, w.ssm_dt_b, w.ssm_a, rs, c.step, o);
    c.dump("attn_output", o);
    be.rms_norm_gated(o, w.ssm_norm, z, hp.rms_eps, y); c.dump("final_output", y);
    be.matmul(w.ssm_out, c.tok(c.s.y), out);
}

void forward_layer(const LayerCtx& c, const LayerWeights& w) {
    const Tensor x = c.tok(c.s.x), h = c.tok(c.s.h), out = c.tok(c.s.mix);
    c.be.rms_norm(x, w.attn_norm, c.hp.rms_eps, h);   c.dump("attn_norm", h);
    if (c.hp.is_recurrent(c.il))
        gated_deltanet(c, w);
    else
        gated_attention(c, w);
    c.dump("mixer_out", out);
    c.be.add(x, out, x);                               c.dump("attn_residual", x);
    ffn_block(c, w.ffn_norm, w);
}

}  // namespace

const ArchDef& qwen35_arch() {
    static const ArchDef def{bind_layer, forward_layer};
    return def;
}

}  // namespace qinfer
