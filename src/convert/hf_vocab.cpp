#include "convert/hf_vocab.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "gguf/writer.h"
#include "common/platform.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace qinfer::convert {

namespace {

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) fail(strfmt("convert: cannot open %s", path_utf8(p).c_str()));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

json parse_json(const std::string& text, const std::string& where) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        fail(strfmt("convert: %s: not valid JSON: %s", where.c_str(), e.what()));
    }
}

// BPE merge parts never contain a raw space: the byte-level alphabet encodes it
// as U+0120 'Ġ' (the same replacement gguf-py applies to pair-form merges).
std::string escape_space(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == ' ') out += "\xC4\xA0";
        else out += c;
    }
    return out;
}

// tokenizer_config.json special tokens are a string, an AddedToken object or null.
std::optional<std::string> token_text(const json& cfg, const char* key) {
    if (!cfg.is_object() || !cfg.contains(key)) return std::nullopt;
    const json& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return std::nullopt;
}

}  // namespace

bool token_looks_special(const std::string& t) {
    auto ends_with = [&](const char* s) {
        size_t n = std::char_traits<char>::length(s);
        return t.size() >= n && t.compare(t.size() - n, n, s) == 0;
    };
    if (t.rfind("<|", 0) == 0 && ends_with("|>")) return true;
    // DeepSeek-style fullwidth bars
    if (t.rfind("<\xEF\xBD\x9C", 0) == 0 && ends_with("\xEF\xBD\x9C>")) return true;
    static const char* kNames[] = {"<pad>", "<mask>", "<unk>", "<s>", "</s>", "<bos>", "<eos>", "<cls>", "<sep>"};
    for (const char* n : kNames)
        if (t == n) return true;
    return false;
}

GgufVocab parse_hf_vocab(const std::string& tokenizer_json, const std::string& config_json,
                         const std::string& template_file, const VocabInputs& in, const std::string& where) {
    auto bad = [&](const std::string& msg) { fail(strfmt("convert: %s: %s", where.c_str(), msg.c_str())); };
    json tj = parse_json(tokenizer_json, where);
    json cfg = config_json.empty() ? json::object() : parse_json(config_json, where + " (tokenizer_config.json)");
    if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object()) bad("missing object 'model'");
    const json& model = tj["model"];
    std::string mtype = model.value("type", std::string("BPE"));
    if (mtype != "BPE") bad("tokenizer model type '" + mtype + "' is not supported (Qwen uses byte-level BPE)");
    if (!model.contains("vocab") || !model["vocab"].is_object()) bad("missing object 'model.vocab'");

    // id -> text; HF vocab is text -> id in arbitrary order.
    std::map<int64_t, std::string> by_id;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
        if (!it.value().is_number_integer()) bad("vocab entry '" + it.key() + "' has a non-integer id");
        int64_t id = it.value().get<int64_t>();
        if (id < 0 || id >= (int64_t(1) << 24)) bad(strfmt("vocab id %lld is out of range", (long long)id));
        if (!by_id.emplace(id, it.key()).second) bad(strfmt("vocab id %lld is used twice", (long long)id));
    }
    struct Added { std::string text; bool special; };
    std::map<int64_t, Added> added;
    if (tj.contains("added_tokens")) {
        if (!tj["added_tokens"].is_array()) bad("'added_tokens' must be an array");
        for (const json& a : tj["added_tokens"]) {
            if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
                !a["content"].is_string())
                bad("an added_tokens entry lacks an integer 'id' or a string 'content'");
            int64_t id = a["id"].get<int64_t>();
            if (id < 0 || id >= (int64_t(1) << 24)) bad(strfmt("added token id %lld is out of range", (long long)id));
            added[id] = {a["content"].get<std::string>(), a.value("special", false)};
        }
    }
    int64_t n = 0;
    if (!by_id.empty()) n = by_id.rbegin()->first + 1;
    if (!added.empty()) n = std::max(n, added.rbegin()->first + 1);
    if (in.pad_to > 0 && in.pad_to < n)
        bad(strfmt("the tokenizer has %lld ids but the model's vocab_size is %lld", (long long)n, (long long)in.pad_to));
    n = std::max(n, in.pad_to);

    GgufVocab v;
    v.pre = in.pre;
    v.tokens.resize(size_t(n));
    v.types.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
        auto a = added.find(i);
        auto b = by_id.find(i);
        if (a != added.end()) {
            v.tokens[size_t(i)] = a->second.text;
            v.types[size_t(i)] = (a->second.special || token_looks_special(a->second.text)) ? kTokControl : kTokUserDefined;
        } else if (b != by_id.end()) {
            v.tokens[size_t(i)] = b->second;
            v.types[size_t(i)] = kTokNormal;
        } else {
            v.tokens[size_t(i)] = "[PAD" + std::to_string(i) + "]";
            v.types[size_t(i)] = kTokUnused;
        }
    }

    if (model.contains("merges")) {
        if (!model["merges"].is_array()) bad("'model.merges' must be an array");
        v.merges.reserve(model["merges"].size());
        for (const json& m : model["merges"]) {
            if (m.is_string()) {
                v.merges.push_back(m.get<std::string>());
            } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
                v.merges.push_back(escape_space(m[0].get<std::string>()) + " " + escape_space(m[1].get<std::string>()));
            } else {
                bad("a merge must be a string \"a b\" or a pair [\"a\", \"b\"]");
            }
        }
    }

    // Special ids: tokenizer_config.json names them by text; config.json by id.
    std::unordered_map<std::string, uint32_t> id_of;
    for (int64_t i = 0; i < n; ++i) id_of.emplace(v.tokens[size_t(i)], uint32_t(i));
    auto resolve = [&](const char* key, std::optional<int64_t> fallback) -> std::optional<uint32_t> {
        if (auto t = token_text(cfg, key)) {
            auto it = id_of.find(*t);
            if (it == id_of.end()) bad(strfmt("tokenizer_config.json %s '%s' is not in the vocabulary", key, t->c_str()));
            return it->second;
        }
        if (fallback && *fallback >= 0 && *fallback < n) return uint32_t(*fallback);
        return std::nullopt;
    };
    v.bos = resolve("bos_token", in.bos_id);
    v.eos = resolve("eos_token", in.eos_id);
    v.pad = resolve("pad_token", in.pad_id);
    if (auto it = id_of.find("<|im_end|>"); it != id_of.end()) v.eot = it->second;
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) v.add_bos = cfg["add_bos_token"].get<bool>();

    // Chat template: chat_template.jinja (written by newer transformers) wins over
    // tokenizer_config.json; the latter may hold a string or a list of named ones.
    if (!template_file.empty()) {
        v.chat_template = template_file;
    } else if (cfg.contains("chat_template")) {
        const json& ct = cfg["chat_template"];
        if (ct.is_string()) {
            v.chat_template = ct.get<std::string>();
        } else if (ct.is_array()) {
            for (const json& e : ct) {
                if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
                    !e["template"].is_string())
                    bad("chat_template list entries need string 'name' and 'template'");
                std::string name = e["name"].get<std::string>();
                if (name == "default") v.chat_template = e["template"].get<std::string>();
                else v.named_templates.emplace_back(name, e["template"].get<std::string>());
            }
        }
    }
    return v;
}

