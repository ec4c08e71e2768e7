// Sampler: every step against hand-made logits with exact expectations, the
// fast paths against a naive full-sort reference, and seed reproducibility.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "common/error.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "testutil.h"

using namespace qinfer;

namespace {

SamplingParams no_filters() {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 1;
    return p;
}

std::vector<float> log_probs(std::initializer_list<double> probs) {
    std::vector<float> v;
    for (double p : probs) v.push_back(float(std::log(p)));
    return v;
}

std::vector<int32_t> ids_of(const std::vector<Sampler::Candidate>& c) {
    std::vector<int32_t> ids;
    for (const auto& x : c) ids.push_back(x.id);
    return ids;
}

}  // namespace

TEST(Rng, XoshiroGoldenValues) {
    // xoshiro256** seeded by splitmix64; values computed independently.
    Rng r(42);
    EXPECT_EQ(r.next(), 0x15780b2e0c2ec716ull);
    EXPECT_EQ(r.next(), 0x6104d9866d113a7eull);
    EXPECT_EQ(r.next(), 0xae17533239e499a1ull);
    Rng z(0);
    EXPECT_EQ(z.next(), 0x99ec5f36cb75f2b4ull);
    EXPECT_EQ(z.next(), 0xbf6e1f784956452aull);
}

TEST(Sampler, GreedyArgmaxLowestIdWinsTie) {
    SamplingParams p = no_filters();
    p.temperature = 0.0f;
    Sampler s(p, 5);
    std::vector<float> l = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
    EXPECT_EQ(s.sample(l.data()), 1);
    std::vector<float> neg = {-5.0f, -1.0f, -3.0f};
    Sampler s2(p, 3);
    EXPECT_EQ(s2.sample(neg.data()), 1);
}

TEST(Sampler, RepeatPenaltyDividesPositiveMultipliesNegative) {
    SamplingParams p = no_filters();
    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f;
    Sampler s(p, 4);
    for (int32_t t : {0, 1, 0}) s.accept(t);
    std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f};
    s.apply_bias_and_penalties(l.data());
    // Once per distinct token, whatever the count (llama.cpp semantics).
    EXPECT_FLOAT_EQ(l[0], 1.0f);
    EXPECT_FLOAT_EQ(l[1], -4.0f);
    EXPECT_FLOAT_EQ(l[2], 1.0f);
    EXPECT_FLOAT_EQ(l[3], 0.5f);
    // 0 and 2 now tie at 1.0: greedy takes the lower id.
    std::vector<float> l2 = {2.0f, -2.0f, 1.0f, 0.5f};
    EXPECT_EQ(s.sample(l2.data()), 0);
    // Zero logits are multiplied (stay 0), as in llama.cpp (`<= 0` branch).
    Sampler s3(p, 2);
    s3.accept(1);
    std::vector<float> l3 = {-0.1f, 0.0f};
    s3.apply_bias_and_penalties(l3.data());
    EXPECT_FLOAT_EQ(l3[1], 0.0f);
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
    SamplingParams p = no_filters();
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 1.0f;
    Sampler s(p, 3);
    for (int32_t t : {0, 0, 1}) s.accept(t);
    std::vector<float> l = {3.0f, 3.0f, 3.0f};
    s.apply_bias_and_penalties(l.data());
    EXPECT_FLOAT_EQ(l[0], 3.0f - (2 * 0.5f + 1.0f));
    EXPECT_FLOAT_EQ(l[1], 3.0f - (1 * 0.5f + 1.0f));
    EXPECT_FLOAT_EQ(l[2], 3.0f);
}

TEST(Sampler, PenaltyWindowOnlySeesLastN) {
    SamplingParams p = no_filters();
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 2;
    Sampler s(p, 4);
    for (int32_t t : {0, 1, 2, 3, 1}) s.accept(t);  // window = {3, 1}
    std::vector<float> l = {4.0f, 4.0f, 4.0f, 4.0f};
    s.apply_bias_and_penalties(l.data());
    EXPECT_EQ(l, (std::vector<float>{4.0f, 2.0f, 4.0f, 2.0f}));
    // repeat_last_n = 0 disables the penalties.
    p.repeat_last_n = 0;
    Sampler off(p, 4);
    off.accept(0);
    std::vector<float> l2 = {4.0f, 4.0f, 4.0f, 4.0f};
    off.apply_bias_and_penalties(l2.data());
    EXPECT_FLOAT_EQ(l2[0], 4.0f);
    // reset() forgets the history.
    s.reset();
    std::vector<float> l3 = {4.0f, 4.0f, 4.0f, 4.0f};
    s.apply_bias_and_penalties(l3.data());
    EXPECT_FLOAT_EQ(l3[1], 4.0f);
}

