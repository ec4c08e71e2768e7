// Engine: owns the Model (slot 0) and the Tokenizer, and runs the decode loop
// for one Sequence at a time.
#include "qinfer/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>

#include "chat/template.h"
#include "common/env.h"
#include "common/error.h"
#include "engine/batch_step.h"
#include "engine/sequence.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace qinfer {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::Stop: return "stop";
        case FinishReason::Length: return "length";
        case FinishReason::Cancelled: return "cancelled";
        default: return "";
    }
}

double GenerateResult::prompt_tokens_per_s() const {
    const int n = n_prompt - n_cached;
    return prompt_ms > 0 ? 1000.0 * n / prompt_ms : 0.0;
}

double GenerateResult::gen_tokens_per_s() const {
    return gen_ms > 0 && n_generated > 1 ? 1000.0 * (n_generated - 1) / gen_ms : 0.0;
}

namespace {

// general.sampling.* may be stored as any numeric type or as a string.
std::optional<double> sampling_key(const gguf::File& f, const char* key) {
    const gguf::Value* v = f.find(key);
    if (!v) return std::nullopt;
    switch (v->type) {
        case gguf::ValueType::F32:
        case gguf::ValueType::F64: return v->f;
        case gguf::ValueType::STRING: {
            const std::string s(v->str);
            char* end = nullptr;
            const double d = std::strtod(s.c_str(), &end);
            if (end == s.c_str() || *end) return std::nullopt;
            return d;
        }
        default:
            if (v->is_integer()) return v->type == gguf::ValueType::U64 ? double(v->u) : double(v->i);
            return std::nullopt;
    }
}

const char* ftype_name(uint64_t t) {
    switch (t) {
        case 0: return "F32";
        case 1: return "F16";
        case 2: return "Q4_0";
        case 3: return "Q4_1";
        case 7: return "Q8_0";
        case 8: return "Q5_0";
        case 9: return "Q5_1";
        case 10: return "Q2_K - Medium";
        case 11: return "Q3_K - Small";
        case 12: return "Q3_K - Medium";
        case 13: return "Q3_K - Large";
        case 14: return "Q4_K - Small";
        case 15: return "Q4_K - Medium";
        case 16: return "Q5_K - Small";
        case 17: return "Q5_K - Medium";
        case 18: return "Q6_K";
        case 30: return "IQ4_XS";
        case 32: return "BF16";
        default: return "?";
    }
}

}  // namespace

struct Engine::Impl {
    EngineOptions opt;
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tok;
    chat::ChatTemplate tmpl;
    double load_ms = 0;
    std::mutex mu;
    // Tokens whose state slot 0 holds, so a follow-up prompt that extends them
    // (the next chat turn) only processes the new part.
    std::vector<int32_t> slot_tokens;
};

const char* kv_cache_type_name(KvCacheType t) {
    switch (t) {
        case KvCacheType::F32: return "f32";
        case KvCacheType::Q8_0: return "q8_0";
        default: return "f16";
    }
}

