// `qinfer info MODEL.gguf [--json] [--sha256 [HEX]] [--check-tensors]`:
// what is in a GGUF file. Opening costs milliseconds (metadata only, the tensor
// data is mapped, not read); --sha256 and --check-tensors read every byte.
//
// The report is built once as JSON and either printed as is (--json) or
// rendered as text, so both forms always carry the same content.
// Exit codes: 0 ok; 1 unreadable file, sha256 mismatch or bad tensor data; 2 usage.
#include <CLI/CLI.hpp>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/error.h"
#include "common/sha256.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "quant/quant.h"

namespace qinfer::cli {

namespace {

using json = nlohmann::ordered_json;
using gguf::ValueType;

constexpr uint64_t kArrayHead = 8;     // array elements shown before "..."
constexpr uint64_t kArrayFull = 16;    // arrays up to this size are shown whole

// ---------------------------------------------------------------- metadata values

json scalar_json(const gguf::Value& v) {
    switch (v.type) {
        case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64: return v.u;
        case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64: return v.i;
        case ValueType::F32: case ValueType::F64: return v.f;
        case ValueType::BOOL: return v.u != 0;
        case ValueType::STRING: return std::string(v.str);
        default: return nullptr;
    }
}

json element_json(const gguf::Value& v, uint64_t i) {
    switch (v.elem_type) {
        case ValueType::STRING: return std::string(v.strings[size_t(i)]);
        case ValueType::F32: case ValueType::F64: return v.float_at(i);
        case ValueType::BOOL: return v.int_at(i) != 0;
        case ValueType::U64: return uint64_t(v.int_at(i));
        default: return v.int_at(i);
    }
}

// {"type", "value"} for scalars; arrays add elem_type and count, and give either
// every element ("value") or the first few ("head").
json value_json(const gguf::Value& v) {
    json j;
    j["type"] = gguf::value_type_name(v.type);
    if (!v.is_array()) {
        j["value"] = scalar_json(v);
        return j;
    }
    j["elem_type"] = gguf::value_type_name(v.elem_type);
    j["count"] = v.count;
    const bool whole = v.count <= kArrayFull;
    json elems = json::array();
    for (uint64_t i = 0; i < v.count && (whole || i < kArrayHead); ++i)
        elems.push_back(v.elem_type == ValueType::ARRAY ? value_json(v.nested[size_t(i)]) : element_json(v, i));
    j[whole ? "value" : "head"] = std::move(elems);
    return j;
}

// One line of text: controls escaped, long strings cut.
std::string printable(std::string_view s, size_t max_len) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (out.size() >= max_len) {
            out += strfmt("... (%zu bytes)", s.size());
            break;
        }
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (c == '"' || c == '\\') out += '\\', out += char(c);
        else if (c < 0x20 || c == 0x7F) out += strfmt("\\x%02X", c);
        else out += char(c);
    }
    return out;
}

// f32 values print with the 7 digits they carry (1e-06, not 9.99999997e-07).
std::string value_text(const json& v, bool f32 = false) {
    if (v.is_string()) return "\"" + printable(v.get<std::string>(), 100) + "\"";
    if (v.is_number_float()) return strfmt(f32 ? "%.7g" : "%.17g", v.get<double>());
    if (v.is_null()) return "null";  // NaN/Inf floats become null in JSON
    if (v.is_object()) {             // nested array
        std::string s = strfmt("[%s x %llu]", v["elem_type"].get<std::string>().c_str(),
                               (unsigned long long)v["count"].get<uint64_t>());
        return s;
    }
    return v.dump();
}

std::string metadata_text(const json& m) {
    std::string type = m["type"].get<std::string>();
    if (type != "array") return strfmt("%-8s %s", type.c_str(), value_text(m["value"], type == "f32").c_str());
    uint64_t count = m["count"].get<uint64_t>();
    std::string out = strfmt("[%s x %llu] [", m["elem_type"].get<std::string>().c_str(), (unsigned long long)count);
    const json& elems = m.contains("value") ? m["value"] : m["head"];
    for (size_t i = 0; i < elems.size(); ++i) {
        if (i) out += ", ";
        out += elems[i].is_string() ? "\"" + printable(elems[i].get<std::string>(), 24) + "\""
                                    : value_text(elems[i], m["elem_type"] == "f32");
    }
    if (elems.size() < count) out += strfmt(", ... (%llu more)", (unsigned long long)(count - elems.size()));
    return out + "]";
}

