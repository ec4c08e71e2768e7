#include "convert/random_model.h"

#include <chrono>
#include <cstring>
#include <map>
#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "common/fp16.h"
#include "common/platform.h"
#include "common/thread_pool.h"
#include "convert/encode.h"
#include "convert/gguf_meta.h"
#include "convert/hf_vocab.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "quant/quant.h"

namespace qinfer::convert {

namespace {

// ---- presets (spec/models.md §0, §5.1; reference MANIFEST §3.2 for the tiny one)

HfConfig dense(const char* name, Arch arch, int64_t E, int64_t L, int64_t H, int64_t KV, int64_t d, int64_t F,
               int64_t V, double theta, int64_t ctx) {
    HfConfig c;
    c.name = name;
    c.arch = arch;
    c.hf_arch = "random";
    c.n_embd = E;
    c.n_layer = L;
    c.n_head = H;
    c.n_head_kv = KV;
    c.head_dim = d;
    c.head_dim_explicit = true;
    c.n_ff = F;
    c.vocab_size = V;
    c.rope_theta = theta;
    c.n_ctx_train = ctx;
    c.rms_eps = 1e-6;
    c.tie_embeddings = true;
    c.recurrent.assign(size_t(L), false);
    return c;
}

HfConfig hybrid(const char* name, int64_t E, int64_t L, int64_t H, int64_t KV, int64_t F, int64_t V, int64_t n_rot,
                std::vector<int32_t> sections, int64_t ssm_d, int64_t Hk, int64_t Hv, int64_t d = 256) {
    HfConfig c = dense(name, Arch::Qwen35, E, L, H, KV, d, F, V, 1e7, 262144);
    c.n_rot = n_rot;
    c.rope_sections = std::move(sections);
    c.conv_kernel = 4;
    c.ssm_head_dim = ssm_d;
    c.ssm_k_heads = Hk;
    c.ssm_v_heads = Hv;
    c.full_attention_interval = 4;
    for (int64_t i = 0; i < L; ++i) c.recurrent[size_t(i)] = (i + 1) % 4 != 0;
    return c;
}

// ---- deterministic per-row random streams (reference MANIFEST §3.4)

uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

struct Rng {
    uint64_t s;
    Rng(uint64_t seed, uint64_t name_hash, int64_t row) : s(seed) {
        s ^= name_hash;
        splitmix(s);
        s ^= uint64_t(row) * 0xD1B54A32D192ED03ull;
        splitmix(s);
    }
    float uniform() { return float((splitmix(s) >> 40) + 1) * (1.0f / 16777216.0f); }  // (0, 1]
    // Box-Muller; float math is plenty for random weights and keeps generation fast.
    void normal(float* dst, int64_t n, float mean, float stddev) {
        for (int64_t i = 0; i < n; i += 2) {
            const uint64_t x = splitmix(s);
            const float u1 = float((x >> 40) + 1) * (1.0f / 16777216.0f);
            const float u2 = float(x & 0xFFFFFF) * (1.0f / 16777216.0f);
            const float r = std::sqrt(-2.0f * std::log(u1)) * stddev;
            const float a = 6.2831853f * u2;
            dst[i] = mean + r * std::cos(a);
            if (i + 1 < n) dst[i + 1] = mean + r * std::sin(a);
        }
    }
};

enum class Init { Embed, Matrix, Norm, Bias, DtBias, SsmA, Conv };

struct RandTensor {
    std::string name;
    std::vector<int64_t> ne;
    Init init = Init::Matrix;
    float gain = 1.0f;
    int64_t corr_lo = 0, corr_hi = 0;  // rows [lo, hi) lean on rows [lo - (hi - lo), lo)
    GgmlType type = GgmlType::F32;