TEST(Sampler, LogitBias) {
    SamplingParams p = no_filters();
    p.temperature = 0.0f;
    p.logit_bias = {{2, -INFINITY}, {0, 1.5f}, {99, 5.0f}};  // out-of-range ids are ignored
    Sampler s(p, 3);
    std::vector<float> l = {1.0f, 2.0f, 9.0f};
    EXPECT_EQ(s.sample(l.data()), 0);  // 2 banned, 0 -> 2.5 beats 1 at 2.0
    EXPECT_FLOAT_EQ(l[0], 2.5f);
}

TEST(Sampler, TopK) {
    SamplingParams p = no_filters();
    p.top_k = 3;
    Sampler s(p, 8);
    std::vector<float> l = {0.1f, 5.0f, -1.0f, 3.0f, 5.0f, 2.0f, 4.0f, 0.0f};
    EXPECT_EQ(ids_of(s.filter(l.data())), (std::vector<int32_t>{1, 4, 6}));
    p.top_k = 1;
    Sampler one(p, 8);
    EXPECT_EQ(ids_of(one.filter(l.data())), (std::vector<int32_t>{1}));
}

TEST(Sampler, TopP) {
    SamplingParams p = no_filters();
    auto l = log_probs({0.15, 0.5, 0.05, 0.3});
    p.top_p = 0.75f;
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{1, 3}));
    p.top_p = 0.85f;
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{1, 3, 0}));
    p.top_p = 0.4f;
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{1}));
    p.min_keep = 2;
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{1, 3}));
}

TEST(Sampler, TopPNormalisesOverTopKSet) {
    SamplingParams p = no_filters();
    auto l = log_probs({0.4, 0.3, 0.2, 0.1});
    p.top_p = 0.55f;
    // Over everything: 0.4 < 0.55 <= 0.7 -> two tokens.
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{0, 1}));
    // After top-k 2 the renormalised mass of id 0 is 0.4/0.7 = 0.571 -> one token.
    p.top_k = 2;
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{0}));
}

TEST(Sampler, MinP) {
    SamplingParams p = no_filters();
    auto l = log_probs({0.05, 0.5, 0.15, 0.3});
    p.min_p = 0.2f;  // keep p >= 0.1
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{1, 3, 2}));
    p.min_p = 0.5f;  // keep p >= 0.25
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{1, 3}));
    p.top_k = 4;  // same through the top-k path
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{1, 3}));
    p.top_k = 0;
    p.min_p = 1.0f;
    p.min_keep = 3;
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{1, 3, 2}));
}

TEST(Sampler, MinPAndTopPTogetherTakeTheShorterPrefix) {
    SamplingParams p = no_filters();
    auto l = log_probs({0.4, 0.3, 0.2, 0.1});
    p.top_p = 0.95f;  // 4 tokens
    p.min_p = 0.6f;   // p >= 0.24: 2 tokens
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{0, 1}));
    p.top_p = 0.35f;  // 1 token
    EXPECT_EQ(ids_of(Sampler(p, 4).filter(l.data())), (std::vector<int32_t>{0}));
}

TEST(Sampler, SeededDrawsAreGolden) {
    // Draw sequence for seed 42 computed independently (same PRNG, same walk).
    SamplingParams p = no_filters();
    p.seed = 42;
    Sampler s(p, 3);
    std::vector<int32_t> got;
    for (int i = 0; i < 12; i++) {
        auto l = log_probs({0.5, 0.3, 0.2});
        got.push_back(s.sample(l.data()));
    }
    EXPECT_EQ(got, (std::vector<int32_t>{0, 0, 1, 2, 2, 1, 1, 2, 1, 1, 1, 0}));
    EXPECT_EQ(s.seed(), 42u);
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDiffers) {
    std::vector<float> l(1000);
    for (size_t i = 0; i < l.size(); i++) l[i] = float(std::sin(double(i) * 0.37) * 3.0);
    auto run = [&](int64_t seed) {
        SamplingParams p;  // defaults: top-k 40, top-p 0.95, min-p 0.05, temp 0.8
        p.min_p = 0.0f;
        p.seed = seed;
        Sampler s(p, int(l.size()));
        std::vector<int32_t> out;
        for (int i = 0; i < 64; i++) {
            auto copy = l;
            int32_t t = s.sample(copy.data());
            s.accept(t);
            out.push_back(t);
        }
        return out;
    };
    EXPECT_EQ(run(7), run(7));
    EXPECT_NE(run(7), run(8));
}

