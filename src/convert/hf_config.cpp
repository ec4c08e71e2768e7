#include "convert/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/platform.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace qinfer::convert {

namespace {

struct Reader {
    const json& j;
    const std::string& where;

    [[noreturn]] void bad(const std::string& msg) const { fail(strfmt("convert: %s: %s", where.c_str(), msg.c_str())); }
    bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
    int64_t int_req(const char* k) const {
        if (!has(k)) bad(strfmt("required key '%s' is missing", k));
        return int_opt(k, 0);
    }
    int64_t int_opt(const char* k, int64_t def) const {
        if (!has(k)) return def;
        if (!j[k].is_number_integer()) bad(strfmt("key '%s' must be an integer", k));
        int64_t v = j[k].get<int64_t>();
        if (v < 0) bad(strfmt("key '%s' must not be negative (got %lld)", k, (long long)v));
        return v;
    }
    double num_opt(const json& o, const char* k, double def) const {
        if (!o.contains(k) || o[k].is_null()) return def;
        if (!o[k].is_number()) bad(strfmt("key '%s' must be a number", k));
        return o[k].get<double>();
    }
    bool bool_opt(const char* k, bool def) const {
        if (!has(k)) return def;
        if (!j[k].is_boolean()) bad(strfmt("key '%s' must be true or false", k));
        return j[k].get<bool>();
    }
    std::optional<int64_t> token_id(const char* k) const {
        if (!has(k)) return std::nullopt;
        const json& v = j[k];
        if (v.is_number_integer()) return v.get<int64_t>();
        if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();  // eos lists
        return std::nullopt;
    }
};

Arch arch_from(const std::string& hf_arch, const std::string& model_type, const std::string& where) {
    if (hf_arch == "Qwen2ForCausalLM" || (hf_arch.empty() && model_type == "qwen2")) return Arch::Qwen2;
    if (hf_arch == "Qwen3ForCausalLM" || (hf_arch.empty() && model_type == "qwen3")) return Arch::Qwen3;
    if (hf_arch == "Qwen3_5ForConditionalGeneration" || hf_arch == "Qwen3_5ForCausalLM" ||
        (hf_arch.empty() && (model_type == "qwen3_5" || model_type == "qwen3_5_text")))
        return Arch::Qwen35;
    fail(strfmt("convert: %s: unsupported architecture '%s'%s; supported: Qwen2ForCausalLM, Qwen3ForCausalLM, "
                "Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM (dense text part)",
                where.c_str(), hf_arch.empty() ? model_type.c_str() : hf_arch.c_str(),
                hf_arch.empty() ? " (model_type)" : ""));
}

}  // namespace

