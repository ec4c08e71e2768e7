// GGUF open time: File::open parses the header, the metadata and the tensor
// infos and maps the file; tensor data is not touched, so opening a multi-GB
// model must cost milliseconds. Measured on the reference files and on
// synthetic full-size files written to the temp directory with the writer:
//   * "qwen3-8b-like": 36 layers, ~4.9 GB of Q4_K/Q6_K tensors (sparse file:
//     header_bytes() then resize, so it costs no disk), 151936 tokens,
//     151387 merges, token types;
//   * "many-tensors": the same vocabulary and 20000 small tensors.
// Results: bench/results/gguf-open.md.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/writer.h"

using namespace qinfer;
namespace fs = std::filesystem;

namespace {

std::string ref(const char* name) { return std::string(QINFER_REFERENCE_DIR) + "/" + name; }

// Qwen-sized vocabulary metadata.
void add_vocab(gguf::Writer& w) {
    std::vector<std::string> tokens, merges;
    std::vector<int32_t> types;
    for (int i = 0; i < 151936; ++i) {
        std::string t = "tok";  // (+= rather than "tok" + ...: GCC 12 warns falsely on the latter)
        t += std::to_string(i * 7919 % 1000003);
        tokens.push_back(std::move(t));
        types.push_back(i < 151643 ? 1 : 3);
    }
    for (int i = 0; i < 151387; ++i) {
        std::string m = "m";
        m += std::to_string(i);
        m += " x";
        m += std::to_string(i % 977);
        merges.push_back(std::move(m));
    }
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "qwen2");
    w.set_string_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
    w.set_array("tokenizer.ggml.token_type", types);
    w.set_string_array("tokenizer.ggml.merges", std::span<const std::string>(merges));
    w.set_u32("tokenizer.ggml.eos_token_id", 151645);
    w.set_string("tokenizer.chat_template", std::string(4000, 'x'));
}

// Writes the header and extends the file to its full size: a sparse file whose
// data reads as zeros (the benchmark never reads it).
std::string make_sparse(const gguf::Writer& w, const std::string& name) {
    std::string path = (fs::temp_directory_path() / (name + "-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + ".gguf")).string();
    {
        auto head = w.header_bytes();
        std::ofstream out(path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(head.data()), std::streamsize(head.size()));
    }
    fs::resize_file(path, w.file_size());
    return path;
}

struct Synthetic {
    std::string path;
    ~Synthetic() {
        std::error_code ec;
        if (!path.empty()) fs::remove(path, ec);
    }
};

const std::string& qwen3_8b_like() {
    static Synthetic s;
    if (s.path.empty()) {
        gguf::Writer w;
        const int64_t E = 4096, F = 12288, V = 151936, L = 36;
        w.set_string("general.architecture", "qwen3");
        w.set_u32("qwen3.block_count", uint32_t(L));
        w.set_u32("qwen3.embedding_length", uint32_t(E));
        add_vocab(w);
        auto mat = [&](const std::string& n, GgmlType t, int64_t in, int64_t out) {
            w.add_tensor(n, t, {in, out}, [](const gguf::ByteSink&) {});  // never called: header only
        };
        mat("token_embd.weight", GgmlType::Q6_K, E, V);
        w.add_tensor("output_norm.weight", GgmlType::F32, {E}, [](const gguf::ByteSink&) {});
        mat("output.weight", GgmlType::Q6_K, E, V);
        for (int64_t l = 0; l < L; ++l) {
            std::string p = "blk." + std::to_string(l) + ".";
            for (const char* n : {"attn_norm.weight", "ffn_norm.weight"})
                w.add_tensor(p + n, GgmlType::F32, {E}, [](const gguf::ByteSink&) {});
            for (const char* n : {"attn_q_norm.weight", "attn_k_norm.weight"})
                w.add_tensor(p + n, GgmlType::F32, {128}, [](const gguf::ByteSink&) {});
            mat(p + "attn_q.weight", GgmlType::Q4_K, E, E);
            mat(p + "attn_k.weight", GgmlType::Q4_K, E, 1024);
            mat(p + "attn_v.weight", GgmlType::Q6_K, E, 1024);
            mat(p + "attn_output.weight", GgmlType::Q4_K, E, E);
            mat(p + "ffn_gate.weight", GgmlType::Q4_K, E, F);
            mat(p + "ffn_up.weight", GgmlType::Q4_K, E, F);
            mat(p + "ffn_down.weight", GgmlType::Q6_K, F, E);
        }
        s.path = make_sparse(w, "qinfer-bench-qwen3-8b-like");
    }
    return s.path;
}

const std::string& many_tensors() {
    static Synthetic s;
    if (s.path.empty()) {
        gguf::Writer w;
        w.set_string("general.architecture", "test");
        add_vocab(w);
        for (int i = 0; i < 20000; ++i)
            w.add_tensor("blk." + std::to_string(i / 100) + ".expert." + std::to_string(i % 100) + ".weight",
                         GgmlType::Q8_0, {4096, 16}, [](const gguf::ByteSink&) {});
        s.path = make_sparse(w, "qinfer-bench-many-tensors");
    }
    return s.path;
}

void open_file(benchmark::State& state, const std::string& path) {
    if (!fs::exists(path)) {
        state.SkipWithError(("missing " + path).c_str());
        return;
    }
    size_t n_tensors = 0, n_kv = 0;
    for (auto _ : state) {
        auto f = gguf::File::open(path);
        n_tensors = f->tensors().size();
        n_kv = f->metadata().size();
        benchmark::DoNotOptimize(f.get());
    }
    state.counters["file_MB"] = double(fs::file_size(path)) / 1e6;
    state.counters["tensors"] = double(n_tensors);
    state.counters["keys"] = double(n_kv);
}

void BM_OpenReference(benchmark::State& state, const char* name) { open_file(state, ref(name)); }
void BM_OpenQwen3_8B_Like(benchmark::State& state) { open_file(state, qwen3_8b_like()); }
void BM_OpenManyTensors(benchmark::State& state) { open_file(state, many_tensors()); }

}  // namespace

BENCHMARK_CAPTURE(BM_OpenReference, tiny_qwen35_q4_k_m, "tiny-qwen35.q4_k_m.gguf")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OpenReference, tiny_qwen3_q4_k_m, "tiny-qwen3.q4_k_m.gguf")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OpenReference, tiny_qwen2_q8_0, "tiny-qwen2.q8_0.gguf")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OpenReference, tiny_qwen35_f32_large, "large/tiny-qwen35.f32.gguf")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OpenReference, vocab_qwen3, "vocab-qwen3.gguf")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_OpenQwen3_8B_Like)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_OpenManyTensors)->Unit(benchmark::kMillisecond);