TEST(Sampler, TemperatureShapesTheDistribution) {
    // p(1) = 0.75 at temperature 1; sqrt(3)/(1+sqrt(3)) = 0.634 at temperature 2.
    for (auto [temp, expect] : {std::pair{1.0f, 0.75}, std::pair{2.0f, 0.6340}, std::pair{0.5f, 0.9}}) {
        SamplingParams p = no_filters();
        p.temperature = temp;
        p.seed = 123;
        Sampler s(p, 2);
        int hits = 0;
        const int n = 20000;
        for (int i = 0; i < n; i++) {
            std::vector<float> l = {0.0f, float(std::log(3.0))};
            hits += s.sample(l.data()) == 1;
        }
        EXPECT_NEAR(double(hits) / n, expect, 0.015) << "temperature " << temp;
    }
}

TEST(Sampler, FastPathsMatchNaiveReference) {
    // Naive llama.cpp chain on the fully sorted vocabulary: top-k, softmax +
    // top-p over what is left, min-p.
    auto naive = [](std::vector<Sampler::Candidate> c, const SamplingParams& p) {
        if (p.top_k > 0 && size_t(p.top_k) < c.size()) c.resize(size_t(p.top_k));
        if (p.top_p < 1.0f) {
            double z = 0;
            for (auto& x : c) z += std::exp(double(x.logit) - double(c[0].logit));
            double cum = 0;
            for (size_t i = 0; i < c.size(); i++) {
                cum += std::exp(double(c[i].logit) - double(c[0].logit)) / z;
                if (cum >= p.top_p) { c.resize(i + 1); break; }
            }
        }
        if (p.min_p > 0.0f) {
            const float min_logit = c[0].logit + std::log(p.min_p);
            size_t n = 0;
            while (n < c.size() && c[n].logit >= min_logit) n++;
            c.resize(std::max<size_t>(n, 1));
        }
        return ids_of(c);
    };
    Rng r(99);
    const int n_vocab = 151936;
    std::vector<float> l(n_vocab);
    for (int trial = 0; trial < 4; trial++) {
        const double scale = trial == 0 ? 0.5 : trial == 1 ? 2.0 : trial == 2 ? 6.0 : 12.0;
        for (float& x : l) x = float((r.uniform() - 0.5) * scale);
        std::vector<Sampler::Candidate> sorted;
        for (int32_t i = 0; i < n_vocab; i++) sorted.push_back({l[size_t(i)], i});
        std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) {
            return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
        });
        for (int k : {0, 40, 300, 5000}) {
            for (float top_p : {1.0f, 0.95f, 0.5f}) {
                for (float min_p : {0.0f, 0.05f, 0.3f}) {
                    SamplingParams p = no_filters();
                    p.top_k = k;
                    p.top_p = top_p;
                    p.min_p = min_p;
                    if (k == 0 && top_p == 1.0f && min_p == 0.0f) continue;  // unsorted by design
                    Sampler s(p, n_vocab);
                    ASSERT_EQ(ids_of(s.filter(l.data())), naive(sorted, p))
                        << "scale " << scale << " k " << k << " top_p " << top_p << " min_p " << min_p;
                }
            }
        }
    }
}

TEST(Sampler, RejectsBadParameters) {
    SamplingParams p;
    p.repeat_last_n = -2;
    EXPECT_THROW(Sampler(p, 10), Error);
    p = SamplingParams{};
    p.min_p = 1.5f;
    EXPECT_THROW(Sampler(p, 10), Error);
    p = SamplingParams{};
    p.repeat_penalty = 0.0f;
    EXPECT_THROW(Sampler(p, 10), Error);
    EXPECT_THROW(Sampler(SamplingParams{}, 0), Error);
}

