#include "cli/run_options.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#if defined(_WIN32)
#include <io.h>
#else
#include <unistd.h>
#endif

#include "common/error.h"
#include "common/platform.h"
#include "plan/gpus.h"

namespace qinfer::cli {

std::vector<char*> normalize_llama_flags(int argc, char** argv, std::vector<std::string>& storage) {
    static const struct {
        const char* from;
        const char* to;
    } kMap[] = {{"-ngl", "--gpu-layers"}, {"-sys", "--system-prompt"}, {"-ctk", "--kv-type"}, {"-ctv", "--cache-type-v"},
                 {"-np", "--parallel"}};
    storage.assign(argv, argv + argc);
    for (std::string& a : storage)
        for (const auto& m : kMap)
            if (a == m.from) a = m.to;
    std::vector<char*> out;
    for (std::string& a : storage) out.push_back(a.data());
    return out;
}

int parse_llama_style(CLI::App& app, int argc, char** argv) {
    std::vector<std::string> storage;
    std::vector<char*> args = normalize_llama_flags(argc, argv, storage);
    try {
        app.parse(int(args.size()), args.data());
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    return -1;
}

void add_kv_type_flags(CLI::App& app, std::string& k, std::string& v) {
    app.add_option("--kv-type,--cache-type-k", k,
                   "KV cache type (-ctk) of keys and values: f16 (default), f32, or q8_0 (half of f16's memory)")
        ->check(CLI::IsMember({"f16", "f32", "q8_0"}));
    app.add_option("--cache-type-v", v, "V cache type (-ctv): must equal -ctk")
        ->check(CLI::IsMember({"f16", "f32", "q8_0"}));
}

KvCacheType kv_type_from_flags(const std::string& k, const std::string& v) {
    if (!v.empty() && v != k)
        fail(strfmt("--cache-type-v %s differs from --cache-type-k %s: K and V are cached in one type", v.c_str(),
                    k.c_str()));
    return parse_kv_cache_type(k);
}

void add_op_offload_flags(CLI::App& app, int& min_batch) {
    app.add_option("--op-offload-min-batch", min_batch,
                   "prompt batches of at least N tokens run the CPU-resident layers on the GPU, streaming their "
                   "weights (0 = never)")
        ->check(CLI::Range(0, 1 << 20));
    app.add_flag_callback("--no-op-offload", [&min_batch] { min_batch = 0; },
                          "never run CPU-resident layers on the GPU (same as --op-offload-min-batch 0)");
}

void ModelFlags::add(CLI::App& app) {
    app.add_option("-m,--model", model, "GGUF model file")->required();
    app.add_option("-c,--ctx-size", n_ctx, "context size in tokens (0 = from the model, at most 4096)");
    app.add_option("-b,--batch-size", n_batch,
                   "max tokens per forward pass while processing the prompt (default: 2048 with the whole model "
                   "on the GPU, else 512)")
        ->check(CLI::Range(1, 65536));
    app.add_option("-t,--threads", n_threads, "CPU threads (0 = physical cores)");
    app.add_option("--gpu-layers,--n-gpu-layers", gpu_layers,
                   "layers on the GPU (-ngl): N (the last N layers), all, or auto (as many as fit; default)");
    app.add_option("--vram-limit", vram_limit, "GPU memory qinfer may use, e.g. 6GiB (default: what is free)");
    add_kv_type_flags(app, kv_type, kv_type_v);
    add_op_offload_flags(app, op_offload_min_batch);
    app.add_flag("--jinja", jinja, "render chats with the model's own Jinja template (default: built-in ChatML)");
    app.add_option("--chat-template-file", chat_template_file, "Jinja chat template to use instead of the model's");
}

EngineOptions ModelFlags::engine_options() const {
    EngineOptions o;
    o.n_ctx = n_ctx;
    o.n_batch = n_batch;
    o.n_threads = n_threads;
    o.gpu_layers = parse_gpu_layers(gpu_layers);
    if (!vram_limit.empty()) o.vram_limit = parse_bytes(vram_limit, "--vram-limit");
    o.kv_type = kv_type_from_flags(kv_type, kv_type_v);
    o.op_offload_min_batch = op_offload_min_batch;
    o.jinja = jinja;
    if (!chat_template_file.empty()) o.chat_template = read_file_text(chat_template_file);
    return o;
}

int parse_gpu_layers(const std::string& s) {
    if (s == "auto" || s == "-1") return -1;
    if (s == "all" || s == "max") return 999;
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != 0 || v < 0 || v > 100000)
        fail(strfmt("--gpu-layers: expected a number of layers, 'all' or 'auto', got '%s'", s.c_str()));
    return int(v);
}

void SamplingFlags::add(CLI::App& app) {
    opts = {
        app.add_option("--temp", temp, "temperature (0 = greedy; default 0.8 or the model's)"),
        app.add_option("--top-k", top_k, "top-k (0 = off; default 40)"),
        app.add_option("--top-p", top_p, "top-p (1 = off; default 0.95)"),
        app.add_option("--min-p", min_p, "min-p (0 = off; default 0.05)"),
        app.add_option("--repeat-penalty", repeat_penalty, "repeat penalty (1 = off; default 1.0)"),
        app.add_option("--repeat-last-n", repeat_last_n, "tokens the penalties look back (0 = off, -1 = context)"),
        app.add_option("--presence-penalty", presence, "presence penalty (default 0)"),
        app.add_option("--frequency-penalty", frequency, "frequency penalty (default 0)"),
        app.add_option("-s,--seed", seed, "RNG seed (-1 = random)"),
    };
}

SamplingParams SamplingFlags::resolve(SamplingParams p) const {
    auto given = [&](size_t i) { return opts.size() > i && opts[i]->count() > 0; };
    if (given(0)) p.temperature = temp;
    if (given(1)) p.top_k = top_k;
    if (given(2)) p.top_p = top_p;
    if (given(3)) p.min_p = min_p;
    if (given(4)) p.repeat_penalty = repeat_penalty;
    if (given(5)) p.repeat_last_n = repeat_last_n;
    if (given(6)) p.presence_penalty = presence;
    if (given(7)) p.frequency_penalty = frequency;
    if (given(8)) p.seed = seed;
    return p;
}

std::vector<int32_t> parse_id_list(const std::string& s) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < s.size()) {
        size_t j = s.find_first_of(", ", i);
        if (j == std::string::npos) j = s.size();
        if (j > i) {
            const std::string tok = s.substr(i, j - i);
            char* end = nullptr;
            const long long v = std::strtoll(tok.c_str(), &end, 10);
            if (!end || *end || v < 0 || v > INT32_MAX) fail(strfmt("--ids: '%s' is not a token id", tok.c_str()));
            ids.push_back(int32_t(v));
        }
        i = j + 1;
    }
    if (ids.empty()) fail("--ids: no token ids given");
    return ids;
}