    int64_t rows() const { return ne.size() > 1 ? ne[1] : 1; }
};

void fill_row(const RandTensor& t, uint64_t seed, uint64_t h, int64_t r, float* dst) {
    const int64_t n = t.ne[0];
    Rng rng(seed, h, r);
    switch (t.init) {
        case Init::Embed: rng.normal(dst, n, 0.f, 0.1f); return;
        case Init::Norm: rng.normal(dst, n, 1.f, 0.1f); return;
        case Init::Bias: rng.normal(dst, n, 0.f, 0.05f); return;
        case Init::DtBias: rng.normal(dst, n, -1.f, 0.25f); return;
        case Init::SsmA:
            for (int64_t i = 0; i < n; ++i) dst[i] = -std::exp(rng.uniform() * std::log(16.0f));
            return;
        case Init::Matrix:
        case Init::Conv: {
            const float sd = t.init == Init::Conv ? 0.3f : t.gain / std::sqrt(float(n));
            rng.normal(dst, n, 0.f, sd);
            // Key rows follow their query rows (0.9 q + sqrt(0.19) noise): keeps
            // q.k away from orthogonal, as real models are.
            if (r >= t.corr_lo && r < t.corr_hi) {
                std::vector<float> q(size_t(n), 0.f);
                Rng qr(seed, h, r - (t.corr_hi - t.corr_lo));
                qr.normal(q.data(), n, 0.f, sd);
                const float c = std::sqrt(1.0f - 0.81f);
                for (int64_t i = 0; i < n; ++i) dst[i] = 0.9f * q[size_t(i)] + c * dst[i];
            }
            return;
        }
    }
}

// Quantizing billions of values with the reference K-quant fitter takes ~40 s
// for a 4B model on 16 cores. Instead, quantized rows are assembled from blocks
// drawn at random from a pool of pre-quantized N(0, sd) blocks: the values have
// the same distribution (already quantized), rows are distinct (8192^blocks
// choices), and assembling is a memcpy.
constexpr int64_t kPoolBlocks = 8192;

struct BlockPool {
    int64_t block_elems = 0;
    size_t block_bytes = 0;
    std::vector<uint8_t> data;
};

BlockPool make_pool(GgmlType t, float sd, uint64_t seed, ThreadPool& tp) {
    BlockPool p;
    p.block_elems = traits(t).block_size;
    p.block_bytes = traits(t).type_size;
    p.data.resize(size_t(kPoolBlocks) * p.block_bytes);
    const uint64_t h = fnv1a(std::string("pool:") + type_name(t)) ^ uint64_t(fp32_to_bits(sd));
    tp.parallel_for(kPoolBlocks / 64, [&](int64_t k, int) {
        std::vector<float> x(size_t(p.block_elems));
        for (int64_t i = k * 64; i < (k + 1) * 64; ++i) {
            Rng rng(seed, h, i);
            rng.normal(x.data(), p.block_elems, 0.f, sd);
            quantize_row(t, x.data(), p.data.data() + size_t(i) * p.block_bytes, p.block_elems);
        }
    });
    return p;
}

void assemble_row(const BlockPool& p, uint64_t seed, uint64_t h, int64_t r, int64_t ne0, uint8_t* dst) {
    Rng rng(seed, h, r);
    for (int64_t b = 0; b < ne0 / p.block_elems; ++b) {
        const uint64_t idx = ((splitmix(rng.s) >> 32) * uint64_t(kPoolBlocks)) >> 32;
        std::memcpy(dst + size_t(b) * p.block_bytes, p.data.data() + idx * p.block_bytes, p.block_bytes);
    }
}

// A quantized tensor's rows: pool blocks, except rows that lean on other rows
// (DeltaNet key rows), which are built in f32 from the dequantized query row
// and quantized one by one.
void quantized_rows(const RandTensor& t, const BlockPool& p, uint64_t seed, uint64_t h, int64_t r0, int64_t n,
                    uint8_t* dst) {
    const int64_t ne0 = t.ne[0];
    const size_t rb = row_bytes(t.type, ne0);
    std::vector<uint8_t> qbytes;
    std::vector<float> q, x;
    for (int64_t r = r0; r < r0 + n; ++r) {
        uint8_t* out = dst + size_t(r - r0) * rb;
        if (r < t.corr_lo || r >= t.corr_hi) {
            assemble_row(p, seed, h, r, ne0, out);
            continue;
        }
        qbytes.resize(rb);
        q.resize(size_t(ne0));
        x.resize(size_t(ne0));
        assemble_row(p, seed, h, r - (t.corr_hi - t.corr_lo), ne0, qbytes.data());
        dequantize_row(t.type, qbytes.data(), q.data(), ne0);
        Rng rng(seed, h ^ 0x5bd1e995ull, r);
        const float sd = t.gain / std::sqrt(float(ne0));
        rng.normal(x.data(), ne0, 0.f, sd);
        const float c = std::sqrt(1.0f - 0.81f);
        for (int64_t i = 0; i < ne0; ++i) x[size_t(i)] = 0.9f * q[size_t(i)] + c * x[size_t(i)];
        quantize_row(t.type, x.data(), out, ne0);
    }
}

float init_sd(const RandTensor& t) { return t.init == Init::Embed ? 0.1f : t.gain / std::sqrt(float(t.ne[0])); }

// Tensors in llama.cpp's file order: globals, then each layer by name.
std::vector<RandTensor> tensor_list(const HfConfig& c) {
    std::vector<RandTensor> v;
    auto add = [&](std::string name, std::vector<int64_t> ne, Init init, float gain = 1.f) -> RandTensor& {
        RandTensor t;
        t.name = std::move(name);
        t.ne = std::move(ne);
        t.init = init;
        t.gain = gain;
        v.push_back(std::move(t));
        return v.back();
    };
    const int64_t E = c.n_embd, F = c.n_ff, d = c.head_dim, Q = c.n_head * d, G = c.n_head_kv * d, V = c.vocab_size;
    const bool q35 = c.arch == Arch::Qwen35;
    add("token_embd.weight", {E, V}, Init::Embed);
    add("output_norm.weight", {E}, Init::Norm);
    if (!c.tie_embeddings) add("output.weight", {E, V}, Init::Embed);
    const int64_t dk = c.ssm_head_dim, Dk = c.ssm_k_heads * dk, Dv = c.ssm_v_heads * dk, C = 2 * Dk + Dv;
    const int64_t Hv = c.ssm_v_heads;
    for (int64_t i = 0; i < c.n_layer; ++i) {
        const std::string b = "blk." + std::to_string(i) + ".";
        const bool rec = q35 && c.recurrent[size_t(i)];
        // alphabetical within a layer
        if (!rec) {
            add(b + "attn_k.weight", {E, G}, Init::Matrix);
            if (c.arch == Arch::Qwen2) add(b + "attn_k.bias", {G}, Init::Bias);
            if (c.arch != Arch::Qwen2) add(b + "attn_k_norm.weight", {d}, Init::Norm);
        }
        if (rec) add(b + "attn_gate.weight", {E, Dv}, Init::Matrix);
        add(b + "attn_norm.weight", {E}, Init::Norm);
        if (!rec) {
            add(b + "attn_output.weight", {Q, E}, Init::Matrix);
            add(b + "attn_q.weight", {E, q35 ? 2 * Q : Q}, Init::Matrix);
            if (c.arch == Arch::Qwen2) add(b + "attn_q.bias", {Q}, Init::Bias);
            if (c.arch != Arch::Qwen2) add(b + "attn_q_norm.weight", {d}, Init::Norm);
        }
        if (rec) {
            RandTensor& qkv = add(b + "attn_qkv.weight", {E, C}, Init::Matrix);
            qkv.corr_lo = Dk;
            qkv.corr_hi = 2 * Dk;
        }
        if (!rec) {
            add(b + "attn_v.weight", {E, G}, Init::Matrix);
            if (c.arch == Arch::Qwen2) add(b + "attn_v.bias", {G}, Init::Bias);
        }
        add(b + "ffn_down.weight", {F, E}, Init::Matrix);
        add(b + "ffn_gate.weight", {E, F}, Init::Matrix);
        if (!q35) add(b + "ffn_norm.weight", {E}, Init::Norm);
        add(b + "ffn_up.weight", {E, F}, Init::Matrix);
        if (q35) add(b + "post_attention_norm.weight", {E}, Init::Norm);
        if (rec) {
            add(b + "ssm_a", {Hv}, Init::SsmA);
            add(b + "ssm_alpha.weight", {E, Hv}, Init::Matrix, 0.5f);
            add(b + "ssm_beta.weight", {E, Hv}, Init::Matrix);
            RandTensor& conv = add(b + "ssm_conv1d.weight", {c.conv_kernel, C}, Init::Conv);
            conv.corr_lo = Dk;
            conv.corr_hi = 2 * Dk;
            add(b + "ssm_dt.bias", {Hv}, Init::DtBias);
            add(b + "ssm_norm.weight", {dk}, Init::Norm);
            add(b + "ssm_out.weight", {Dv, E}, Init::Matrix);
        }
    }
    return v;
}

const char* kSpecials[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
};

std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) s += char(cp);
    else {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
    }
    return s;
}