// sample_top on the candidates_needed() best raw logits draws what sample()
// draws from the whole row, for every parameter set that allows it: the same
// token and the same use of the RNG, step after step.
TEST(Sampler, TopCandidatesDrawWhatTheWholeRowDraws) {
    const int n_vocab = 3000;
    Rng r(7);
    // The backend's order: logit descending, the lower id first among equals.
    auto best = [&](const std::vector<float>& l, int n, std::vector<float>& v, std::vector<int32_t>& id) {
        const std::vector<int32_t> order = test::logit_order(l.data(), int64_t(l.size()));
        v.clear();
        id.clear();
        for (int i = 0; i < n; i++) {
            id.push_back(order[size_t(i)]);
            v.push_back(l[size_t(order[size_t(i)])]);
        }
    };
    struct Case {
        float temp;
        int top_k;
        float top_p, min_p, repeat, presence, frequency;
        int min_keep;
        bool bias;
    };
    const Case cases[] = {
        {0.0f, 40, 0.95f, 0.05f, 1.3f, 0.0f, 0.0f, 1, false},  // greedy with penalties
        {0.0f, 0, 1.0f, 0.0f, 1.0f, 0.5f, 0.2f, 1, true},       // greedy, bias and presence / frequency
        {0.8f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 1, false},  // the defaults
        {0.8f, 40, 0.95f, 0.05f, 1.1f, 0.0f, 0.0f, 1, false},
        {1.5f, 5, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 1, false},
        {1.0f, 100, 0.5f, 0.0f, 2.0f, 1.0f, 0.5f, 1, true},
        {1.0f, 20, 0.9f, 0.3f, 1.0f, 0.0f, 0.0f, 30, false},   // min_keep above top_k
        {2.0f, 1, 1.0f, 0.0f, 1.2f, 0.0f, 0.0f, 1, true},
    };
    for (size_t ci = 0; ci < std::size(cases); ci++) {
        const Case& c = cases[ci];
        SamplingParams p;
        p.temperature = c.temp;
        p.top_k = c.top_k;
        p.top_p = c.top_p;
        p.min_p = c.min_p;
        p.repeat_penalty = c.repeat;
        p.presence_penalty = c.presence;
        p.frequency_penalty = c.frequency;
        p.min_keep = c.min_keep;
        p.repeat_last_n = 16;
        p.seed = 1234 + int64_t(ci);
        if (c.bias) p.logit_bias = {{3, -2.0f}, {17, -INFINITY}, {2999, -0.5f}, {3, -1.0f}, {5000, -1.0f}};
        Sampler whole(p, n_vocab), top(p, n_vocab);
        for (int step = 0; step < 60; step++) {
            std::vector<float> l(static_cast<size_t>(n_vocab));
            // Coarse values so that ties are common; -0 and +0 both occur; the
            // best tokens of earlier steps come back so the penalties matter.
            for (float& x : l) x = float(std::round((r.uniform() - 0.5) * 16.0) / 2.0);
            l[size_t(step % 7)] = -0.0f;
            l[3] = 9.0f;
            l[17] = 9.5f;
            const int n = top.candidates_needed();
            ASSERT_GT(n, 0) << "case " << ci;
            std::vector<float> v;
            std::vector<int32_t> id;
            best(l, n, v, id);
            const int32_t a = whole.sample(l.data());
            const int32_t b = top.sample_top(v.data(), id.data(), n);
            ASSERT_EQ(a, b) << "case " << ci << " step " << step << " candidates " << n;
            whole.accept(a);
            top.accept(b);
            if (step % 3 == 0) {  // a repeat of an earlier token
                whole.accept(int32_t(step / 3));
                top.accept(int32_t(step / 3));
            }
        }
    }
}

TEST(Sampler, CandidatesNeededOnlyWhenAFewDecide) {
    SamplingParams p;  // the defaults: top-k 40, no penalties
    EXPECT_EQ(Sampler(p, 1000).candidates_needed(), 40);
    EXPECT_EQ(Sampler(p, 30).candidates_needed(), 0);  // top_k >= n_vocab: top-p over the whole row
    p.top_k = 0;
    EXPECT_EQ(Sampler(p, 1000).candidates_needed(), 0);  // top-p over the whole row
    p.temperature = 0.0f;
    EXPECT_EQ(Sampler(p, 1000).candidates_needed(), 1);
    p = SamplingParams{};
    p.min_keep = 60;
    EXPECT_EQ(Sampler(p, 1000).candidates_needed(), 60);
    p.min_keep = 1;
    p.logit_bias = {{5, 1.0f}};
    EXPECT_EQ(Sampler(p, 1000).candidates_needed(), 0);  // a raised logit may come from anywhere
    p.logit_bias = {{5, -1.0f}, {6, -INFINITY}, {5, -2.0f}, {-1, -1.0f}};
    EXPECT_EQ(Sampler(p, 1000).candidates_needed(), 42);
    p.logit_bias.clear();
    p.repeat_penalty = 1.1f;
    Sampler s(p, 1000);
    EXPECT_EQ(s.candidates_needed(), 40);  // nothing seen yet
    for (int32_t id : {4, 4, 9, 999}) s.accept(id);
    EXPECT_EQ(s.candidates_needed(), 43);
    p.repeat_penalty = 0.9f;  // raises the penalised tokens
    Sampler raising(p, 1000);
    raising.accept(4);
    EXPECT_EQ(raising.candidates_needed(), 0);
    p.repeat_penalty = 1.0f;
    p.presence_penalty = -0.5f;
    Sampler presence(p, 1000);
    presence.accept(4);
    EXPECT_EQ(presence.candidates_needed(), 0);
    p.presence_penalty = 0.0f;
    p.repeat_penalty = 1.1f;
    p.top_k = 250;
    p.repeat_last_n = 64;
    Sampler many(p, 1000);
    for (int32_t id = 0; id < 10; id++) many.accept(id);
    EXPECT_EQ(many.candidates_needed(), 0);  // 260 > kMaxTopCandidates
    EXPECT_THROW(many.sample_top(nullptr, nullptr, 0), Error);
}
