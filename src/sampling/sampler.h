// Token sampler with llama.cpp's default chain:
//   logit bias -> penalties (repeat/presence/frequency over the last N tokens)
//   -> top-k -> top-p -> min-p -> temperature -> draw
// temperature <= 0 is greedy: argmax of the biased, penalised logits (lowest id
// wins a tie). One Sampler per sequence; it keeps that sequence's token history
// and RNG, so it is cheap to create and not shared between threads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "qinfer/sampling.h"
#include "sampling/rng.h"

namespace qinfer {

class Sampler {
public:
    // n_vocab: logits per call. n_ctx: window used when repeat_last_n = -1.
    Sampler(const SamplingParams& params, int n_vocab, int n_ctx = 0);

    // Picks the next token. `logits` (n_vocab floats) is modified in place by
    // the bias and penalties. Does not add the token to the history: call
    // accept() with whatever token is actually appended to the sequence.
    int32_t sample(float* logits);

    // True when sample() is the plain argmax of the raw logits: greedy, no
    // bias, no penalties. The caller may then let the backend pick the token
    // (Model::forward_argmax) and never look at the logits.
    bool is_plain_argmax() const;

    // How many of the best raw logits (logit descending, id ascending) the next
    // sample() depends on, when that is at most kMaxTopCandidates; 0 when it may
    // need them all. Greedy or top-k sampling whose bias and penalties can only
    // lower logits needs top_k (1 when greedy) plus the number of ids they
    // touch: a token they lower never climbs past one they leave alone. The
    // caller may then let the backend select those candidates
    // (Model::forward_top) instead of sending back every logit.
    int candidates_needed() const;
    static constexpr int kMaxTopCandidates = 256;

    // sample() given only the best raw logits: `logit[i]`, `id[i]` for i < n,
    // in that order, n >= min(candidates_needed(), n_vocab). Same token, same
    // RNG use as sample() on the whole row; logits outside the set that are NaN
    // are the exception (sample() compares them, this never sees them).
    int32_t sample_top(const float* logit, const int32_t* id, int n);

    // Appends a token (prompt or generated) to the penalty history.
    void accept(int32_t token);

    // Clears the history and restarts the RNG from the seed.
    void reset();

    uint64_t seed() const { return seed_; }
    const SamplingParams& params() const { return params_; }

    // The steps, exposed for tests. Each works on `cand_` (see below).
    struct Candidate {
        float logit;
        int32_t id;
    };
    void apply_bias_and_penalties(float* logits) const;
    // Candidates surviving top-k / top-p / min-p, sorted by logit (desc, id asc),
    // logits not yet divided by the temperature.
    const std::vector<Candidate>& filter(const float* logits);

private:
    // Bias and penalties through `at(id)`, which returns the logit to change or
    // nullptr: a whole row, or a set of candidates.
    template <class At> void modify(At&& at) const;
    // Whether modify() can only lower logits (the condition of candidates_needed).
    bool only_lowers() const;
    bool penalising() const;
    // filter() once cand_ holds the top-k set, sorted: top-p and min-p within it.
    const std::vector<Candidate>& filter_top_k_set();
    // The draw of sample() over the filtered candidates; -1 when no finite
    // logit is left (the caller then takes its plain argmax).
    int32_t draw(const std::vector<Candidate>& c);
    void top_k_into_cand(const float* logits, int k);
    void min_p_into_cand(const float* logits, float max_logit, float min_logit);
    void top_p_cut(double z_all, float max_logit);

    SamplingParams params_;
    int n_vocab_;
    int window_;  // penalty window in tokens (0 = off)
    uint64_t seed_;
    Rng rng_;
    std::vector<int32_t> history_;  // last `window_` accepted tokens (ring, oldest first after rotation)
    size_t history_pos_ = 0;        // next write position once full
    std::vector<Candidate> cand_;
    std::vector<double> weights_;
};

// Index of the largest value; the lowest index wins ties. n must be > 0.
int32_t argmax(const float* v, int n);

}  // namespace qinfer