// ---------------------------------------------------------------- report parts

std::vector<int64_t> layers_where(const HParams& hp, bool recurrent) {
    std::vector<int64_t> out;
    for (int64_t i = 0; i < hp.n_layer; ++i)
        if (hp.is_recurrent(i) == recurrent) out.push_back(i);
    return out;
}

json architecture_json(const HParams& hp) {
    json a;
    a["name"] = hp.arch_str;
    a["layers"] = hp.n_layer;
    if (hp.n_layer_all != hp.n_layer) a["layers_including_mtp"] = hp.n_layer_all;
    a["full_attention_layers"] = layers_where(hp, false);
    a["recurrent_layers"] = layers_where(hp, true);
    a["embedding_length"] = hp.n_embd;
    a["feed_forward_length"] = hp.n_ff;
    a["head_count"] = hp.n_head;
    a["head_count_kv"] = hp.n_head_kv;
    a["head_dim"] = hp.head_dim;
    a["n_rot"] = hp.n_rot;
    a["context_length"] = hp.n_ctx_train;
    a["rope_base"] = hp.rope_base;
    if (hp.rope_scale_linear != 1.f) a["rope_scale_linear"] = hp.rope_scale_linear;
    a["rms_eps"] = hp.rms_eps;
    a["vocab_size"] = hp.n_vocab;
    a["tied_output"] = hp.tied_output;
    a["qkv_bias"] = hp.has_qkv_bias;
    if (hp.arch == Arch::Qwen35)
        a["ssm"] = {{"conv_kernel", hp.ssm_conv_kernel}, {"state_size", hp.ssm_state},
                    {"k_heads", hp.ssm_k_heads}, {"v_heads", hp.ssm_v_heads}, {"inner_size", hp.ssm_inner}};
    return a;
}

json state_json(const HParams& hp) {
    json s;
    for (GgmlType t : {GgmlType::F16, GgmlType::F32}) {
        StateSizes ss = state_sizes(hp, t);
        s[strfmt("kv_bytes_per_token_%s", t == GgmlType::F16 ? "f16" : "f32")] = ss.kv_bytes_per_token;
        if (t == GgmlType::F16) {
            s["recurrent_bytes_per_sequence"] = ss.recurrent_bytes_per_seq;
            s["recurrent_bytes_per_sequence_layer"] = ss.recurrent_bytes_per_seq_layer;
        }
    }
    return s;
}

json tokenizer_json(const gguf::File& f) {
    json t;
    const auto* tokens = f.get_string_array("tokenizer.ggml.tokens");
    if (auto m = f.get_string("tokenizer.ggml.model")) t["model"] = std::string(*m);
    if (auto p = f.get_string("tokenizer.ggml.pre")) t["pre"] = std::string(*p);
    t["tokens"] = tokens ? tokens->size() : 0;
    if (const auto* merges = f.get_string_array("tokenizer.ggml.merges")) t["merges"] = merges->size();
    json special = json::object();
    const std::pair<const char*, const char*> keys[] = {
        {"bos", "tokenizer.ggml.bos_token_id"}, {"eos", "tokenizer.ggml.eos_token_id"},
        {"eot", "tokenizer.ggml.eot_token_id"}, {"eom", "tokenizer.ggml.eom_token_id"},
        {"pad", "tokenizer.ggml.padding_token_id"}, {"unk", "tokenizer.ggml.unknown_token_id"},
        {"sep", "tokenizer.ggml.seperator_token_id"}};
    for (auto [name, key] : keys) {
        const gguf::Value* v = f.find(key);
        if (!v || !v->is_integer()) continue;
        json e = {{"id", v->i}};
        if (tokens && v->i >= 0 && uint64_t(v->i) < tokens->size()) e["text"] = std::string((*tokens)[size_t(v->i)]);
        else e["text"] = nullptr;  // id outside the vocabulary
        special[name] = std::move(e);
    }
    t["special"] = std::move(special);
    if (auto add_bos = f.find("tokenizer.ggml.add_bos_token"); add_bos && add_bos->type == ValueType::BOOL)
        t["add_bos"] = add_bos->u != 0;
    if (auto ct = f.get_string("tokenizer.chat_template")) t["chat_template_bytes"] = ct->size();
    return t;
}

