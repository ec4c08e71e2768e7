// tokenizer.json + tokenizer_config.json (+ chat_template.jinja) -> GGUF
// tokenizer metadata, following llama.cpp's converter (spec/tokenizer.md §1-2,
// reference MANIFEST §1): tokens in id order, added tokens typed CONTROL or
// USER_DEFINED, "[PAD<id>]" UNUSED entries up to the model's vocab size, merges
// as "left right", special ids, chat template.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace qinfer::gguf { class Writer; }

namespace qinfer::convert {

enum TokenType : int32_t { kTokNormal = 1, kTokUnknown = 2, kTokControl = 3, kTokUserDefined = 4, kTokUnused = 5 };

struct GgufVocab {
    std::string pre;                      // "qwen2" or "qwen35"
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<std::string> merges;
    std::optional<uint32_t> bos, eos, eot, pad;
    bool add_bos = false;
    std::string chat_template;
    std::vector<std::pair<std::string, std::string>> named_templates;  // tokenizer.chat_template.<name>
};

struct VocabInputs {
    std::string pre;                     // pre-tokenizer name to record
    int64_t pad_to = 0;                  // model vocab size (embedding rows); 0 = no padding
    std::optional<int64_t> bos_id, eos_id, pad_id;  // config.json fallbacks
};

// Reads `dir`/tokenizer.json, tokenizer_config.json (optional) and
// chat_template.jinja (optional). Throws Error naming the file on bad input.
GgufVocab read_hf_vocab(const std::string& dir, const VocabInputs& in);
// Same from JSON texts (tests); `config_json` may be empty.
GgufVocab parse_hf_vocab(const std::string& tokenizer_json, const std::string& config_json,
                         const std::string& template_file, const VocabInputs& in, const std::string& where);

// tokenizer.ggml.* and tokenizer.chat_template keys.
void write_vocab(gguf::Writer& w, const GgufVocab& v);

// Added tokens llama.cpp treats as CONTROL even without "special": true.
bool token_looks_special(const std::string& text);

}  // namespace qinfer::convert