KvCacheType parse_kv_cache_type(const std::string& name) {
    for (KvCacheType t : {KvCacheType::F16, KvCacheType::F32, KvCacheType::Q8_0})
        if (name == kv_cache_type_name(t)) return t;
    fail(strfmt("KV cache type '%s' is not one of f16, f32, q8_0", name.c_str()));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::load(const std::string& path, const EngineOptions& opt) {
    const auto t0 = std::chrono::steady_clock::now();
    auto impl = std::make_unique<Impl>();
    impl->opt = opt;
    ModelOptions mo;
    if (opt.n_batch < 0) fail(strfmt("batch size must be >= 0 (got %d)", opt.n_batch));
    mo.n_batch = opt.n_batch;  // 0: Model::load picks (kBatchAuto)
    mo.n_slots = opt.n_slots > 0 ? opt.n_slots : 1;
    mo.n_threads = opt.n_threads;
    mo.gpu_layers = opt.gpu_layers;
    mo.vram_limit = opt.vram_limit;
    mo.op_offload_min_batch = opt.op_offload_min_batch;
    mo.kv_type = opt.kv_type == KvCacheType::F32 ? GgmlType::F32
                 : opt.kv_type == KvCacheType::Q8_0 ? GgmlType::Q8_0
                                                    : GgmlType::F16;
    if (opt.n_ctx < 0) fail(strfmt("context size must be >= 0 (got %d)", opt.n_ctx));
    if (opt.n_ctx > 0) {
        mo.n_ctx = opt.n_ctx;
    } else {
        // Read the training context without loading the model twice: open the
        // header (memory-mapped, cheap) first.
        auto f = gguf::File::open(path);
        const std::string arch(f->get_string("general.architecture").value_or(""));
        const uint64_t train = f->get_uint(arch + ".context_length").value_or(4096);
        mo.n_ctx = int(std::min<uint64_t>(train, 4096));
    }
    impl->model = Model::load(path, mo);
    impl->tok = std::make_unique<Tokenizer>(impl->model->file());
    impl->tmpl = chat::ChatTemplate::from_gguf(impl->model->file(), opt.chat_template, opt.jinja);
    if (impl->tok->n_vocab() > impl->model->hparams().n_vocab)
        fail(strfmt("%s: tokenizer has %d tokens but the model only %lld embedding rows", path.c_str(),
                    impl->tok->n_vocab(), (long long)impl->model->hparams().n_vocab));
    impl->load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

namespace {

// Greedy decode steps of one sequence, each queued while the step before it
// runs and fed that step's pick on the device (Model::submit_argmax), so the
// device does not wait for the host between tokens. Returns when the sequence
// is done, or has no token to feed. The step after the last pick is queued only
// where the sequence's limits leave room for it; when the pick ends the
// sequence anyway (end of generation, a stop string), that step has already fed
// it to the slot, and `fed` (the slot's tokens) says so.
void decode_pipelined(Model& model, Sequence& seq, std::vector<int32_t>& fed) {
    Batch b;
    if (seq.add_to_batch(b, 1) == 0) return;
    model.submit_argmax(b, false);
    fed.push_back(b.tokens[0]);
    std::vector<int32_t> ids;
    for (;;) {
        const bool ahead = seq.room_after_next_pick();
        if (ahead) {
            Batch next;
            next.add(0, seq.n_past(), seq.slot(), true);  // the token: the pick being collected
            model.submit_argmax(next, true);
        }
        model.collect_argmax(ids);
        if (ids.size() != 1) fail(strfmt("model returned %zu tokens for 1 row", ids.size()));
        seq.on_token(ids[0]);
        if (!ahead) return;
        fed.push_back(ids[0]);  // the step queued above consumed it
        if (seq.done()) {
            model.collect_argmax(ids);  // that step's own pick is not needed
            return;
        }
        seq.pending_fed();
    }
}

}  // namespace

GenerateResult Engine::generate(const GenerateRequest& req, const GenerateCallbacks& cb) {
    Impl& m = *impl_;
    std::lock_guard<std::mutex> lock(m.mu);
    Model& model = *m.model;
    const int n_ctx = model.options().n_ctx;
    const int n_vocab = int(model.hparams().n_vocab);

    Sequence seq(*m.tok, n_vocab, n_ctx, 0, req, cb);

    const std::vector<int32_t> ids = prepare_prompt(req, cb);

    // Reuse the slot when the new prompt strictly extends what it holds.
    // (Recurrent state cannot be rolled back, so anything else starts over.)
    int n_cached = 0;
    const std::vector<int32_t>& held = m.slot_tokens;
    if (req.reuse_cache && !held.empty() && held.size() < ids.size() &&
        std::equal(held.begin(), held.end(), ids.begin()) && model.slot_length(0) == int(held.size())) {
        n_cached = int(held.size());
    }
    seq.set_prompt(ids, n_cached);
    if (n_cached == 0) {
        model.clear_slot(0);
        m.slot_tokens.clear();
    }

    BatchStep step(model);
    const bool pipelined = env_int("QINFER_DECODE_PIPELINE", 0, 1, 1) != 0;
    try {
        // A step left queued by an error is collected before the slot is reset.
        struct Drain {
            Model& model;
            ~Drain() {
                std::vector<int32_t> ids;
                try {
                    while (model.uncollected() > 0) model.collect_argmax(ids);
                } catch (...) {
                }
            }
        } drain{model};
        while (!seq.done()) {
            if (pipelined && !seq.prefilling() && seq.picks_argmax()) {
                decode_pipelined(model, seq, m.slot_tokens);
                if (seq.done()) break;
            }
            if (step.run({&seq}) == 0) break;
            const Batch& b = step.last_batch();
            m.slot_tokens.insert(m.slot_tokens.end(), b.tokens.begin(), b.tokens.end());
        }
    } catch (...) {
        // The slot's state is unknown after a failed step: start over next time.
        m.slot_tokens.clear();
        model.clear_slot(0);
        throw;
    }
    return seq.result();
}

std::vector<int32_t> Engine::prepare_prompt(const GenerateRequest& req, const GenerateCallbacks& cb) const {
    std::vector<int32_t> ids = req.prompt_ids;
    if (ids.empty()) {
        std::string text = req.messages.empty() ? req.prompt : impl_->tmpl.render(req.messages, req.chat);
        if (cb.on_prompt_text) cb.on_prompt_text(text);
        ids = impl_->tok->encode(text, req.parse_special);
    }
    if (cb.on_prompt_tokens) cb.on_prompt_tokens(ids);
    return ids;
}

std::vector<int32_t> Engine::tokenize(std::string_view text, bool parse_special) const {
    return impl_->tok->encode(text, parse_special);
}

std::string Engine::detokenize(const std::vector<int32_t>& ids, bool show_special) const {
    return impl_->tok->decode(ids, show_special);
}

std::string Engine::render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& opt) const {
    return impl_->tmpl.render(messages, opt);
}

bool Engine::chat_starts_in_reasoning(const ChatOptions& opt) const { return impl_->tmpl.starts_in_reasoning(opt); }

SamplingParams Engine::default_sampling() const {
    SamplingParams p;  // llama.cpp defaults
    const gguf::File& f = impl_->model->file();
    if (auto v = sampling_key(f, "general.sampling.temp")) p.temperature = float(*v);
    if (auto v = sampling_key(f, "general.sampling.top_k")) p.top_k = int(*v);
    if (auto v = sampling_key(f, "general.sampling.top_p")) p.top_p = float(*v);
    if (auto v = sampling_key(f, "general.sampling.min_p")) p.min_p = float(*v);
    if (auto v = sampling_key(f, "general.sampling.penalty_last_n")) p.repeat_last_n = int(*v);
    if (auto v = sampling_key(f, "general.sampling.penalty_repeat")) p.repeat_penalty = float(*v);
    return p;
}

ModelInfo Engine::info() const {
    const Model& model = *impl_->model;
    const gguf::File& f = model.file();
    ModelInfo i;
    i.arch = std::string(f.get_string("general.architecture").value_or(""));
    i.name = std::string(f.get_string("general.name").value_or(""));
    if (i.name.empty()) i.name = std::filesystem::path(f.path()).filename().string();
    i.backend = model.backend_description();
    i.file_type = f.has("general.file_type") ? ftype_name(f.get_uint("general.file_type").value_or(999)) : "?";
    i.file_bytes = f.total_file_bytes();
    for (const gguf::TensorInfo& t : f.tensors()) i.n_params += uint64_t(t.n_elements());
    i.n_ctx = model.options().n_ctx;
    i.n_ctx_train = int(model.hparams().n_ctx_train);
    i.n_vocab = int(model.hparams().n_vocab);
    return i;
}

double Engine::load_ms() const { return impl_->load_ms; }
Model& Engine::model() { return *impl_->model; }
const Tokenizer& Engine::tokenizer() const { return *impl_->tok; }
const chat::ChatTemplate& Engine::chat_template() const { return impl_->tmpl; }

}  // namespace qinfer
