#include "sampling/sampler.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <random>

#include "common/error.h"

namespace qinfer {

namespace {

// Descending logit, ascending id: a total order, so results never depend on
// the sort algorithm.
inline bool better(const Sampler::Candidate& a, const Sampler::Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

uint64_t random_seed() {
    std::random_device rd;
    uint64_t s = (uint64_t(rd()) << 32) ^ rd();
    s ^= uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count());
    return s & 0x7fffffffffffffffull;  // keep it printable as a non-negative int64
}

}  // namespace

bool Sampler::is_plain_argmax() const {
    const SamplingParams& p = params_;
    const bool penalties = window_ > 0 && (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f ||
                                           p.frequency_penalty != 0.0f);
    return p.temperature <= 0.0f && p.logit_bias.empty() && !penalties;
}

int32_t argmax(const float* v, int n) {
    int32_t best = 0;
    float best_v = v[0];
    for (int i = 1; i < n; i++) {
        if (v[i] > best_v) {
            best_v = v[i];
            best = i;
        }
    }
    return best;
}

Sampler::Sampler(const SamplingParams& params, int n_vocab, int n_ctx)
    : params_(params), n_vocab_(n_vocab) {
    if (n_vocab <= 0) fail(strfmt("sampler: n_vocab must be positive (got %d)", n_vocab));
    if (params_.repeat_last_n < -1)
        fail(strfmt("sampling: repeat_last_n must be >= -1 (got %d)", params_.repeat_last_n));
    if (!(params_.top_p >= 0.0f)) fail("sampling: top_p must be >= 0");
    if (!(params_.min_p >= 0.0f) || params_.min_p > 1.0f) fail("sampling: min_p must be in [0, 1]");
    if (!(params_.repeat_penalty > 0.0f)) fail("sampling: repeat_penalty must be > 0");
    if (params_.min_keep < 1) params_.min_keep = 1;
    window_ = params_.repeat_last_n == -1 ? (n_ctx > 0 ? n_ctx : INT_MAX) : params_.repeat_last_n;
    seed_ = params_.seed >= 0 ? uint64_t(params_.seed) : random_seed();
    rng_.reseed(seed_);
}

void Sampler::reset() {
    history_.clear();
    history_pos_ = 0;
    rng_.reseed(seed_);
}

void Sampler::accept(int32_t token) {
    if (window_ <= 0) return;
    if (history_.size() < size_t(window_)) {
        history_.push_back(token);
    } else {
        history_[history_pos_] = token;
        history_pos_ = (history_pos_ + 1) % history_.size();
    }
}

bool Sampler::penalising() const {
    const bool on = params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                    params_.frequency_penalty != 0.0f;
    return on && !history_.empty();
}

template <class At> void Sampler::modify(At&& at) const {
    for (const auto& [id, bias] : params_.logit_bias)
        if (id >= 0 && id < n_vocab_)
            if (float* l = at(id)) *l += bias;
    if (!penalising()) return;
    // Count occurrences by sorting a copy of the (short) window.
    std::vector<int32_t> ids(history_);
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
        size_t j = i;
        while (j < ids.size() && ids[j] == ids[i]) j++;
        const int32_t id = ids[i];
        const int count = int(j - i);
        i = j;
        if (id < 0 || id >= n_vocab_) continue;
        float* l = at(id);
        if (!l) continue;
        if (*l <= 0.0f)
            *l *= params_.repeat_penalty;
        else
            *l /= params_.repeat_penalty;
        *l -= float(count) * params_.frequency_penalty + params_.presence_penalty;
    }
}

void Sampler::apply_bias_and_penalties(float* logits) const {
    modify([logits](int32_t id) { return logits + id; });
}

bool Sampler::only_lowers() const {
    for (const auto& [id, bias] : params_.logit_bias)
        if (id >= 0 && id < n_vocab_ && !(bias <= 0.0f)) return false;
    if (!penalising()) return true;
    // x / p <= x for x > 0 and x * p <= x for x <= 0 when p >= 1; then a
    // non-negative amount is subtracted.
    return params_.repeat_penalty >= 1.0f && params_.presence_penalty >= 0.0f && params_.frequency_penalty >= 0.0f;
}