std::string process_escapes(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] != '\\' || i + 1 == s.size()) {
            out += s[i];
            continue;
        }
        const char c = s[++i];
        switch (c) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case '\\': out += '\\'; break;
            case '"': out += '"'; break;
            case '\'': out += '\''; break;
            default: out += '\\'; out += c; break;
        }
    }
    return out;
}

std::string read_file_text(const std::string& path) {
    std::ifstream in(utf8_path(path), std::ios::binary);  // UTF-8 name, also on Windows
    if (!in) fail(strfmt("cannot open '%s'", path.c_str()));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    // Windows editors and PowerShell 5.1 (-Encoding utf8) write a UTF-8 byte-order
    // mark; it is not part of the prompt.
    if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
    return text;
}

bool stdout_is_terminal() {
#if defined(_WIN32)
    return _isatty(_fileno(stdout)) != 0;
#else
    return isatty(fileno(stdout)) != 0;
#endif
}

bool stdin_is_terminal() {
#if defined(_WIN32)
    return _isatty(_fileno(stdin)) != 0;
#else
    return isatty(fileno(stdin)) != 0;
#endif
}

std::string timing_line(double load_ms, const GenerateResult& r) {
    std::string s = strfmt("load %.1f ms | prompt %d tok", load_ms, r.n_prompt);
    if (r.n_cached > 0) s += strfmt(" (%d cached)", r.n_cached);
    s += strfmt(", %.1f ms (%.1f t/s) | ttft %.1f ms | gen %d tok, %.1f ms (%.1f t/s) | %s", r.prompt_ms,
                r.prompt_tokens_per_s(), r.ttft_ms, r.n_generated, r.gen_ms, r.gen_tokens_per_s(),
                finish_reason_name(r.finish_reason));
    return s;
}

}  // namespace qinfer::cli