GgufVocab read_hf_vocab(const std::string& dir, const VocabInputs& in) {
    const fs::path d = utf8_path(dir);
    fs::path tj = d / "tokenizer.json";
    std::error_code ec;
    if (!fs::exists(tj, ec))
        fail(strfmt("convert: %s is missing (only the fast-tokenizer format tokenizer.json is supported)",
                    path_utf8(tj).c_str()));
    std::string cfg = fs::exists(d / "tokenizer_config.json", ec) ? slurp(d / "tokenizer_config.json") : "";
    std::string tmpl = fs::exists(d / "chat_template.jinja", ec) ? slurp(d / "chat_template.jinja") : "";
    return parse_hf_vocab(slurp(tj), cfg, tmpl, in, path_utf8(tj));
}

void write_vocab(gguf::Writer& w, const GgufVocab& v) {
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", v.pre);
    w.set_string_array("tokenizer.ggml.tokens", std::span<const std::string>(v.tokens));
    w.set_array("tokenizer.ggml.token_type", v.types);
    w.set_string_array("tokenizer.ggml.merges", std::span<const std::string>(v.merges));
    if (v.eos) w.set_u32("tokenizer.ggml.eos_token_id", *v.eos);
    if (v.pad) w.set_u32("tokenizer.ggml.padding_token_id", *v.pad);
    if (v.bos) w.set_u32("tokenizer.ggml.bos_token_id", *v.bos);
    if (v.eot) w.set_u32("tokenizer.ggml.eot_token_id", *v.eot);
    w.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
    if (!v.chat_template.empty()) w.set_string("tokenizer.chat_template", v.chat_template);
    for (const auto& [name, t] : v.named_templates) w.set_string("tokenizer.chat_template." + name, t);
}

}  // namespace qinfer::convert