int Sampler::candidates_needed() const {
    const bool greedy = params_.temperature <= 0.0f;
    const bool use_top_k = params_.top_k > 0 && params_.top_k < n_vocab_;
    if ((!greedy && !use_top_k) || !only_lowers()) return 0;
    std::vector<int32_t> touched;
    for (const auto& [id, bias] : params_.logit_bias)
        if (id >= 0 && id < n_vocab_) touched.push_back(id);
    if (penalising())
        for (int32_t id : history_)
            if (id >= 0 && id < n_vocab_) touched.push_back(id);
    std::sort(touched.begin(), touched.end());
    const size_t m = size_t(std::unique(touched.begin(), touched.end()) - touched.begin());
    const size_t n = size_t(greedy ? 1 : std::max(params_.top_k, params_.min_keep)) + m;
    if (n > size_t(kMaxTopCandidates)) return 0;
    return int(std::min(n, size_t(n_vocab_)));
}

// The k best candidates, sorted. A bounded heap keeps this one pass over the
// vocabulary for the usual small k; large k uses nth_element.
void Sampler::top_k_into_cand(const float* logits, int k) {
    cand_.clear();
    if (k <= 256) {
        // cand_ is a min-heap under `better` (worst candidate at the front).
        int32_t i = 0;
        for (; i < n_vocab_ && int(cand_.size()) < k; i++) {
            cand_.push_back({logits[i], i});
            std::push_heap(cand_.begin(), cand_.end(), better);
        }
        // Ids only grow, so a later equal logit never beats the heap's worst:
        // a plain `>` against its logit is the whole test for most of the vocabulary.
        float worst = cand_.front().logit;
        for (; i < n_vocab_; i++) {
            if (!(logits[i] > worst)) continue;
            std::pop_heap(cand_.begin(), cand_.end(), better);
            cand_.back() = {logits[i], i};
            std::push_heap(cand_.begin(), cand_.end(), better);
            worst = cand_.front().logit;
        }
        std::sort_heap(cand_.begin(), cand_.end(), better);
        return;
    }
    cand_.resize(size_t(n_vocab_));
    for (int32_t i = 0; i < n_vocab_; i++) cand_[size_t(i)] = {logits[i], i};
    std::nth_element(cand_.begin(), cand_.begin() + k, cand_.end(), better);
    cand_.resize(size_t(k));
    std::sort(cand_.begin(), cand_.end(), better);
}

void Sampler::min_p_into_cand(const float* logits, float max_logit, float min_logit) {
    cand_.clear();
    for (int32_t i = 0; i < n_vocab_; i++)
        if (logits[i] >= min_logit) cand_.push_back({logits[i], i});
    if (int(cand_.size()) < params_.min_keep) {
        top_k_into_cand(logits, std::min(params_.min_keep, n_vocab_));
        return;
    }
    std::sort(cand_.begin(), cand_.end(), better);
}

// Keeps the shortest prefix of the sorted candidates whose probability mass
// (normalised by z_all, the softmax denominator of the set top-p ran on)
// reaches top_p. cand_ may be only partly sorted: it is sorted chunk by chunk
// as the walk proceeds, so a peaked distribution never sorts the whole vocabulary.
void Sampler::top_p_cut(double z_all, float max_logit) {
    double cum = 0.0;
    size_t sorted = 0;
    for (size_t i = 0; i < cand_.size(); i++) {
        if (i == sorted) {
            size_t next = std::min(cand_.size(), std::max<size_t>(64, sorted * 4));
            std::partial_sort(cand_.begin() + long(sorted), cand_.begin() + long(next), cand_.end(), better);
            sorted = next;
        }
        cum += std::exp(double(cand_[i].logit) - double(max_logit)) / z_all;
        if (cum >= double(params_.top_p) && int(i + 1) >= params_.min_keep) {
            cand_.resize(i + 1);
            return;
        }
    }
    if (sorted < cand_.size()) std::sort(cand_.begin() + long(sorted), cand_.end(), better);
}

const std::vector<Sampler::Candidate>& Sampler::filter_top_k_set() {
    const bool use_top_p = params_.top_p < 1.0f;
    const bool use_min_p = params_.min_p > 0.0f;
    const float max_logit = cand_.front().logit;
    double z = 0.0;
    if (use_top_p)
        for (const Candidate& c : cand_) z += std::exp(double(c.logit) - double(max_logit));
    if (use_min_p) {
        const float min_logit = max_logit + std::log(params_.min_p);
        size_t n = 0;
        while (n < cand_.size() && cand_[n].logit >= min_logit) n++;
        cand_.resize(std::max(n, std::min(cand_.size(), size_t(params_.min_keep))));
    }
    if (use_top_p) top_p_cut(z, max_logit);
    return cand_;
}

