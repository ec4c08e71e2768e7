// Random-weight GGUF models of real shapes, for benchmarks and smoke tests:
// `qinfer convert --random PRESET --outtype q4_k_m OUT.gguf`. Weights follow the
// reference recipe (reference MANIFEST §3.4: N(0, 1/n_in) matrices, norms near
// 1, negative ssm_a, dt bias near -1) so activations stay in a sane range, and
// per-tensor types follow llama.cpp's ftype mixes (type_mix.h). Generation runs
// on all cores and streams to disk tensor by tensor; quantized rows are built
// from pools of pre-quantized blocks (random_model.cpp says why).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "convert/hf_config.h"
#include "convert/type_mix.h"

namespace qinfer::convert {

struct RandomModelOptions {
    std::string preset;          // random_presets()
    Ftype ftype = Ftype::F16;
    uint64_t seed = 1;
    int n_threads = 0;           // 0 = physical cores
    // Vocabulary: empty = synthetic (256 byte tokens, the Qwen special tokens,
    // [PAD] up to the preset's vocab size, no merges); a .gguf file (its
    // tokenizer.* keys) or a Hugging Face folder with tokenizer.json. Padded
    // with [PAD<id>] to the preset's vocab size.
    std::string vocab;
    std::function<void(const std::string&)> log;
};

struct RandomModelResult {
    size_t n_tensors = 0;
    uint64_t file_bytes = 0;
    uint64_t n_params = 0;
    double seconds = 0;
};

// "tiny-qwen35", "qwen35-0.8b", "qwen35-4b", "qwen3-4b", "qwen3-0.6b".
std::vector<std::string> random_presets();
// Hyperparameters of a preset; throws Error listing the presets for an unknown name.
HfConfig random_preset(const std::string& name);

RandomModelResult write_random_model(const std::string& out_path, const RandomModelOptions& opt);

}  // namespace qinfer::convert
