#include "plan/presets.h"

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace qinfer {

// ------------------------------------------------------------------ file types

namespace {
struct FileTypeName {
    FileType ft;
    const char* name;
};
constexpr FileTypeName kFileTypes[] = {
    {FileType::Q4_K_M, "q4_k_m"}, {FileType::Q4_K_S, "q4_k_s"}, {FileType::Q5_K_M, "q5_k_m"},
    {FileType::Q5_K_S, "q5_k_s"}, {FileType::Q6_K, "q6_k"},     {FileType::Q8_0, "q8_0"},
    {FileType::F16, "f16"},       {FileType::BF16, "bf16"},     {FileType::F32, "f32"},
};

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
            return false;
    return true;
}
}  // namespace

const char* file_type_name(FileType ft) {
    for (const FileTypeName& f : kFileTypes)
        if (f.ft == ft) return f.name;
    return "?";
}

std::optional<FileType> file_type_from_name(std::string_view s) {
    for (const FileTypeName& f : kFileTypes)
        if (iequals(s, f.name)) return f.ft;
    return std::nullopt;
}

std::vector<std::string> file_type_names() {
    std::vector<std::string> v;
    for (const FileTypeName& f : kFileTypes) v.push_back(f.name);
    return v;
}

// ------------------------------------------------------------------ type mix (quants.md §9)

