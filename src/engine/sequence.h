// One generation in progress: the per-sequence half of the decode loop.
//
// A Sequence owns everything that belongs to one request -- its prompt, the
// sampler (history, RNG), the streaming detokenizer, stop-string matching,
// counters and timings -- and nothing that belongs to the model. The loop
// that owns the Model asks each running Sequence for its next tokens
// (add_to_batch), runs one forward over all of them, and hands each Sequence
// its logits row (on_logits). Engine::generate runs that loop for one
// sequence; the server runs it for many (continuous batching).
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/stop_matcher.h"
#include "model/model.h"
#include "qinfer/engine.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace qinfer {

class Sequence {
public:
    // `slot`: the model slot this sequence's state lives in. `n_ctx`: the
    // slot's capacity. The request's prompt fields are ignored (see
    // set_prompt); its sampling, limits and stop strings apply.
    Sequence(const Tokenizer& tok, int n_vocab, int n_ctx, int slot, const GenerateRequest& req,
             GenerateCallbacks cb = {});

    // The prompt ids; the first `n_cached` are already in the slot (their
    // state was kept from an earlier request). Throws Error when the prompt is
    // empty, has an id outside the vocabulary or does not leave room in the
    // context for at least one generated token.
    void set_prompt(std::vector<int32_t> ids, int n_cached = 0);

    int slot() const { return slot_; }
    bool done() const { return result_.finish_reason != FinishReason::None; }
    bool prefilling() const { return n_past_ < int(prompt_.size()); }
    // Tokens the next add_to_batch would add without a budget.
    int n_pending() const;
    // Tokens in the slot so far (its next position).
    int n_past() const { return n_past_; }

    // Appends up to `budget` tokens (a prompt chunk, or the last sampled
    // token) at the slot's next positions; the last one asks for logits when
    // it completes the prompt or is a decode token. Returns the count added.
    int add_to_batch(Batch& batch, int budget);
    // Whether the last add_to_batch asked for logits (then on_logits must follow).
    bool wants_logits() const { return wants_logits_; }

    // The logits row for the sequence's last batch token: samples, streams the
    // text through on_token, checks the stop conditions. `logits` is modified.
    void on_logits(float* logits);
    // Whether the pending pick is the plain argmax of the logits (greedy, no
    // bias or penalties): the batch may then ask the model for the id only.
    bool picks_argmax() const { return sampler_.is_plain_argmax(); }
    // The token chosen for this sequence when picks_argmax(): what on_logits
    // would have sampled.
    void on_token(int32_t id);
    // How many of the best logits the pending pick depends on (0: all of them;
    // Sampler::candidates_needed), and the pick from those alone: the same
    // token on_logits would sample from the whole row.
    int candidates_needed() const { return sampler_.candidates_needed(); }
    void on_candidates(const float* logit, const int32_t* id, int n);

    // Whether the sequence goes on after its next pick unless that pick itself
    // ends it (end of generation, a stop string, the callback): its token
    // limit and the slot leave room for feeding it. A pipelined decode loop
    // queues the step that feeds the pick before the pick is known.
    bool room_after_next_pick() const;
    // The pending pick went into a step that was queued outside add_to_batch
    // (Model::submit_argmax's chain): the bookkeeping add_to_batch would do.
    void pending_fed();

    // Ends the sequence from outside (client gone, server shutdown).
    void cancel();

    const GenerateResult& result() const { return result_; }
    const std::vector<int32_t>& prompt() const { return prompt_; }

private:
    void finish(FinishReason r);
    void emit(int32_t id, std::string piece);

    const Tokenizer& tok_;
    int n_ctx_;
    int slot_;
    int max_tokens_;
    bool stop_at_eog_;
    GenerateCallbacks cb_;
    Sampler sampler_;
    StreamDecoder decoder_;
    StopMatcher stop_;

    std::vector<int32_t> prompt_;
    int n_past_ = 0;                  // tokens already in the slot
    std::optional<int32_t> pending_;  // sampled, not yet fed
    bool wants_logits_ = false;

    using Clock = std::chrono::steady_clock;
    Clock::time_point t_start_, t_prefill_, t_first_, t_last_;
    bool prefill_started_ = false;
    GenerateResult result_;
};

}  // namespace qinfer