// 256 byte tokens in the GPT-2 byte-level alphabet (tokenizer.md §3), the Qwen
// special tokens, then [PAD] entries.
GgufVocab synthetic_vocab() {
    GgufVocab v;
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
        const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        v.tokens.push_back(utf8(printable ? b : next++));
        v.types.push_back(kTokNormal);
    }
    for (const char* s : kSpecials) {
        v.tokens.emplace_back(s);
        v.types.push_back(token_looks_special(s) ? kTokControl : kTokUserDefined);
    }
    v.bos = v.pad = 256;
    v.eos = v.eot = 258;
    return v;
}

GgufVocab load_vocab(const std::string& src) {
    namespace fs = std::filesystem;
    if (fs::is_directory(src)) return read_hf_vocab(src, VocabInputs{});
    auto f = gguf::File::open(src);
    GgufVocab v;
    const auto* toks = f->get_string_array("tokenizer.ggml.tokens");
    if (!toks) fail("convert: " + src + " has no tokenizer.ggml.tokens");
    for (std::string_view t : *toks) v.tokens.emplace_back(t);
    const gguf::Value* ty = f->find("tokenizer.ggml.token_type");
    for (size_t i = 0; i < v.tokens.size(); ++i)
        v.types.push_back(ty && ty->is_array() && i < ty->count ? int32_t(ty->int_at(i)) : kTokNormal);
    if (const auto* m = f->get_string_array("tokenizer.ggml.merges"))
        for (std::string_view s : *m) v.merges.emplace_back(s);
    auto id = [&](const char* k) -> std::optional<uint32_t> {
        if (auto x = f->get_uint(k)) return uint32_t(*x);
        return std::nullopt;
    };
    v.bos = id("tokenizer.ggml.bos_token_id");
    v.eos = id("tokenizer.ggml.eos_token_id");
    v.eot = id("tokenizer.ggml.eot_token_id");
    v.pad = id("tokenizer.ggml.padding_token_id");
    if (auto t = f->get_string("tokenizer.chat_template")) v.chat_template = std::string(*t);
    return v;
}

}  // namespace

