#include "engine/sequence.h"

#include <algorithm>

#include "common/error.h"

namespace qinfer {

namespace {
double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

Sequence::Sequence(const Tokenizer& tok, int n_vocab, int n_ctx, int slot, const GenerateRequest& req,
                   GenerateCallbacks cb)
    : tok_(tok),
      n_ctx_(n_ctx),
      slot_(slot),
      max_tokens_(req.max_tokens),
      stop_at_eog_(req.stop_at_eog),
      cb_(std::move(cb)),
      sampler_(req.sampling, n_vocab, n_ctx),
      decoder_(tok, req.show_special),
      stop_(req.stop),
      t_start_(Clock::now()) {
    result_.seed = sampler_.seed();
}

void Sequence::set_prompt(std::vector<int32_t> ids, int n_cached) {
    if (ids.empty()) fail("empty prompt: there is nothing to generate from");
    const int n_vocab = tok_.n_vocab();
    for (int32_t id : ids)
        if (id < 0 || id >= n_vocab)
            fail(strfmt("prompt token id %d is outside the vocabulary (0..%d)", id, n_vocab - 1));
    if (int64_t(ids.size()) >= int64_t(n_ctx_))
        fail(strfmt("the prompt is %zu tokens but the context holds %d, leaving no room to generate; "
                    "use a larger context (-c) or a shorter prompt",
                    ids.size(), n_ctx_));
    // At least the last prompt token is always fed: its logits start generation.
    n_cached = std::clamp(n_cached, 0, int(ids.size()) - 1);
    prompt_ = std::move(ids);
    n_past_ = n_cached;
    result_.n_prompt = int(prompt_.size());
    result_.n_cached = n_cached;
    // llama.cpp's CLI puts the prompt into the penalty window as well.
    for (int32_t id : prompt_) sampler_.accept(id);
}

int Sequence::n_pending() const {
    if (done()) return 0;
    if (prefilling()) return int(prompt_.size()) - n_past_;
    return pending_ ? 1 : 0;
}

int Sequence::add_to_batch(Batch& batch, int budget) {
    wants_logits_ = false;
    if (done() || budget <= 0) return 0;
    if (prefilling()) {
        if (!prefill_started_) {
            prefill_started_ = true;
            t_prefill_ = Clock::now();
        }
        const int n = std::min(budget, int(prompt_.size()) - n_past_);
        for (int i = 0; i < n; i++) {
            const int p = n_past_ + i;
            batch.add(prompt_[size_t(p)], p, slot_, p + 1 == int(prompt_.size()));
        }
        n_past_ += n;
        wants_logits_ = !prefilling();
        return n;
    }
    if (!pending_) return 0;
    batch.add(*pending_, n_past_, slot_, true);
    n_past_++;
    pending_.reset();
    wants_logits_ = true;
    return 1;
}

bool Sequence::room_after_next_pick() const {
    if (done() || max_tokens_ == 0) return false;
    // on_token's at_limit with one more token generated
    return !(max_tokens_ > 0 && result_.n_generated + 1 >= max_tokens_) && n_past_ < n_ctx_;
}

void Sequence::pending_fed() {
    if (!pending_) fail("sequence: no pending token was fed");
    n_past_++;
    pending_.reset();
    wants_logits_ = true;
}

void Sequence::on_logits(float* logits) {
    if (done()) return;
    if (max_tokens_ == 0) {
        on_token(-1);
        return;
    }
    on_token(sampler_.sample(logits));
}

void Sequence::on_candidates(const float* logit, const int32_t* id, int n) {
    if (done()) return;
    if (max_tokens_ == 0) {
        on_token(-1);
        return;
    }
    on_token(sampler_.sample_top(logit, id, n));
}

void Sequence::on_token(int32_t id) {
    if (done()) return;
    wants_logits_ = false;
    const bool first = result_.n_generated == 0;
    if (first) result_.prompt_ms = ms_between(t_prefill_, Clock::now());
    if (max_tokens_ == 0) {
        finish(FinishReason::Length);
        return;
    }

    sampler_.accept(id);
    result_.tokens.push_back(id);
    result_.n_generated++;
    t_last_ = Clock::now();
    if (first) {
        t_first_ = t_last_;
        result_.ttft_ms = ms_between(t_start_, t_first_);
    }

    if (stop_at_eog_ && tok_.is_eog(id)) {
        // End of generation: release whatever was held back.
        std::string piece = stop_.push(decoder_.flush());
        piece += stop_.flush();
        if (stop_.matched()) result_.stop_string = stop_.match();
        finish(FinishReason::Stop);
        emit(id, std::move(piece));
        return;
    }

    std::string piece = stop_.push(decoder_.push(id));
    if (stop_.matched()) {
        result_.stop_string = stop_.match();
        finish(FinishReason::Stop);
        emit(id, std::move(piece));
        return;
    }
    // This token is the last one if the request's limit is reached or the
    // slot cannot take it as input for another step.
    const bool at_limit = (max_tokens_ > 0 && result_.n_generated >= max_tokens_) || n_past_ >= n_ctx_;
    if (at_limit) {
        piece += stop_.push(decoder_.flush());
        piece += stop_.flush();
        if (stop_.matched()) result_.stop_string = stop_.match();
        finish(stop_.matched() ? FinishReason::Stop : FinishReason::Length);
        emit(id, std::move(piece));
        return;
    }
    pending_ = id;
    emit(id, std::move(piece));
}

void Sequence::emit(int32_t id, std::string piece) {
    result_.text += piece;
    if (cb_.on_token && !cb_.on_token(id, piece) && !done()) finish(FinishReason::Cancelled);
}

void Sequence::cancel() {
    if (!done()) finish(FinishReason::Cancelled);
}

void Sequence::finish(FinishReason r) {
    result_.finish_reason = r;
    pending_.reset();
    if (result_.n_generated > 0) result_.gen_ms = ms_between(t_first_, t_last_);
}

}  // namespace qinfer
