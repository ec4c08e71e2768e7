// Flags shared by `run`, `chat` and `bench`, spelled like llama.cpp's tools.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "qinfer/engine.h"

namespace qinfer::cli {

// --kv-type / --cache-type-k (-ctk) and --cache-type-v (-ctv) into `k` and `v`.
// qinfer keeps K and V in one type: -ctk sets both, -ctv must agree with it.
void add_kv_type_flags(CLI::App& app, std::string& k, std::string& v);
// The cache type those flags ask for (fails when -ctv differs from -ctk).
KvCacheType kv_type_from_flags(const std::string& k, const std::string& v);

// llama.cpp uses multi-letter short flags (-ngl, -sys, -ctk, -ctv, -np) that
// CLI11 cannot declare; they are rewritten to their long forms before parsing.
std::vector<char*> normalize_llama_flags(int argc, char** argv, std::vector<std::string>& storage);

// Parses the command line into `app` after normalize_llama_flags. Returns the
// exit code when parsing ends the command (--help, a bad or missing flag: CLI11
// has printed why), else -1.
int parse_llama_style(CLI::App& app, int argc, char** argv);

// Prompt offload default: batches of this many tokens or more run the layers
// kept in host memory on the GPU (as llama.cpp, which also starts at 32).
constexpr int kOpOffloadMinBatch = 32;
// --op-offload-min-batch N and --no-op-offload (N = 0) into `min_batch`.
void add_op_offload_flags(CLI::App& app, int& min_batch);

struct ModelFlags {
    std::string model;
    int n_ctx = 0;
    int n_batch = 0;  // 0: 2048 with the whole model on the GPU, else 512
    int n_threads = 0;
    std::string gpu_layers = "auto";  // N, "all" or "auto"
    std::string vram_limit;           // e.g. "8GiB"
    std::string kv_type = "f16";
    std::string kv_type_v;  // --cache-type-v: must equal kv_type when given
    int op_offload_min_batch = kOpOffloadMinBatch;
    bool jinja = false;
    std::string chat_template_file;
    void add(CLI::App& app);
    EngineOptions engine_options() const;
};

// Sampling flags; only the ones given override the model's defaults.
struct SamplingFlags {
    float temp = 0, top_p = 0, min_p = 0, repeat_penalty = 0, presence = 0, frequency = 0;
    int top_k = 0, repeat_last_n = 0;
    int64_t seed = -1;
    std::vector<CLI::Option*> opts;
    void add(CLI::App& app);
    SamplingParams resolve(SamplingParams defaults) const;
};

// --gpu-layers: "auto" -> -1, "all" -> 999, N >= 0 -> N; Error otherwise.
int parse_gpu_layers(const std::string& s);

// "1,2,3" or "1 2 3" -> ids; Error on anything else.
std::vector<int32_t> parse_id_list(const std::string& s);
// llama-cli's prompt escapes: \n \t \r \\ \" \' (others are kept as is).
std::string process_escapes(const std::string& s);
std::string read_file_text(const std::string& path);
bool stdout_is_terminal();
bool stdin_is_terminal();

// "load 12.3 ms | prompt 7 tok, 4.1 ms (1707 t/s) | ttft 5.0 ms | gen 16 tok, 30.2 ms (497 t/s)"
std::string timing_line(double load_ms, const GenerateResult& r);

}  // namespace qinfer::cli
