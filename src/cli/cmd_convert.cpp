// `qinfer convert HF_DIR OUT.gguf [--outtype f16]`: Hugging Face safetensors
// folder to GGUF. `qinfer convert --random PRESET OUT.gguf --outtype q4_k_m`:
// random-weight model of a real shape, for benchmarks.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "common/error.h"
#include "convert/convert.h"
#include "convert/random_model.h"

namespace qinfer::cli {

int cmd_convert(int argc, char** argv) {
    CLI::App app{"Convert a Hugging Face safetensors folder (Qwen2, Qwen3, Qwen3.5) to GGUF, or write a random-weight "
                 "model of a preset shape",
                 "qinfer convert"};
    std::vector<std::string> pos;
    std::string outtype, random_preset, vocab;
    uint64_t seed = 1;
    int threads = 0;
    bool list = false;
    app.add_option("args", pos, "HF_DIR OUT.gguf, or OUT.gguf with --random");
    app.add_option("--outtype", outtype,
                   "weight type: f32, f16, bf16, q8_0 (conversion; default f16); with --random also q4_0, q4_k_s, "
                   "q4_k_m, q5_k_s, q5_k_m, q6_k (llama.cpp type mixes)");
    app.add_option("--random", random_preset, "write a random-weight model of this preset (see --list-presets)");
    app.add_option("--seed", seed, "random seed (--random)");
    app.add_option("--vocab", vocab,
                   "vocabulary for --random: a .gguf with tokenizer metadata or a folder with tokenizer.json "
                   "(default: 256 byte tokens + Qwen special tokens)");
    app.add_option("-t,--threads", threads, "threads (default: physical cores)");
    app.add_flag("--list-presets", list, "list the --random presets");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    auto log = [](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); };

    if (list) {
        for (const std::string& p : convert::random_presets()) {
            convert::HfConfig c = convert::random_preset(p);
            std::printf("%-12s %s E=%lld L=%lld heads=%lld/%lld x %lld F=%lld V=%lld\n", p.c_str(),
                        arch_name(c.arch), (long long)c.n_embd, (long long)c.n_layer, (long long)c.n_head,
                        (long long)c.n_head_kv, (long long)c.head_dim, (long long)c.n_ff, (long long)c.vocab_size);
        }
        return 0;
    }

    if (!random_preset.empty()) {
        if (pos.size() != 1) fail("convert --random: expected exactly one output path (OUT.gguf)");
        convert::RandomModelOptions o;
        o.preset = random_preset;
        o.seed = seed;
        o.n_threads = threads;
        o.vocab = vocab;
        o.log = log;
        auto ft = convert::ftype_from_name(outtype.empty() ? "f16" : outtype);
        if (!ft) fail("convert: --outtype '" + outtype + "' is not one of " + convert::ftype_list());
        o.ftype = *ft;
        auto r = convert::write_random_model(pos[0], o);
        std::fprintf(stderr, "wrote %s: %zu tensors, %.2f GB in %.1f s\n", pos[0].c_str(), r.n_tensors,
                     double(r.file_bytes) / 1e9, r.seconds);
        return 0;
    }

    if (pos.size() != 2) {
        std::fprintf(stderr, "usage: qinfer convert HF_DIR OUT.gguf [--outtype f32|f16|bf16|q8_0]\n"
                             "       qinfer convert --random PRESET OUT.gguf [--outtype q4_k_m] [--seed N]\n");
        return 2;
    }
    if (!vocab.empty()) fail("convert: --vocab only applies to --random");
    convert::ConvertOptions o;
    o.outtype = convert::parse_outtype(outtype.empty() ? "f16" : outtype);
    o.n_threads = threads;
    o.log = log;
    auto r = convert::convert_hf(pos[0], pos[1], o);
    std::fprintf(stderr, "wrote %s: %s, %zu tensors, %.1f MB\n", pos[1].c_str(), r.arch.c_str(), r.n_tensors,
                 double(r.file_bytes) / 1e6);
    return 0;
}

}  // namespace qinfer::cli
