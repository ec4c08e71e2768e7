#include "convert/tensor_map.h"

#include <cmath>
#include <cstring>
#include <set>

#include "common/error.h"

namespace qinfer::convert {

int64_t hf_value_head(int64_t j, int64_t h_k, int64_t h_v) {
    const int64_t r = h_v / h_k;
    return (j % h_k) * r + j / h_k;
}

int64_t PlannedTensor::rows() const {
    int64_t n = 1;
    for (size_t i = 1; i < ne.size(); ++i) n *= ne[i];
    return n;
}

void PlannedTensor::read_rows(int64_t row0, int64_t n, float* dst) const {
    const int64_t ne0 = ne[0];
    if (row_src.empty() && col_block == 0) {
        st_read_f32(*src, row0 * ne0, n * ne0, dst);
    } else {
        std::vector<float> tmp(col_block ? size_t(ne0) : 0);
        for (int64_t i = 0; i < n; ++i) {
            const int64_t s = row_src.empty() ? row0 + i : row_src[size_t(row0 + i)];
            float* out = dst + i * ne0;
            if (col_block == 0) {
                st_read_f32(*src, s * ne0, ne0, out);
                continue;
            }
            st_read_f32(*src, s * ne0, ne0, tmp.data());
            for (size_t b = 0; b < col_src.size(); ++b)
                std::memcpy(out + int64_t(b) * col_block, tmp.data() + col_src[b] * col_block,
                            size_t(col_block) * sizeof(float));
        }
    }
    if (op == RowOp::AddOne)
        for (int64_t k = 0; k < n * ne0; ++k) dst[k] += 1.0f;
    else if (op == RowOp::NegExp)
        for (int64_t k = 0; k < n * ne0; ++k) dst[k] = -std::exp(dst[k]);
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

class Mapper {
public:
    Mapper(const HfConfig& c, const Checkpoint& ck) : c_(c), ck_(ck) {}

    TensorPlan run() {
        find_prefix();
        const int64_t E = c_.n_embd, V = c_.vocab_size, F = c_.n_ff, d = c_.head_dim;
        const int64_t Q = c_.n_head * d, G = c_.n_head_kv * d;
        const bool q35 = c_.arch == Arch::Qwen35;

        add("token_embd.weight", "embed_tokens.weight", {V, E});
        add("output_norm.weight", "norm.weight", {E}, true, q35 ? RowOp::AddOne : RowOp::Copy);
        if (const StTensor* lm = ck_.find("lm_head.weight"); lm && !c_.tie_embeddings) {
            add_full("output.weight", "lm_head.weight", {V, E});
            plan_.tied_output = false;
        } else if (lm) {
            used_.insert("lm_head.weight");
            plan_.notes.push_back("tie_word_embeddings is true: lm_head.weight is not written (output uses token_embd)");
        }

        for (int64_t i = 0; i < c_.n_layer; ++i) {
            const std::string b = "blk." + std::to_string(i) + ".";
            const std::string h = "layers." + std::to_string(i) + ".";
            const RowOp norm_op = q35 ? RowOp::AddOne : RowOp::Copy;
            add(b + "attn_norm.weight", h + "input_layernorm.weight", {E}, true, norm_op);
            add(b + (q35 ? "post_attention_norm.weight" : "ffn_norm.weight"), h + "post_attention_layernorm.weight",
                {E}, true, norm_op);
            if (!q35 || !c_.recurrent[size_t(i)]) {
                const std::string a = h + "self_attn.";
                add(b + "attn_q.weight", a + "q_proj.weight", {q35 ? 2 * Q : Q, E});
                add(b + "attn_k.weight", a + "k_proj.weight", {G, E});
                add(b + "attn_v.weight", a + "v_proj.weight", {G, E});
                add(b + "attn_output.weight", a + "o_proj.weight", {E, Q});
                if (c_.arch == Arch::Qwen2 || has(a + "q_proj.bias")) {
                    add(b + "attn_q.bias", a + "q_proj.bias", {Q}, true);
                    add(b + "attn_k.bias", a + "k_proj.bias", {G}, true);
                    add(b + "attn_v.bias", a + "v_proj.bias", {G}, true);
                }
                if (c_.arch != Arch::Qwen2) {
                    add(b + "attn_q_norm.weight", a + "q_norm.weight", {d}, true, norm_op);
                    add(b + "attn_k_norm.weight", a + "k_norm.weight", {d}, true, norm_op);
                }
            } else {
                add_linear_attention(b, h + "linear_attn.");
            }
            add(b + "ffn_gate.weight", h + "mlp.gate_proj.weight", {F, E});
            add(b + "ffn_up.weight", h + "mlp.up_proj.weight", {F, E});
            add(b + "ffn_down.weight", h + "mlp.down_proj.weight", {E, F});
        }
        check_leftovers();
        return std::move(plan_);
    }

private:
    // The GatedDeltaNet block; value-head-indexed rows/channels/columns are
    // reordered from HF's grouped order to the tiled order of §6.3.
    void add_linear_attention(const std::string& b, const std::string& h) {
        const int64_t E = c_.n_embd, dk = c_.ssm_head_dim, Hk = c_.ssm_k_heads, Hv = c_.ssm_v_heads;
        const int64_t Dk = Hk * dk, Dv = Hv * dk, C = 2 * Dk + Dv, K = c_.conv_kernel;
        std::vector<int64_t> head(static_cast<size_t>(Hv)), vrows(static_cast<size_t>(Dv)), qkv(static_cast<size_t>(C));
        for (int64_t j = 0; j < Hv; ++j) head[size_t(j)] = hf_value_head(j, Hk, Hv);
        for (int64_t j = 0; j < Hv; ++j)
            for (int64_t e = 0; e < dk; ++e) vrows[size_t(j * dk + e)] = head[size_t(j)] * dk + e;
        for (int64_t r = 0; r < 2 * Dk; ++r) qkv[size_t(r)] = r;
        for (int64_t r = 0; r < Dv; ++r) qkv[size_t(2 * Dk + r)] = 2 * Dk + vrows[size_t(r)];

        add(b + "attn_qkv.weight", h + "in_proj_qkv.weight", {C, E}).row_src = qkv;
        add(b + "attn_gate.weight", h + "in_proj_z.weight", {Dv, E}).row_src = vrows;
        add(b + "ssm_beta.weight", h + "in_proj_b.weight", {Hv, E}).row_src = head;
        add(b + "ssm_alpha.weight", h + "in_proj_a.weight", {Hv, E}).row_src = head;
        // 1-D per-head vectors: one GGUF row of Hv elements; permute as columns of width 1.
        PlannedTensor& a = add(b + "ssm_a", h + "A_log", {Hv}, true, RowOp::NegExp);
        a.col_block = 1;
        a.col_src = head;
        PlannedTensor& dt = add(b + "ssm_dt.bias", h + "dt_bias", {Hv}, true);
        dt.col_block = 1;
        dt.col_src = head;
        // conv1d [C, 1, K] -> {K, C}: each channel's K taps are one GGUF row.
        const StTensor* cv = need(h + "conv1d.weight", {C, 1, K}, {C, K});
        PlannedTensor& conv = push(b + "ssm_conv1d.weight", {K, C}, cv, true);
        conv.row_src = qkv;
        add(b + "ssm_norm.weight", h + "norm.weight", {dk}, true);
        PlannedTensor& out = add(b + "ssm_out.weight", h + "out_proj.weight", {E, Dv});
        out.col_block = dk;
        out.col_src = head;
    }

    void find_prefix() {
        // Qwen3.5 multimodal checkpoints nest the text model one level deeper.
        for (const char* p : {"model.language_model.", "model.", "language_model.model.", ""})
            if (ck_.find(std::string(p) + "embed_tokens.weight")) {
                prefix_ = p;
                return;
            }
        fail("convert: no embedding tensor found (looked for model.embed_tokens.weight and "
             "model.language_model.embed_tokens.weight); is this a Qwen text model checkpoint?");
    }

    bool has(const std::string& hf) const { return ck_.find(prefix_ + hf) != nullptr; }

    // Looks up a tensor by full name and checks dtype and shape (alt: an accepted
    // alternative shape, e.g. conv1d without the singleton dimension).
    const StTensor* need(const std::string& hf, const std::vector<int64_t>& shape,
                         const std::vector<int64_t>& alt = {}, bool full_name = false) {
        const std::string name = full_name ? hf : prefix_ + hf;
        const StTensor* t = ck_.find(name);
        if (!t)
            fail(strfmt("convert: tensor '%s' is missing from the checkpoint (%s, %lld layers per config.json)",
                        name.c_str(), c_.hf_arch.c_str(), (long long)c_.n_layer));
        if (!st_is_float(t->dtype))
            fail(strfmt("convert: tensor '%s' in %s has dtype %s; expected BF16, F16 or F32", name.c_str(),
                        t->file->c_str(), st_dtype_name(t->dtype)));
        if (t->shape != shape && (alt.empty() || t->shape != alt))
            fail(strfmt("convert: tensor '%s' has shape %s but config.json implies %s", name.c_str(),
                        t->shape_str().c_str(), shape_str(shape).c_str()));
        used_.insert(name);
        return t;
    }

    PlannedTensor& push(const std::string& gguf, std::vector<int64_t> ne, const StTensor* src, bool keep_f32) {
        PlannedTensor p;
        p.name = gguf;
        p.ne = std::move(ne);
        p.src = src;
        p.keep_f32 = keep_f32;
        plan_.tensors.push_back(std::move(p));
        return plan_.tensors.back();
    }

    // HF [out, in] -> GGUF {in, out}: same bytes, reversed shape.
    PlannedTensor& add(const std::string& gguf, const std::string& hf, const std::vector<int64_t>& shape,
                       bool keep_f32 = false, RowOp op = RowOp::Copy) {
        const StTensor* t = need(hf, shape);
        PlannedTensor& p = push(gguf, std::vector<int64_t>(shape.rbegin(), shape.rend()), t, keep_f32);
        p.op = op;
        return p;
    }
    PlannedTensor& add_full(const std::string& gguf, const std::string& hf, const std::vector<int64_t>& shape) {
        const StTensor* t = need(hf, shape, {}, true);
        return push(gguf, std::vector<int64_t>(shape.rbegin(), shape.rend()), t, false);
    }

    void check_leftovers() {
        int64_t vision = 0, mtp = 0;
        for (const StTensor* t : ck_.tensors()) {
            const std::string& n = t->name;
            if (used_.count(n)) continue;
            if (n.find("visual.") != std::string::npos || n.rfind("model.vision", 0) == 0) {
                ++vision;
            } else if (n.rfind("mtp.", 0) == 0 || n.find(".mtp.") != std::string::npos) {
                ++mtp;
            } else if (n.size() >= 19 && n.compare(n.size() - 19, 19, "rotary_emb.inv_freq") == 0) {
                continue;  // a buffer some old checkpoints saved; recomputed from rope_theta
            } else {
                // A leftover layer beyond num_hidden_layers or a renamed tensor
                // means the config and the weights disagree; refuse to guess.
                fail(strfmt("convert: tensor '%s' is not used by the %s mapping (does config.json match the "
                            "weights?)",
                            n.c_str(), c_.hf_arch.c_str()));
            }
        }
        if (vision)
            plan_.notes.push_back(strfmt("skipped %lld vision-tower tensors (only the text model is converted)",
                                         (long long)vision));
        if (mtp)
            plan_.notes.push_back(strfmt("skipped %lld MTP (multi-token prediction) tensors", (long long)mtp));
    }

    const HfConfig& c_;
    const Checkpoint& ck_;
    std::string prefix_;
    std::set<std::string> used_;
    TensorPlan plan_;
};

}  // namespace

TensorPlan plan_tensors(const HfConfig& cfg, const Checkpoint& ck) { return Mapper(cfg, ck).run(); }

}  // namespace qinfer::convert