json tensors_json(const gguf::File& f) {
    struct Acc { uint64_t count = 0, bytes = 0, params = 0; };
    std::map<uint32_t, Acc> by_type;
    Acc total;
    for (const gguf::TensorInfo& t : f.tensors()) {
        Acc& a = by_type[uint32_t(t.type)];
        for (Acc* x : {&a, &total}) x->count++, x->bytes += t.nbytes, x->params += uint64_t(t.n_elements());
    }
    json j;
    j["count"] = total.count;
    j["parameters"] = total.params;
    j["bytes"] = total.bytes;
    j["bits_per_weight"] = total.params ? double(total.bytes) * 8.0 / double(total.params) : 0.0;
    json types = json::object();
    for (const auto& [id, a] : by_type)
        types[type_name(GgmlType(id))] = {{"count", a.count}, {"bytes", a.bytes}, {"parameters", a.params}};
    j["by_type"] = std::move(types);
    return j;
}

// Dequantizes every row and looks for NaN/Inf (spec/quants.md §10): a
// non-finite value means a non-finite scale or value in its block.
json check_tensors(const gguf::File& f, bool& ok) {
    json bad = json::array(), skipped = json::array();
    uint64_t checked = 0;
    std::vector<float> row;
    for (const gguf::TensorInfo& t : f.tensors()) {
        if (!can_dequantize(t.type)) {
            skipped.push_back({{"tensor", t.name}, {"type", type_name(t.type)}});
            continue;
        }
        ++checked;
        const size_t rb = row_bytes(t.type, t.ne[0]);
        row.resize(size_t(t.ne[0]));
        bool found = false;
        for (int64_t r = 0; r < t.rows() && !found; ++r) {
            dequantize_row(t.type, t.data + uint64_t(r) * rb, row.data(), t.ne[0]);
            for (int64_t i = 0; i < t.ne[0]; ++i)
                if (!std::isfinite(row[size_t(i)])) {
                    int64_t bs = int64_t(traits(t.type).block_size);
                    bad.push_back({{"tensor", t.name}, {"row", r}, {"element", i},
                                   {"block", (r * t.ne[0] + i) / bs}, {"value", std::isnan(row[size_t(i)]) ? "nan" : "inf"}});
                    found = true;
                    break;
                }
        }
    }
    ok = bad.empty();
    return {{"checked", checked}, {"bad", bad}, {"skipped", skipped}};
}

// ---------------------------------------------------------------- text

std::string group(uint64_t n) {
    std::string s = std::to_string(n), out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (i && (s.size() - i) % 3 == 0) out += ',';
        out += s[i];
    }
    return out;
}

std::string bytes_text(uint64_t b) {
    if (b < 1024) return group(b) + " B";
    double x = double(b);
    const char* unit = "KiB";
    for (const char* u : {"KiB", "MiB", "GiB", "TiB"}) {
        x /= 1024.0, unit = u;
        if (x < 1024.0) break;
    }
    return strfmt("%s B (%.2f %s)", group(b).c_str(), x, unit);
}

std::string list_text(const json& a) {
    std::string s;
    for (const auto& x : a) s += (s.empty() ? "" : " ") + x.dump();
    return s.empty() ? "none" : s;
}

