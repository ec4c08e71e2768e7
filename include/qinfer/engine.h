// The public C++ API: load a model, generate text.
//
//   auto engine = qinfer::Engine::load("model.gguf");
//   qinfer::GenerateRequest req;
//   req.messages = {{"user", "Hello"}};
//   qinfer::GenerateCallbacks cb;
//   cb.on_token = [](int32_t, std::string_view piece) { fwrite(piece.data(), 1, piece.size(), stdout); return true; };
//   qinfer::GenerateResult r = engine->generate(req, cb);
//
// Errors (bad file, prompt longer than the context, invalid request) are
// thrown as qinfer::Error with a one-line message. One Engine runs one
// generate() at a time on slot 0; a server that batches many sequences uses
// Sequence (src/engine/sequence.h) with the Model directly.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qinfer/chat.h"
#include "qinfer/sampling.h"

namespace qinfer {

class Model;
class Tokenizer;
namespace chat {
class ChatTemplate;
}

// Element type of the KV cache. q8_0 (GGUF's Q8_0 block: an f16 scale and 32
// int8 values, 34 bytes per 32) takes about half the memory of f16, for long
// contexts; so far only the CPU backend runs it (a GPU attention layer refuses
// it at load).
enum class KvCacheType { F16, F32, Q8_0 };
const char* kv_cache_type_name(KvCacheType t);  // "f16", "f32", "q8_0"
// "f16", "f32" or "q8_0"; anything else fails with a message naming the choices.
KvCacheType parse_kv_cache_type(const std::string& name);

struct EngineOptions {
    int n_ctx = 0;           // tokens of context per slot; 0 = min(training context, 4096)
    int n_batch = 0;         // max tokens per forward call (prompt chunks); 0 = 2048 with the whole model on the GPU, else 512
    int n_slots = 1;         // parallel sequences the model allocates state for
    int n_threads = 0;       // CPU threads; 0 = physical cores
    int gpu_layers = 0;      // layers on the GPU (> n_layer: all, head too); -1 = auto (as many as fit)
    uint64_t vram_limit = 0; // bytes the GPU may use (0 = what is free)
    KvCacheType kv_type = KvCacheType::F16;
    // Batches of at least this many tokens run the layers kept in host memory
    // on the GPU too, streaming their weights (llama.cpp's op offload). 0 = off.
    int op_offload_min_batch = 0;
    std::string chat_template;  // Jinja source replacing the GGUF's tokenizer.chat_template
    bool jinja = false;         // run the GGUF's template with the Jinja engine instead of built-in ChatML
};

enum class FinishReason {
    None,       // still running
    Stop,       // end-of-generation token or stop string
    Length,     // max_tokens reached or the context is full
    Cancelled,  // on_token returned false
};
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", ""

struct GenerateRequest {
    // The prompt, in order of precedence: token ids, chat messages (rendered
    // with the chat template), raw text (tokenized with parse_special).
    std::vector<int32_t> prompt_ids;
    std::vector<ChatMessage> messages;
    ChatOptions chat;
    std::string prompt;
    bool parse_special = true;

    SamplingParams sampling;
    int max_tokens = -1;             // < 0: until end of generation or the context is full
    std::vector<std::string> stop;   // stop strings, matched across token boundaries, never emitted
    bool stop_at_eog = true;         // false: keep generating through end-of-generation tokens
    bool show_special = false;       // render control tokens (<|im_end|> ...) in the text
    bool reuse_cache = true;         // keep the slot's state when the new prompt extends it
};

struct GenerateCallbacks {
    // Pre-processing hooks: the prompt text after chat rendering (before
    // tokenization), and the final prompt ids (before prefill).
    std::function<void(std::string& text)> on_prompt_text;
    std::function<void(std::vector<int32_t>& ids)> on_prompt_tokens;
    // Every generated token with the text it releases: complete UTF-8 only,
    // text that could start a stop string held back until it is decided.
    // Return false to stop (finish reason "cancelled").
    std::function<bool(int32_t id, std::string_view piece)> on_token;
};

struct GenerateResult {
    FinishReason finish_reason = FinishReason::None;
    std::string text;               // everything passed to on_token, joined
    std::vector<int32_t> tokens;    // generated ids, including a final end-of-generation id
    std::string stop_string;        // the stop string that ended generation, if any
    int n_prompt = 0;               // prompt tokens
    int n_cached = 0;               // prompt tokens reused from the slot (not recomputed)
    int n_generated = 0;            // sampled tokens
    double prompt_ms = 0;           // prompt processing (prefill) time
    double ttft_ms = 0;             // request start -> first token sampled
    double gen_ms = 0;              // first token -> last token (n_generated - 1 decode steps)
    uint64_t seed = 0;              // sampler seed actually used

    double prompt_tokens_per_s() const;
    double gen_tokens_per_s() const;
};

struct ModelInfo {
    std::string arch;        // general.architecture
    std::string name;        // general.name (or file name)
    std::string backend;     // e.g. "CPU (8 threads)"
    std::string file_type;   // e.g. "Q4_K - Medium" / "F16" (from general.file_type)
    uint64_t file_bytes = 0;
    uint64_t n_params = 0;
    int n_ctx = 0;
    int n_ctx_train = 0;
    int n_vocab = 0;
};

class Engine {
public:
    static std::unique_ptr<Engine> load(const std::string& path, const EngineOptions& opt = {});
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    GenerateResult generate(const GenerateRequest& req, const GenerateCallbacks& cb = {});

    // The prompt ids a request turns into (token ids as given, or chat
    // rendering / text, then tokenization), with the prompt hooks applied.
    // generate() starts with this; a batching server calls it per request.
    std::vector<int32_t> prepare_prompt(const GenerateRequest& req, const GenerateCallbacks& cb = {}) const;

    std::vector<int32_t> tokenize(std::string_view text, bool parse_special = true) const;
    std::string detokenize(const std::vector<int32_t>& ids, bool show_special = false) const;
    // The prompt text a chat request turns into.
    std::string render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& opt) const;
    // Whether the rendered generation prompt leaves the model inside <think>.
    bool chat_starts_in_reasoning(const ChatOptions& opt) const;

    // Recommended sampling: GGUF general.sampling.* over llama.cpp's defaults.
    SamplingParams default_sampling() const;

    ModelInfo info() const;
    double load_ms() const;
    // The parts, for in-repo users (server scheduler, CLI output parsing).
    Model& model();
    const Tokenizer& tokenizer() const;
    const chat::ChatTemplate& chat_template() const;

    struct Impl;

private:
    explicit Engine(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace qinfer