HfConfig parse_hf_config(const std::string& text, const std::string& where) {
    json top;
    try {
        top = json::parse(text);
    } catch (const json::exception& e) {
        fail(strfmt("convert: %s: not valid JSON: %s", where.c_str(), e.what()));
    }
    if (!top.is_object()) fail(strfmt("convert: %s: not a JSON object", where.c_str()));

    HfConfig c;
    if (top.contains("architectures") && top["architectures"].is_array() && !top["architectures"].empty() &&
        top["architectures"][0].is_string())
        c.hf_arch = top["architectures"][0].get<std::string>();
    std::string model_type = top.value("model_type", std::string());
    if (c.hf_arch.empty() && model_type.empty())
        fail(strfmt("convert: %s: neither 'architectures' nor 'model_type' is set", where.c_str()));
    c.arch = arch_from(c.hf_arch, model_type, where);

    // Qwen3.5: the text model's keys live in text_config and win over the top level.
    json j = top;
    if (top.contains("text_config")) {
        if (!top["text_config"].is_object()) fail(strfmt("convert: %s: 'text_config' is not an object", where.c_str()));
        for (auto it = top["text_config"].begin(); it != top["text_config"].end(); ++it) j[it.key()] = it.value();
    }
    Reader r{j, where};

    c.n_embd = r.int_req("hidden_size");
    c.n_layer = r.int_req("num_hidden_layers");
    c.n_head = r.int_req("num_attention_heads");
    c.n_head_kv = r.int_opt("num_key_value_heads", c.n_head);
    c.n_ff = r.int_req("intermediate_size");
    c.vocab_size = r.int_req("vocab_size");
    c.n_ctx_train = r.int_opt("max_position_embeddings", 4096);
    c.rms_eps = r.num_opt(j, "rms_norm_eps", 1e-6);
    c.head_dim_explicit = r.has("head_dim");
    if (c.n_embd <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_head_kv <= 0 || c.n_ff <= 0 || c.vocab_size <= 0)
        r.bad("hidden_size, num_hidden_layers, head counts, intermediate_size and vocab_size must be positive");
    if (c.n_head % c.n_head_kv != 0)
        r.bad(strfmt("num_attention_heads %lld is not a multiple of num_key_value_heads %lld", (long long)c.n_head,
                     (long long)c.n_head_kv));
    c.head_dim = c.head_dim_explicit ? r.int_req("head_dim") : c.n_embd / c.n_head;
    if (!c.head_dim_explicit && c.n_embd % c.n_head != 0)
        r.bad("hidden_size is not a multiple of num_attention_heads and no head_dim is given");
    if (c.head_dim <= 0 || c.head_dim % 2 != 0) r.bad(strfmt("head_dim %lld must be positive and even", (long long)c.head_dim));
    // tie_word_embeddings may sit at either level; text_config wins when it has it.
    c.tie_embeddings = r.bool_opt("tie_word_embeddings", false);
    c.attention_bias = c.arch == Arch::Qwen2 || r.bool_opt("attention_bias", false);

    // RoPE: transformers 5 uses rope_parameters, older configs rope_theta + rope_scaling.
    json rp = json::object();
    if (r.has("rope_parameters")) {
        if (!j["rope_parameters"].is_object()) r.bad("'rope_parameters' must be an object");
        rp = j["rope_parameters"];
    }
    c.rope_theta = r.num_opt(rp, "rope_theta", r.num_opt(j, "rope_theta", c.arch == Arch::Qwen35 ? 1e7 : 10000));
    json rs = r.has("rope_scaling") && j["rope_scaling"].is_object() ? j["rope_scaling"] : rp;
    std::string rtype = rs.value("rope_type", rs.value("type", std::string()));
    if (rtype == "linear" || rtype == "yarn") {
        c.rope_scaling_type = rtype;
        c.rope_scaling_factor = r.num_opt(rs, "factor", 0);
        c.rope_scaling_orig_ctx = int64_t(r.num_opt(rs, "original_max_position_embeddings", 0));
    } else if (!rtype.empty() && rtype != "default" && rtype != "mrope") {
        r.bad("rope scaling type '" + rtype + "' is not supported (supported: default, linear, yarn)");
    }

    c.bos_id = r.token_id("bos_token_id");
    c.eos_id = r.token_id("eos_token_id");
    c.pad_id = r.token_id("pad_token_id");

    c.recurrent.assign(size_t(c.n_layer), false);
    if (c.arch != Arch::Qwen35) return c;

    double prf = r.num_opt(rp, "partial_rotary_factor", r.num_opt(j, "partial_rotary_factor", 0.25));
    c.n_rot = int64_t(std::llround(double(c.head_dim) * prf));
    if (c.n_rot <= 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0)
        r.bad(strfmt("partial_rotary_factor %g gives an invalid rotary dimension %lld", prf, (long long)c.n_rot));
    c.rope_sections = {11, 11, 10, 0};
    const json* ms = rp.contains("mrope_section") ? &rp["mrope_section"]
                     : (j.contains("rope_scaling") && j["rope_scaling"].is_object() &&
                        j["rope_scaling"].contains("mrope_section"))
                         ? &j["rope_scaling"]["mrope_section"]
                         : nullptr;
    if (ms) {
        if (!ms->is_array() || ms->size() > 4) r.bad("mrope_section must be an array of at most 4 integers");
        c.rope_sections.assign(4, 0);
        for (size_t i = 0; i < ms->size(); ++i) {
            if (!(*ms)[i].is_number_integer()) r.bad("mrope_section must be an array of integers");
            c.rope_sections[i] = (*ms)[i].get<int32_t>();
        }
    }
    c.conv_kernel = r.int_opt("linear_conv_kernel_dim", 4);
    int64_t kd = r.int_opt("linear_key_head_dim", 128), vd = r.int_opt("linear_value_head_dim", 128);
    if (kd != vd)
        r.bad(strfmt("linear_key_head_dim %lld != linear_value_head_dim %lld is not supported (GGUF has one ssm.state_size)",
                     (long long)kd, (long long)vd));
    c.ssm_head_dim = kd;
    c.ssm_k_heads = r.int_opt("linear_num_key_heads", 16);
    c.ssm_v_heads = r.int_opt("linear_num_value_heads", 32);
    if (c.ssm_head_dim <= 0 || c.ssm_k_heads <= 0 || c.ssm_v_heads <= 0 || c.conv_kernel <= 0 ||
        c.ssm_v_heads % c.ssm_k_heads != 0)
        r.bad(strfmt("linear attention shape is invalid: %lld key heads, %lld value heads (must be a multiple), "
                     "head dim %lld, conv kernel %lld",
                     (long long)c.ssm_k_heads, (long long)c.ssm_v_heads, (long long)c.ssm_head_dim,
                     (long long)c.conv_kernel));
    c.mtp_layers = r.int_opt("mtp_num_hidden_layers", 0);

    int64_t interval = r.int_opt("full_attention_interval", 4);
    if (r.has("layer_types")) {
        const json& lt = j["layer_types"];
        if (!lt.is_array() || int64_t(lt.size()) != c.n_layer)
            r.bad(strfmt("layer_types must be an array of num_hidden_layers (%lld) strings", (long long)c.n_layer));
        for (int64_t i = 0; i < c.n_layer; ++i) {
            std::string s = lt[size_t(i)].is_string() ? lt[size_t(i)].get<std::string>() : "";
            if (s == "linear_attention") c.recurrent[size_t(i)] = true;
            else if (s == "full_attention") c.recurrent[size_t(i)] = false;
            else r.bad(strfmt("layer_types[%lld] must be 'linear_attention' or 'full_attention'", (long long)i));
        }
        // Use the interval form (what the upstream converter writes) when one matches.
        c.full_attention_interval = 0;
        for (int64_t k = 1; k <= c.n_layer && !c.full_attention_interval; ++k) {
            bool ok = true;
            for (int64_t i = 0; i < c.n_layer && ok; ++i) ok = c.recurrent[size_t(i)] == ((i + 1) % k != 0);
            if (ok) c.full_attention_interval = k;
        }
    } else {
        if (interval <= 0) r.bad("full_attention_interval must be positive");
        for (int64_t i = 0; i < c.n_layer; ++i) c.recurrent[size_t(i)] = (i + 1) % interval != 0;
        c.full_attention_interval = interval;
    }
    return c;
}

HfConfig read_hf_config(const std::string& dir) {
    fs::path p = utf8_path(dir) / "config.json";
    std::ifstream in(p, std::ios::binary);
    if (!in) fail(strfmt("convert: cannot open %s (is '%s' a Hugging Face model folder?)", path_utf8(p).c_str(), dir.c_str()));
    std::stringstream ss;
    ss << in.rdbuf();
    HfConfig c = parse_hf_config(ss.str(), path_utf8(p));
    c.name = path_utf8(utf8_path(dir).lexically_normal().filename());
    if (c.name.empty()) c.name = path_utf8(utf8_path(dir).lexically_normal().parent_path().filename());
    return c;
}

}  // namespace qinfer::convert