std::vector<std::string> random_presets() { return {"tiny-qwen35", "qwen35-0.8b", "qwen35-4b", "qwen3-4b", "qwen3-0.6b"}; }

HfConfig random_preset(const std::string& name) {
    if (name == "tiny-qwen35") return hybrid("tiny-qwen35", 256, 8, 4, 2, 512, 8218, 16, {3, 3, 2, 0}, 32, 2, 4, 64);
    if (name == "qwen35-0.8b") return hybrid("qwen35-0.8b", 1024, 24, 8, 2, 3584, 248320, 64, {11, 11, 10, 0}, 128, 16, 16);
    if (name == "qwen35-4b") return hybrid("qwen35-4b", 2560, 32, 16, 4, 9216, 248320, 64, {11, 11, 10, 0}, 128, 16, 32);
    if (name == "qwen3-4b") return dense("qwen3-4b", Arch::Qwen3, 2560, 36, 32, 8, 128, 9728, 151936, 1e6, 40960);
    if (name == "qwen3-0.6b") return dense("qwen3-0.6b", Arch::Qwen3, 1024, 28, 16, 8, 128, 3072, 151936, 1e6, 40960);
    std::string list;
    for (const std::string& p : random_presets()) list += (list.empty() ? "" : ", ") + p;
    fail("convert: unknown random preset '" + name + "' (presets: " + list + ")");
}