void print_text(const json& r) {
    std::printf("file          %s\n", r["file"].get<std::string>().c_str());
    std::printf("size          %s in %llu file(s)\n", bytes_text(r["file_bytes"].get<uint64_t>()).c_str(),
                (unsigned long long)r["shards"].get<uint64_t>());
    std::printf("gguf          version %u, alignment %u, %zu keys, %llu tensors\n", r["version"].get<unsigned>(),
                r["alignment"].get<unsigned>(), r["metadata"].size(),
                (unsigned long long)r["tensors"]["count"].get<uint64_t>());
    if (r.contains("sha256"))
        std::printf("sha256        %s%s\n", r["sha256"].get<std::string>().c_str(),
                    !r.contains("sha256_match") ? "" : r["sha256_match"].get<bool>() ? "  (matches)" : "  MISMATCH");
    for (const auto& w : r["warnings"]) std::printf("warning       %s\n", w.get<std::string>().c_str());

    std::printf("\nmetadata\n");
    size_t width = 0;
    for (const auto& m : r["metadata"]) width = std::max(width, m["key"].get<std::string>().size());
    for (const auto& m : r["metadata"])
        std::printf("  %-*s  %s\n", int(width), m["key"].get<std::string>().c_str(), metadata_text(m).c_str());

    std::printf("\narchitecture\n");
    if (r["architecture"].is_null()) {
        std::printf("  %s\n", r["architecture_note"].get<std::string>().c_str());
    } else {
        const json& a = r["architecture"];
        std::printf("  name                %s\n", a["name"].get<std::string>().c_str());
        std::printf("  layers              %lld\n", (long long)a["layers"].get<int64_t>());
        std::printf("    full attention    %s\n", list_text(a["full_attention_layers"]).c_str());
        std::printf("    recurrent         %s\n", list_text(a["recurrent_layers"]).c_str());
        std::printf("  embedding length    %lld\n", (long long)a["embedding_length"].get<int64_t>());
        std::printf("  feed forward        %lld\n", (long long)a["feed_forward_length"].get<int64_t>());
        std::printf("  heads               %lld (kv %lld), head dim %lld, rotary dims %lld\n",
                    (long long)a["head_count"].get<int64_t>(), (long long)a["head_count_kv"].get<int64_t>(),
                    (long long)a["head_dim"].get<int64_t>(), (long long)a["n_rot"].get<int64_t>());
        std::printf("  context length      %lld\n", (long long)a["context_length"].get<int64_t>());
        std::printf("  rope base           %.7g\n", a["rope_base"].get<double>());
        std::printf("  rms eps             %.7g\n", a["rms_eps"].get<double>());
        std::printf("  vocab size          %lld\n", (long long)a["vocab_size"].get<int64_t>());
        std::printf("  output              %s\n", a["tied_output"].get<bool>() ? "tied to token_embd" : "own output.weight");
        if (a.contains("ssm")) {
            const json& s = a["ssm"];
            std::printf("  ssm                 conv kernel %lld, state %lld, k heads %lld, v heads %lld, inner %lld\n",
                        (long long)s["conv_kernel"].get<int64_t>(), (long long)s["state_size"].get<int64_t>(),
                        (long long)s["k_heads"].get<int64_t>(), (long long)s["v_heads"].get<int64_t>(),
                        (long long)s["inner_size"].get<int64_t>());
        }
        const json& st = r["state"];
        std::printf("  KV cache            %s per token (f16), %s (f32)\n",
                    bytes_text(st["kv_bytes_per_token_f16"].get<uint64_t>()).c_str(),
                    bytes_text(st["kv_bytes_per_token_f32"].get<uint64_t>()).c_str());
        if (st["recurrent_bytes_per_sequence"].get<uint64_t>())
            std::printf("  recurrent state     %s per sequence (%s per layer)\n",
                        bytes_text(st["recurrent_bytes_per_sequence"].get<uint64_t>()).c_str(),
                        bytes_text(st["recurrent_bytes_per_sequence_layer"].get<uint64_t>()).c_str());
    }

    if (r.contains("tokenizer")) {
        const json& t = r["tokenizer"];
        std::printf("\ntokenizer\n");
        std::printf("  model               %s, pre %s\n", t.value("model", std::string("?")).c_str(),
                    t.value("pre", std::string("?")).c_str());
        std::printf("  tokens              %llu%s\n", (unsigned long long)t["tokens"].get<uint64_t>(),
                    t.contains("merges") ? strfmt(", %llu merges", (unsigned long long)t["merges"].get<uint64_t>()).c_str() : "");
        for (const auto& [name, e] : t["special"].items())
            std::printf("  %-19s %lld %s\n", name.c_str(), (long long)e["id"].get<int64_t>(),
                        e["text"].is_null() ? "(outside the vocabulary)"
                                            : ("\"" + printable(e["text"].get<std::string>(), 60) + "\"").c_str());
        if (t.contains("add_bos")) std::printf("  add bos             %s\n", t["add_bos"].get<bool>() ? "yes" : "no");
        if (t.contains("chat_template_bytes"))
            std::printf("  chat template       %llu bytes\n", (unsigned long long)t["chat_template_bytes"].get<uint64_t>());
    }

    const json& ts = r["tensors"];
    std::printf("\ntensors\n");
    std::printf("  count               %llu\n", (unsigned long long)ts["count"].get<uint64_t>());
    std::printf("  parameters          %s\n", group(ts["parameters"].get<uint64_t>()).c_str());
    std::printf("  data                %s\n", bytes_text(ts["bytes"].get<uint64_t>()).c_str());
    std::printf("  bits per weight     %.4f\n", ts["bits_per_weight"].get<double>());
    for (const auto& [name, e] : ts["by_type"].items())
        std::printf("  %-8s %5llu tensors  %15s params  %s\n", name.c_str(), (unsigned long long)e["count"].get<uint64_t>(),
                    group(e["parameters"].get<uint64_t>()).c_str(), bytes_text(e["bytes"].get<uint64_t>()).c_str());

    if (r.contains("check_tensors")) {
        const json& c = r["check_tensors"];
        std::printf("\ncheck tensors       %llu checked, %zu bad, %zu not checked (type not supported)\n",
                    (unsigned long long)c["checked"].get<uint64_t>(), c["bad"].size(), c["skipped"].size());
        for (const auto& b : c["bad"])
            std::printf("  BAD %s: %s at row %lld element %lld (block %lld)\n", b["tensor"].get<std::string>().c_str(),
                        b["value"].get<std::string>().c_str(), (long long)b["row"].get<int64_t>(),
                        (long long)b["element"].get<int64_t>(), (long long)b["block"].get<int64_t>());
    }
}

