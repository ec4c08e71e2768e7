// Byte-level BPE tokenizer of Qwen GGUF files (spec/tokenizer.md):
// tokenizer.ggml.model = "gpt2", pre-tokenizer "qwen2" or "qwen35".
//
// Behaviour matches llama.cpp (the reference ids were produced by it): special
// tokens are split off first, each remaining fragment is pre-tokenized with
// the deterministic scanner of spec §4.4 (compiled-in Unicode tables) and
// every piece is BPE-merged by merge rank. Two deliberate differences:
//   * invalid UTF-8 bytes are kept as raw bytes (each one classified like
//     U+FFFD) instead of being replaced, so decode(encode(s)) == s for any s;
//   * optional NFC normalization (off by default, like llama.cpp).
//
// The Tokenizer copies what it needs out of the GGUF file: the gguf::File
// may be closed afterwards. All const methods are thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qinfer::gguf {
class File;
}

namespace qinfer {

// tokenizer.ggml.token_type values (spec §2).
enum class TokenType : uint8_t {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
};

enum class PreTokenizer : uint8_t { Qwen2, Qwen35 };

struct TokenizerOptions {
    bool nfc = false;  // NFC-normalize text fragments before pre-tokenizing (HF behaviour)
};

class Tokenizer {
public:
    static constexpr int32_t kNoToken = -1;

    // Throws qinfer::Error for a missing/unsupported tokenizer.ggml.model or
    // tokenizer.ggml.pre, or missing/inconsistent arrays. Out-of-range special
    // ids are ignored with a warning (llama.cpp does the same).
    explicit Tokenizer(const gguf::File& file, const TokenizerOptions& opts = {});
    ~Tokenizer();
    Tokenizer(const Tokenizer&) = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    // Text -> ids. parse_special: match CONTROL/UNKNOWN tokens (<|im_start|> ...)
    // in the text; USER_DEFINED tokens (<think>, <tool_call> ...) are matched
    // either way. Never adds BOS/EOS. Any byte string is accepted.
    std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

    // Ids -> bytes, as the detokenizer prints them: CONTROL/UNKNOWN tokens only
    // when show_special, USER_DEFINED always, UNUSED never. Out-of-range id -> Error.
    std::string decode(const std::vector<int32_t>& ids, bool show_special = false) const;
    // One token as decode() renders it.
    std::string_view piece(int32_t id, bool show_special = false) const;

    // Raw token text as stored in the file (byte-level alphabet, e.g. "Ġworld").
    std::string_view token_text(int32_t id) const;
    // The bytes the token stands for (" world"; "<|im_end|>" for special tokens,
    // empty for UNUSED ones).
    std::string token_bytes(int32_t id) const;

    int32_t n_vocab() const;
    int32_t n_merges() const;
    PreTokenizer pre_tokenizer() const;
    std::string_view pre_tokenizer_name() const;  // "qwen2" / "qwen35"

    // Exact text lookup in the vocabulary (raw text, i.e. "Ġworld", "<|im_end|>").
    int32_t find_token(std::string_view text) const;  // kNoToken if absent

    // Type as loaded, after llama.cpp's fix-ups (e.g. "</s>" forced to Control).
    TokenType token_type(int32_t id) const;
    bool is_control(int32_t id) const;       // Control (hidden unless show_special)
    bool is_user_defined(int32_t id) const;
    bool is_unused(int32_t id) const;
    bool is_special(int32_t id) const;       // Control, UserDefined or Unknown

    // Special ids (kNoToken when absent). Qwen never adds BOS (add_bos() false).
    int32_t bos_id() const;
    int32_t eos_id() const;
    int32_t eot_id() const;
    int32_t pad_id() const;
    bool add_bos() const;
    bool add_eos() const;

    // End-of-generation set as llama.cpp builds it (spec §5, MANIFEST §1):
    // FIM pad/repo/sep, tokens whose text is a known end-of-turn string
    // (<|im_end|>, <|endoftext|>, </s>, ...), plus eos and eot.
    bool is_eog(int32_t id) const;
    const std::vector<int32_t>& eog_ids() const;  // sorted

    // Non-fatal oddities found while loading (forced control tokens, ignored
    // out-of-range special ids, ...), one line each.
    const std::vector<std::string>& warnings() const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming output: push() returns only complete
// UTF-8 characters; bytes of a character split across tokens are held back
// until the rest arrives. flush() returns what is left, with any incomplete or
// invalid sequence replaced by U+FFFD. Not thread-safe (one per stream).
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tok, bool show_special = false);
    std::string push(int32_t id);
    std::string flush();
    void reset() { pending_.clear(); }
    size_t pending_bytes() const { return pending_.size(); }

private:
    const Tokenizer* tok_;
    bool show_special_;
    std::string pending_;
};

// UTF-8 helpers shared by the decoder and the chat/server layers.
// Length of the longest prefix of s that does not end inside an incomplete
// (but so far valid) multi-byte sequence.
size_t utf8_complete_prefix(std::string_view s);
// s with every invalid or truncated UTF-8 sequence replaced by U+FFFD.
std::string utf8_sanitize(std::string_view s);

}  // namespace qinfer