RandomModelResult write_random_model(const std::string& out_path, const RandomModelOptions& opt) {
    const auto t0 = std::chrono::steady_clock::now();
    HfConfig c = random_preset(opt.preset);
    c.name = "random-" + opt.preset + "-seed" + std::to_string(opt.seed);
    std::vector<RandTensor> ts = tensor_list(c);

    GgufVocab vocab = opt.vocab.empty() ? synthetic_vocab() : load_vocab(opt.vocab);
    if (int64_t(vocab.tokens.size()) > c.vocab_size)
        fail(strfmt("convert: vocabulary %s has %zu tokens, more than the preset's %lld embedding rows",
                    opt.vocab.c_str(), vocab.tokens.size(), (long long)c.vocab_size));
    for (int64_t i = int64_t(vocab.tokens.size()); i < c.vocab_size; ++i) {
        vocab.tokens.push_back("[PAD" + std::to_string(i) + "]");
        vocab.types.push_back(kTokUnused);
    }
    vocab.pre = c.arch == Arch::Qwen35 ? "qwen35" : "qwen2";

    int64_t n_attn_v = 0;
    for (const RandTensor& t : ts)
        if (t.name.find("attn_v.weight") != std::string::npos || t.name.find("attn_qkv.weight") != std::string::npos)
            ++n_attn_v;
    TypeMix mix(opt.ftype, c.n_layer, n_attn_v, !c.tie_embeddings);
    bool any_quant = false;
    RandomModelResult res;
    for (RandTensor& t : ts) {
        t.type = mix.next(t.name, int(t.ne.size()), t.ne[0]);
        any_quant = any_quant || is_quantized(t.type);
        res.n_params += uint64_t(t.ne[0] * t.rows());
    }

    gguf::Writer w;
    write_hparams(w, c, llama_ftype(opt.ftype));
    write_vocab(w, vocab);
    if (any_quant) w.set_u32("general.quantization_version", 2);

    ThreadPool pool(opt.n_threads > 0 ? opt.n_threads : physical_cores());
    ThreadPool* pp = &pool;
    const uint64_t seed = opt.seed;
    std::map<std::pair<int, uint32_t>, BlockPool> pools;
    for (const RandTensor& t : ts) {
        const RandTensor* tp = &t;
        const uint64_t h = fnv1a(t.name);
        if (!is_quantized(t.type)) {
            w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne), [tp, pp, seed, h](const gguf::ByteSink& sink) {
                stream_rows(sink, tp->type, tp->ne[0], tp->rows(),
                            [tp, seed, h](int64_t r0, int64_t n, float* dst) {
                                for (int64_t r = 0; r < n; ++r) fill_row(*tp, seed, h, r0 + r, dst + r * tp->ne[0]);
                            },
                            pp);
            });
            continue;
        }
        const float sd = init_sd(t);
        auto key = std::make_pair(int(t.type), fp32_to_bits(sd));
        if (!pools.count(key)) pools.emplace(key, make_pool(t.type, sd, seed, pool));
        const BlockPool* bp = &pools.at(key);
        w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne), [tp, bp, pp, seed, h](const gguf::ByteSink& sink) {
            stream_encoded_rows(sink, tp->type, tp->ne[0], tp->rows(),
                                [tp, bp, seed, h](int64_t r0, int64_t n, uint8_t* dst) {
                                    quantized_rows(*tp, *bp, seed, h, r0, n, dst);
                                },
                                pp);
        });
    }
    res.n_tensors = ts.size();
    res.file_bytes = w.file_size();
    if (opt.log)
        opt.log(strfmt("writing %s: %s, %zu tensors, %.2f B parameters, %s, %.2f GB", out_path.c_str(),
                       opt.preset.c_str(), res.n_tensors, double(res.n_params) / 1e9, ftype_name(opt.ftype),
                       double(res.file_bytes) / 1e9));
    w.write(out_path);
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
}

}  // namespace qinfer::convert
