#include "convert/type_mix.h"

#include <cctype>

#include "common/error.h"

namespace qinfer::convert {

namespace {

struct FtypeInfo {
    Ftype f;
    const char* name;
    uint32_t llama;    // llama_ftype
    GgmlType base;     // default type of quantizable tensors
};
const FtypeInfo kFtypes[] = {
    {Ftype::F32, "f32", 0, GgmlType::F32},          {Ftype::F16, "f16", 1, GgmlType::F16},
    {Ftype::BF16, "bf16", 32, GgmlType::BF16},      {Ftype::Q8_0, "q8_0", 7, GgmlType::Q8_0},
    {Ftype::Q4_0, "q4_0", 2, GgmlType::Q4_0},       {Ftype::Q4_K_S, "q4_k_s", 14, GgmlType::Q4_K},
    {Ftype::Q4_K_M, "q4_k_m", 15, GgmlType::Q4_K},  {Ftype::Q5_K_S, "q5_k_s", 16, GgmlType::Q5_K},
    {Ftype::Q5_K_M, "q5_k_m", 17, GgmlType::Q5_K},  {Ftype::Q6_K, "q6_k", 18, GgmlType::Q6_K},
};

const FtypeInfo& info(Ftype f) {
    for (const FtypeInfo& i : kFtypes)
        if (i.f == f) return i;
    return kFtypes[0];
}

bool contains(std::string_view s, std::string_view sub) { return s.find(sub) != std::string_view::npos; }
bool ends_with(std::string_view s, std::string_view suf) {
    return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
}

bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// Types whose blocks do not fit the row fall back to a 32-element type (§9.1 step 8).
GgmlType fallback(GgmlType t, int64_t ne0) {
    if (ne0 % traits(t).block_size == 0) return t;
    switch (t) {
        case GgmlType::Q2_K: case GgmlType::Q3_K: t = GgmlType::Q4_0; break;
        case GgmlType::Q4_K: t = GgmlType::Q5_0; break;
        case GgmlType::Q5_K: t = GgmlType::Q5_1; break;
        case GgmlType::Q6_K: t = GgmlType::Q8_0; break;
        default: break;
    }
    return ne0 % traits(t).block_size == 0 ? t : GgmlType::F16;
}

}  // namespace

std::optional<Ftype> ftype_from_name(std::string_view name) {
    std::string l(name);
    for (char& c : l) c = char(std::tolower(static_cast<unsigned char>(c)));
    for (const FtypeInfo& i : kFtypes)
        if (l == i.name) return i.f;
    return std::nullopt;
}
const char* ftype_name(Ftype f) { return info(f).name; }
uint32_t llama_ftype(Ftype f) { return info(f).llama; }
const char* ftype_list() { return "f32, f16, bf16, q8_0, q4_0, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k"; }

bool quantizable(std::string_view name, int n_dims) {
    return n_dims >= 2 && ends_with(name, "weight") && !contains(name, "_norm.weight") &&
           !contains(name, "ssm_conv1d");
}

TypeMix::TypeMix(Ftype f, int64_t n_layer_all, int64_t n_attn_v_like, bool has_output)
    : f_(f), n_layer_(n_layer_all), n_attn_v_(n_attn_v_like), has_output_(has_output) {}

GgmlType TypeMix::next(std::string_view name, int n_dims, int64_t ne0) {
    if (!quantizable(name, n_dims)) return GgmlType::F32;
    return rule(name, ne0);
}

GgmlType TypeMix::rule(std::string_view name, int64_t ne0) {
    const GgmlType base = info(f_).base;
    const bool kquant = f_ == Ftype::Q4_K_S || f_ == Ftype::Q4_K_M || f_ == Ftype::Q5_K_S || f_ == Ftype::Q5_K_M ||
                        f_ == Ftype::Q6_K;
    const bool is_output = name == "output.weight" || (name == "token_embd.weight" && !has_output_);
    if (is_output) {
        // The LM head keeps 6+ bits for every quantized ftype but Q8_0.
        if (f_ == Ftype::F32 || f_ == Ftype::F16 || f_ == Ftype::BF16 || f_ == Ftype::Q8_0) return fallback(base, ne0);
        GgmlType t = GgmlType::Q6_K;
        return ne0 % traits(t).block_size == 0 ? t : GgmlType::Q8_0;
    }
    if (!kquant) return fallback(base, ne0);
    if (name == "token_embd.weight") return fallback(base, ne0);

    GgmlType t = base;
    const bool attn_v_like = contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") ||
                             contains(name, "attn_kv_b.weight");
    if (attn_v_like) {
        const int64_t i = i_attn_v_++;
        switch (f_) {
            case Ftype::Q4_K_S: t = i < 4 ? GgmlType::Q5_K : GgmlType::Q4_K; break;
            case Ftype::Q4_K_M: t = use_more_bits(i, n_attn_v_) ? GgmlType::Q6_K : GgmlType::Q4_K; break;
            case Ftype::Q5_K_S: t = GgmlType::Q5_K; break;
            case Ftype::Q5_K_M: t = use_more_bits(i, n_attn_v_) ? GgmlType::Q6_K : GgmlType::Q5_K; break;
            default: t = GgmlType::Q6_K; break;
        }
    } else if (contains(name, "ffn_down")) {
        const int64_t i = i_ffn_down_++;
        switch (f_) {
            case Ftype::Q4_K_S: t = i < n_layer_ / 8 ? GgmlType::Q5_K : GgmlType::Q4_K; break;
            case Ftype::Q4_K_M: t = use_more_bits(i, n_layer_) ? GgmlType::Q6_K : GgmlType::Q4_K; break;
            case Ftype::Q5_K_S: t = GgmlType::Q5_K; break;
            case Ftype::Q5_K_M: t = use_more_bits(i, n_layer_) ? GgmlType::Q6_K : GgmlType::Q5_K; break;
            default: t = GgmlType::Q6_K; break;
        }
    }
    return fallback(t, ne0);
}

}  // namespace qinfer::convert