const std::vector<Sampler::Candidate>& Sampler::filter(const float* logits) {
    const bool use_top_k = params_.top_k > 0 && params_.top_k < n_vocab_;
    const bool use_top_p = params_.top_p < 1.0f;
    const bool use_min_p = params_.min_p > 0.0f;

    // top-p normalises over the set it runs on: the top-k set, or everything.
    // min-p is relative to the maximum only, so it commutes with top-p: the
    // result is the shorter of the two sorted prefixes. Filtering by min-p
    // first means only its (usually small) survivor set is ever sorted.
    if (use_top_k) {
        top_k_into_cand(logits, std::max(params_.top_k, params_.min_keep));
        return filter_top_k_set();
    }
    const float max_logit = logits[argmax(logits, n_vocab_)];
    double z = 0.0;
    if (use_top_p)
        for (int i = 0; i < n_vocab_; i++) z += std::exp(double(logits[i]) - double(max_logit));
    if (use_min_p) {
        min_p_into_cand(logits, max_logit, max_logit + std::log(params_.min_p));
    } else {
        cand_.resize(size_t(n_vocab_));
        for (int32_t i = 0; i < n_vocab_; i++) cand_[size_t(i)] = {logits[i], i};
        if (!use_top_p) return cand_;  // nothing filters: id order is fine for the draw
    }
    if (use_top_p) top_p_cut(z, max_logit);
    return cand_;
}

int32_t Sampler::draw(const std::vector<Candidate>& c) {
    double top = -INFINITY;
    for (const Candidate& x : c) top = std::max(top, double(x.logit));
    if (!std::isfinite(top)) return -1;
    const double inv_t = 1.0 / double(params_.temperature);
    double total = 0.0;
    std::vector<double>& w = weights_;
    w.resize(c.size());
    for (size_t i = 0; i < c.size(); i++) {
        w[i] = std::exp((double(c[i].logit) - top) * inv_t);
        total += w[i];
    }
    const double u = rng_.uniform() * total;
    double cum = 0.0;
    for (size_t i = 0; i < c.size(); i++) {
        cum += w[i];
        if (u < cum) return c[i].id;
    }
    return c.back().id;  // rounding: u landed on the very end
}

int32_t Sampler::sample(float* logits) {
    apply_bias_and_penalties(logits);
    if (params_.temperature <= 0.0f) return argmax(logits, n_vocab_);
    const int32_t id = draw(filter(logits));
    // Everything banned (or NaN): nothing sensible to draw from.
    return id >= 0 ? id : argmax(logits, n_vocab_);
}

int32_t Sampler::sample_top(const float* logit, const int32_t* id, int n) {
    if (n < 1 || n > n_vocab_) fail(strfmt("sampler: %d candidates for a vocabulary of %d", n, n_vocab_));
    // The candidates with bias and penalties applied (ids outside the set are
    // too low to matter: candidates_needed).
    auto load = [&] {
        cand_.resize(size_t(n));
        for (int i = 0; i < n; i++) cand_[size_t(i)] = {logit[i], id[i]};
        modify([this](int32_t tid) -> float* {
            for (Candidate& c : cand_)
                if (c.id == tid) return &c.logit;
            return nullptr;
        });
    };
    load();
    // argmax() of the modified row: the candidates hold its maximum (nothing
    // outside them rises), the lowest id among equals; a row whose best is
    // -inf is all -inf, where argmax() gives index 0.
    auto row_argmax = [this] {
        const Candidate* best = nullptr;
        for (const Candidate& c : cand_)
            if (!std::isnan(c.logit) && (!best || better(c, *best))) best = &c;
        return best && best->logit > -INFINITY ? best->id : 0;
    };
    if (params_.temperature <= 0.0f) return row_argmax();
    std::sort(cand_.begin(), cand_.end(), better);
    const size_t k = size_t(std::max(params_.top_k, params_.min_keep));
    if (cand_.size() > k) cand_.resize(k);
    const int32_t picked = draw(filter_top_k_set());
    if (picked >= 0) return picked;
    load();  // draw() saw no finite logit: sample() takes the argmax of the modified row
    return row_argmax();
}

}  // namespace qinfer