namespace {

enum class Category { Output, TokenEmbd, AttnVLike, FfnDown, Other };

Category category(std::string_view name) {
    auto has = [&](std::string_view s) { return name.find(s) != std::string_view::npos; };
    if (name == "output.weight") return Category::Output;
    if (name == "token_embd.weight") return Category::TokenEmbd;
    if (has("attn_qkv.weight") || has("attn_kv_b.weight") || has("attn_v.weight")) return Category::AttnVLike;
    if (has("ffn_down")) return Category::FfnDown;
    return Category::Other;
}

// llama-quantize's tensor_allows_quantization, for the names Qwen files have.
bool quantizable(const TensorEntry& t) {
    int dims = 4;
    while (dims > 1 && t.ne[dims - 1] == 1) --dims;
    std::string_view n = t.name;
    if (dims < 2) return false;
    if (n.size() < 6 || n.substr(n.size() - 6) != "weight") return false;
    if (n.find("_norm.weight") != std::string_view::npos) return false;
    if (n.find("ssm_conv1d") != std::string_view::npos) return false;
    return true;
}

bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

bool is_float_ftype(FileType ft) { return ft == FileType::F32 || ft == FileType::F16 || ft == FileType::BF16; }

GgmlType float_type(FileType ft) {
    return ft == FileType::F32 ? GgmlType::F32 : ft == FileType::BF16 ? GgmlType::BF16 : GgmlType::F16;
}

GgmlType default_type(FileType ft) {
    switch (ft) {
        case FileType::Q4_K_M: case FileType::Q4_K_S: return GgmlType::Q4_K;
        case FileType::Q5_K_M: case FileType::Q5_K_S: return GgmlType::Q5_K;
        case FileType::Q6_K: return GgmlType::Q6_K;
        case FileType::Q8_0: return GgmlType::Q8_0;
        default: return float_type(ft);
    }
}

// Rule table of quants.md §9.1 step 7. i/n: the attn_v-like or ffn_down counter.
GgmlType rule_type(FileType ft, Category cat, bool tied, int64_t i, int64_t n) {
    const GgmlType def = default_type(ft);
    if (ft == FileType::Q8_0 || ft == FileType::Q6_K) return def;
    switch (cat) {
        case Category::Output: return GgmlType::Q6_K;
        case Category::TokenEmbd: return tied ? GgmlType::Q6_K : def;
        case Category::AttnVLike:
        case Category::FfnDown:
            switch (ft) {
                case FileType::Q4_K_S:
                    return (cat == Category::AttnVLike ? i < 4 : i < n / 8) ? GgmlType::Q5_K : GgmlType::Q4_K;
                case FileType::Q4_K_M: return use_more_bits(i, n) ? GgmlType::Q6_K : GgmlType::Q4_K;
                case FileType::Q5_K_S: return GgmlType::Q5_K;
                case FileType::Q5_K_M: return use_more_bits(i, n) ? GgmlType::Q6_K : GgmlType::Q5_K;
                default: return def;
            }
        case Category::Other: return def;
    }
    return def;
}

// Step 8: rows that are not a whole number of blocks fall back to a 32-block type.
GgmlType shape_fallback(GgmlType t, Category cat, bool tied, int64_t ne0) {
    if (ne0 % int64_t(traits(t).block_size) == 0) return t;
    if (cat == Category::Output || (cat == Category::TokenEmbd && tied))
        return ne0 % 32 == 0 ? GgmlType::Q8_0 : GgmlType::F16;
    GgmlType f = t;
    switch (t) {
        case GgmlType::Q2_K: case GgmlType::Q3_K: f = GgmlType::Q4_0; break;
        case GgmlType::Q4_K: f = GgmlType::Q5_0; break;
        case GgmlType::Q5_K: f = GgmlType::Q5_1; break;
        case GgmlType::Q6_K: f = GgmlType::Q8_0; break;
        default: break;
    }
    return ne0 % int64_t(traits(f).block_size) == 0 ? f : GgmlType::F16;
}

// The converter's tensors for hp (spec/models.md §8), 1-D ones F32, matrices
// typed later. Per layer in name order, as llama-quantize visits them.
std::vector<TensorEntry> source_tensors(const HParams& hp) {
    std::vector<TensorEntry> out;
    auto add = [&](std::string name, std::initializer_list<int64_t> ne) {
        TensorEntry t;
        t.name = std::move(name);
        int i = 0;
        for (int64_t n : ne) t.ne[i++] = n;
        out.push_back(std::move(t));
    };
    const int64_t E = hp.n_embd, V = hp.n_vocab, F = hp.n_ff, d = hp.head_dim;
    const int64_t Q = hp.n_head * d, G = hp.n_head_kv * d;
    add("token_embd.weight", {E, V});
    add("output_norm.weight", {E});
    if (!hp.tied_output) add("output.weight", {E, V});

    for (int64_t il = 0; il < hp.n_layer; ++il) {
        const size_t first = out.size();
        auto blk = [&](const char* s) { return "blk." + std::to_string(il) + "." + s; };
        add(blk("attn_norm.weight"), {E});
        add(blk("ffn_gate.weight"), {E, F});
        add(blk("ffn_up.weight"), {E, F});
        add(blk("ffn_down.weight"), {F, E});
        if (hp.arch == Arch::Qwen35) {
            add(blk("post_attention_norm.weight"), {E});
            if (hp.is_recurrent(il)) {
                const int64_t C = hp.ssm_conv_channels(), Hv = hp.ssm_v_heads;
                add(blk("attn_qkv.weight"), {E, C});
                add(blk("attn_gate.weight"), {E, hp.ssm_inner});
                add(blk("ssm_beta.weight"), {E, Hv});
                add(blk("ssm_alpha.weight"), {E, Hv});
                add(blk("ssm_dt.bias"), {Hv});
                add(blk("ssm_a"), {Hv});
                add(blk("ssm_conv1d.weight"), {hp.ssm_conv_kernel, C});
                add(blk("ssm_norm.weight"), {hp.ssm_state});
                add(blk("ssm_out.weight"), {hp.ssm_inner, E});
                std::sort(out.begin() + std::ptrdiff_t(first), out.end(),
                          [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
                continue;
            }
            add(blk("attn_q.weight"), {E, 2 * Q});  // queries and output gate, interleaved per head
        } else {
            add(blk("ffn_norm.weight"), {E});
            add(blk("attn_q.weight"), {E, Q});
        }
        add(blk("attn_k.weight"), {E, G});
        add(blk("attn_v.weight"), {E, G});
        add(blk("attn_output.weight"), {Q, E});
        if (hp.arch != Arch::Qwen2) {
            add(blk("attn_q_norm.weight"), {d});
            add(blk("attn_k_norm.weight"), {d});
        }
        if (hp.has_qkv_bias) {
            add(blk("attn_q.bias"), {Q});
            add(blk("attn_k.bias"), {G});
            add(blk("attn_v.bias"), {G});
        }
        std::sort(out.begin() + std::ptrdiff_t(first), out.end(),
                  [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
    }
    return out;
}

}  // namespace

std::vector<TensorEntry> synthesize_tensors(const HParams& hp, FileType ft) {
    std::vector<TensorEntry> ts = source_tensors(hp);
    int64_t n_wv = 0;
    for (const TensorEntry& t : ts) n_wv += category(t.name) == Category::AttnVLike ? 1 : 0;
    const int64_t n_down = hp.n_layer_all;
    int64_t i_wv = 0, i_down = 0;
    for (TensorEntry& t : ts) {
        const Category cat = category(t.name);
        if (!quantizable(t)) {
            t.type = GgmlType::F32;  // 1-D tensors and ssm_conv1d stay F32 in converter output
        } else if (is_float_ftype(ft)) {
            t.type = float_type(ft);
        } else {
            int64_t i = cat == Category::AttnVLike ? i_wv : i_down;
            int64_t n = cat == Category::AttnVLike ? n_wv : n_down;
            t.type = shape_fallback(rule_type(ft, cat, hp.tied_output, i, n), cat, hp.tied_output, t.ne[0]);
        }
        if (cat == Category::AttnVLike) ++i_wv;
        if (cat == Category::FfnDown) ++i_down;
        t.nbytes = tensor_nbytes(t.type, t.ne);
    }
    return ts;
}

// ------------------------------------------------------------------ shape presets

namespace {

HParams dense(Arch arch, int64_t E, int64_t L, int64_t n_head, int64_t n_kv, int64_t d, int64_t F, int64_t V,
              bool tied, int64_t ctx, float base) {
    HParams hp;
    hp.arch = arch;
    hp.arch_str = arch_name(arch);
    hp.n_embd = E;
    hp.n_layer = hp.n_layer_all = L;
    hp.n_ff = F;
    hp.n_head = n_head;
    hp.n_head_kv = n_kv;
    hp.head_dim = hp.n_rot = d;
    hp.rope_base = base;
    hp.n_ctx_train = ctx;
    hp.n_vocab = V;
    hp.tied_output = tied;
    hp.has_qkv_bias = arch == Arch::Qwen2;
    hp.recurrent.assign(size_t(L), false);
    return hp;
}

HParams hybrid(int64_t E, int64_t L, int64_t n_head, int64_t n_kv, int64_t d, int64_t n_rot, int64_t F, int64_t V,
               int64_t K, int64_t d_state, int64_t H_k, int64_t H_v, int64_t interval, int64_t ctx) {
    HParams hp = dense(Arch::Qwen35, E, L, n_head, n_kv, d, F, V, true, ctx, 1e7f);
    hp.n_rot = n_rot;
    hp.ssm_conv_kernel = K;
    hp.ssm_state = d_state;
    hp.ssm_k_heads = H_k;
    hp.ssm_v_heads = H_v;
    hp.ssm_inner = H_v * d_state;
    for (int64_t i = 0; i < L; ++i) hp.recurrent[size_t(i)] = (i + 1) % interval != 0;
    return hp;
}

struct ShapePreset {
    const char* name;
    HParams (*make)();
};

// Published configurations (spec/models.md §0, §5.1, §9.3; Qwen3 model cards);
// the *-tiny shapes are those of the reference models in shared/reference.
const ShapePreset kShapes[] = {
    {"qwen35-4b", [] { return hybrid(2560, 32, 16, 4, 256, 64, 9216, 248320, 4, 128, 16, 32, 4, 262144); }},
    {"qwen3-0.6b", [] { return dense(Arch::Qwen3, 1024, 28, 16, 8, 128, 3072, 151936, true, 40960, 1e6f); }},
    {"qwen3-1.7b", [] { return dense(Arch::Qwen3, 2048, 28, 16, 8, 128, 6144, 151936, true, 40960, 1e6f); }},
    {"qwen3-4b", [] { return dense(Arch::Qwen3, 2560, 36, 32, 8, 128, 9728, 151936, true, 40960, 1e6f); }},
    {"qwen3-8b", [] { return dense(Arch::Qwen3, 4096, 36, 32, 8, 128, 12288, 151936, false, 40960, 1e6f); }},
    {"qwen3-14b", [] { return dense(Arch::Qwen3, 5120, 40, 40, 8, 128, 17408, 151936, false, 40960, 1e6f); }},
    {"qwen3-32b", [] { return dense(Arch::Qwen3, 5120, 64, 64, 8, 128, 25600, 151936, false, 40960, 1e6f); }},
    {"qwen35-tiny", [] { return hybrid(256, 8, 4, 2, 64, 16, 512, 8218, 4, 32, 2, 4, 4, 4096); }},
    {"qwen3-tiny", [] { return dense(Arch::Qwen3, 256, 4, 4, 2, 64, 512, 8218, true, 4096, 1e6f); }},
    {"qwen2-tiny", [] { return dense(Arch::Qwen2, 256, 4, 4, 2, 64, 512, 8218, false, 4096, 1e6f); }},
};

}  // namespace

std::vector<std::string> shape_preset_names() {
    std::vector<std::string> v;
    for (const ShapePreset& s : kShapes) v.push_back(s.name);
    return v;
}

std::optional<HParams> shape_preset(std::string_view name) {
    for (const ShapePreset& s : kShapes)
        if (iequals(name, s.name)) return s.make();
    return std::nullopt;
}

ModelDesc preset_model(std::string_view spec) {
    std::string_view shape = spec;
    FileType ft = FileType::Q4_K_M;
    if (!shape_preset(spec)) {
        size_t best = std::string_view::npos;  // the file type is the suffix after a '-'
        for (const FileTypeName& f : kFileTypes) {
            std::string_view n = f.name;
            if (spec.size() > n.size() + 1 && spec[spec.size() - n.size() - 1] == '-' &&
                iequals(spec.substr(spec.size() - n.size()), n)) {
                best = spec.size() - n.size() - 1;
                ft = f.ft;
            }
        }
        if (best != std::string_view::npos) shape = spec.substr(0, best);
    }
    std::optional<HParams> hp = shape_preset(shape);
    if (!hp) {
        std::string shapes, types;
        for (const std::string& s : shape_preset_names()) shapes += (shapes.empty() ? "" : ", ") + s;
        for (const std::string& s : file_type_names()) types += (types.empty() ? "" : ", ") + s;
        fail(strfmt("plan: unknown arch preset '%.*s' (shapes: %s; append -<type> with type one of %s)",
                    int(spec.size()), spec.data(), shapes.c_str(), types.c_str()));
    }
    ModelDesc d;
    d.name = std::string(shape) + "-" + file_type_name(ft);
    d.hp = *hp;
    d.tensors = synthesize_tensors(d.hp, ft);
    return d;
}

}  // namespace qinfer
