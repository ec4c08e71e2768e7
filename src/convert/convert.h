// `qinfer convert`: a Hugging Face safetensors folder (config.json,
// tokenizer.json, tokenizer_config.json, *.safetensors) to one GGUF file that
// follows llama.cpp's converter conventions, so it loads anywhere a downloaded
// GGUF does.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quant/types.h"

namespace qinfer::convert {

struct ConvertOptions {
    GgmlType outtype = GgmlType::F16;  // F32, F16, BF16 or Q8_0: the type of 2-D weights
    int n_threads = 0;                 // 0 = physical cores
    std::function<void(const std::string&)> log;  // progress and notes (may be empty)
};

struct ConvertResult {
    std::string arch;                 // "qwen35", ...
    size_t n_tensors = 0;
    uint64_t file_bytes = 0;
    std::vector<std::string> notes;
};

// Throws Error naming the file, tensor or key on any problem; on failure no
// output file is left behind.
ConvertResult convert_hf(const std::string& dir, const std::string& out_path, const ConvertOptions& opt);

// Parses --outtype: f32, f16, bf16, q8_0.
GgmlType parse_outtype(const std::string& s);

}  // namespace qinfer::convert