bool valid_hex64(const std::string& s) {
    if (s.size() != 64) return false;
    for (char c : s)
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    return true;
}

}  // namespace

int cmd_info(int argc, char** argv) {
    CLI::App app{"Show what is in a GGUF file: metadata, architecture, tokenizer, tensors, state sizes", "qinfer info"};
    std::string path, want_sha;
    bool as_json = false, check = false;
    app.add_option("model", path, "GGUF file (first shard of a split model)")->required();
    app.add_flag("--json", as_json, "print one JSON object instead of text");
    auto* sha_opt = app.add_option("--sha256", want_sha, "compute the file's SHA-256; with HEX, exit 1 unless it matches")
                        ->expected(0, 1);
    app.add_flag("--check-tensors", check, "dequantize every tensor and report NaN/Inf (reads every byte)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        int rc = app.exit(e);
        return rc == 0 ? 0 : 2;
    }
    if (!want_sha.empty() && !valid_hex64(want_sha)) {
        std::fprintf(stderr, "qinfer info: --sha256 expects 64 hex digits, got '%s'\n", want_sha.c_str());
        return 2;
    }

    auto f = gguf::File::open(path);
    json r;
    r["file"] = path;
    r["shards"] = f->n_shards();
    r["file_bytes"] = f->total_file_bytes();
    r["version"] = f->version();
    r["alignment"] = f->alignment();
    int rc = 0;
    if (sha_opt->count() > 0) {
        std::string got = sha256_file_hex(path);
        r["sha256"] = got;
        if (!want_sha.empty()) {
            for (char& c : want_sha) c = char(std::tolower(static_cast<unsigned char>(c)));
            r["sha256_expected"] = want_sha;
            r["sha256_match"] = got == want_sha;
            if (got != want_sha) {
                std::fprintf(stderr, "error: %s: sha256 mismatch: expected %s, got %s\n", path.c_str(), want_sha.c_str(),
                             got.c_str());
                rc = 1;
            }
        }
    }
    r["warnings"] = f->warnings();
    json meta = json::array();
    for (const gguf::KeyValue& kv : f->metadata()) {
        json m = {{"key", kv.key}};
        m.update(value_json(kv.value));
        meta.push_back(std::move(m));
    }
    r["metadata"] = std::move(meta);

    // Vocab-only files (tokenizer keys, no tensors) have no hyperparameters.
    r["architecture"] = nullptr;
    if (f->tensors().empty()) {
        r["architecture_note"] = "no tensors and no hyperparameters (vocab-only file)";
    } else {
        try {
            HParams hp = HParams::from_gguf(*f);
            r["architecture"] = architecture_json(hp);
            r["state"] = state_json(hp);
        } catch (const Error& e) {
            r["architecture_note"] = std::string("cannot read the hyperparameters: ") + e.what();
        }
    }
    if (f->find("tokenizer.ggml.tokens")) r["tokenizer"] = tokenizer_json(*f);
    r["tensors"] = tensors_json(*f);
    if (check) {
        bool ok = true;
        r["check_tensors"] = check_tensors(*f, ok);
        if (!ok) {
            std::fprintf(stderr, "error: %s: tensors with NaN/Inf values (see the report)\n", path.c_str());
            rc = 1;
        }
    }

    if (as_json) std::printf("%s\n", r.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    else print_text(r);
    return rc;
}

}  // namespace qinfer::cli
