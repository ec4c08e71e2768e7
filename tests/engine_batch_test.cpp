// Continuous batching: several Sequences on several slots through BatchStep
// produce exactly what each produces alone, including a sequence that joins
// while the others are generating and prompts split into chunks.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <set>

#include "engine/batch_step.h"
#include "engine/sequence.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "qinfer/engine.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

using namespace qinfer;

TEST(BatchStep, ManySequencesMatchSingleRuns) {
    const std::string path = test::reference_path("tiny-qwen35.q8_0.gguf");
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    EngineOptions o;
    o.n_ctx = 128;
    o.n_slots = 3;
    o.n_batch = 16;  // forces the 40-token prompt into chunks shared with decode tokens
    o.n_threads = 2;
    auto engine = Engine::load(path, o);
    Model& model = engine->model();
    const Tokenizer& tok = engine->tokenizer();
    const int n_vocab = int(model.hparams().n_vocab);

    std::vector<std::vector<int32_t>> prompts = {
        {8193, 872, 198, 39, 4791, 1879, 8194},
        tok.encode("<|im_start|>user\nA longer prompt that needs several chunks of sixteen tokens to be processed, "
                   "so its prefill overlaps the others' generation.<|im_end|>\n<|im_start|>assistant\n"),
        {8193, 77, 78, 79, 80},
    };
    ASSERT_GT(prompts[1].size(), 32u);
    GenerateRequest req;
    req.sampling.temperature = 0.0f;
    req.max_tokens = 12;
    req.stop_at_eog = false;

    // Alone, one after the other (the engine's own loop on slot 0).
    std::vector<std::vector<int32_t>> alone;
    for (const auto& p : prompts) {
        GenerateRequest r = req;
        r.prompt_ids = p;
        r.reuse_cache = false;
        alone.push_back(engine->generate(r).tokens);
        ASSERT_EQ(alone.back().size(), 12u);
    }

    // Together; the third joins after three steps.
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int s = 0; s < 3; s++) {
        model.clear_slot(s);
        seqs.push_back(std::make_unique<Sequence>(tok, n_vocab, o.n_ctx, s, req));
        seqs.back()->set_prompt(prompts[size_t(s)]);
    }
    BatchStep step(model);
    int steps = 0;
    size_t max_batch = 0;
    for (;;) {
        std::vector<Sequence*> running;
        for (int s = 0; s < 3; s++)
            if (!seqs[size_t(s)]->done() && (s < 2 || steps >= 3)) running.push_back(seqs[size_t(s)].get());
        if (running.empty()) break;
        ASSERT_GT(step.run(running), 0);
        max_batch = std::max(max_batch, step.last_batch().size());
        ASSERT_LT(++steps, 200);
    }
    EXPECT_EQ(max_batch, 16u);
    for (int s = 0; s < 3; s++) {
        EXPECT_EQ(seqs[size_t(s)]->result().tokens, alone[size_t(s)]) << "sequence " << s;
        EXPECT_EQ(seqs[size_t(s)]->result().finish_reason, FinishReason::Length);
    }
}

// Sampled sequences through BatchStep (which asks the model for a few
// candidates per row where the samplers allow it: top-k sampling, greedy with
// penalties) draw the tokens that sampling whole rows of logits draws, with
// the same seeds; a sequence that needs whole rows (top-k off) sends the step
// back to logits.
TEST(BatchStep, SampledSequencesDrawWhatWholeRowsDraw) {
    const std::string path = test::reference_path("tiny-qwen35.q8_0.gguf");
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    EngineOptions o;
    o.n_ctx = 96;
    o.n_slots = 3;
    o.n_batch = 16;
    o.n_threads = 2;
    auto engine = Engine::load(path, o);
    Model& model = engine->model();
    const Tokenizer& tok = engine->tokenizer();
    const int n_vocab = int(model.hparams().n_vocab);
    const std::vector<int32_t> prompt = {8193, 872, 198, 39, 4791, 1879, 8194};

    std::vector<GenerateRequest> reqs(3);
    reqs[0].sampling.temperature = 1.2f;  // top-k 40 (the default), a high temperature
    reqs[0].sampling.seed = 11;
    reqs[1].sampling.temperature = 0.0f;  // greedy, but penalised: not the backend's argmax
    reqs[1].sampling.repeat_penalty = 1.5f;
    reqs[1].sampling.presence_penalty = 4.0f;
    reqs[2].sampling.temperature = 1.0f;
    reqs[2].sampling.top_k = 7;
    reqs[2].sampling.repeat_penalty = 1.3f;
    reqs[2].sampling.frequency_penalty = 2.0f;
    reqs[2].sampling.logit_bias = {{198, -3.0f}};
    reqs[2].sampling.seed = 12;
    for (GenerateRequest& r : reqs) {
        r.max_tokens = 24;
        r.stop_at_eog = false;
    }
    // Runs the sequences in `which` together; `whole_rows`: sequence 0 samples
    // top-p over the whole row, so every step sends logits back for all.
    auto generate = [&](std::vector<int> which, bool whole_rows) {
        std::vector<GenerateRequest> rs = reqs;
        if (whole_rows) rs[0].sampling.top_k = 0;
        std::vector<std::unique_ptr<Sequence>> seqs(3);
        std::vector<Sequence*> running;
        for (int s : which) {
            model.clear_slot(s);
            seqs[size_t(s)] = std::make_unique<Sequence>(tok, n_vocab, o.n_ctx, s, rs[size_t(s)]);
            seqs[size_t(s)]->set_prompt(prompt);
            running.push_back(seqs[size_t(s)].get());
        }
        BatchStep step(model);
        for (int steps = 0; step.run(running) > 0; steps++) EXPECT_LT(steps, 100);
        std::vector<std::vector<int32_t>> out(3);
        for (int s : which) out[size_t(s)] = seqs[size_t(s)]->result().tokens;
        return out;
    };
    // Sequences 1 and 2 from as many candidates as each needs, then from whole rows.
    const auto few = generate({1, 2}, false), whole = generate({0, 1, 2}, true);
    for (int s = 1; s < 3; s++) {
        ASSERT_EQ(few[size_t(s)].size(), 24u);
        EXPECT_EQ(few[size_t(s)], whole[size_t(s)]) << "sequence " << s;
    }
    // Sequence 0 from its 40 candidates against the same sampler over whole rows.
    GenerateRequest alone = reqs[0];
    alone.prompt_ids = prompt;
    alone.reuse_cache = false;
    std::vector<float> logits;
    Sampler sampler(alone.sampling, n_vocab);
    model.clear_slot(0);
    Batch b;
    for (size_t i = 0; i < prompt.size(); i++) b.add(prompt[i], int32_t(i), 0, i + 1 == prompt.size());
    std::vector<int32_t> want;
    for (int t = 0; t < 24; t++) {
        model.forward(b, logits);
        const int32_t id = sampler.sample(logits.data());
        sampler.accept(id);
        want.push_back(id);
        b.clear();
        b.add(id, int32_t(prompt.size()) + t, 0, true);
    }
    EXPECT_EQ(generate({0}, false)[0], want);
}

// A model that records how many candidates each step asks for.
class CountingModel final : public Model {
public:
    explicit CountingModel(Model& m) : m_(m) {}
    const HParams& hparams() const override { return m_.hparams(); }
    const gguf::File& file() const override { return m_.file(); }
    const ModelOptions& options() const override { return m_.options(); }
    void forward(const Batch& b, std::vector<float>& l) override { m_.forward(b, l); }
    void forward_argmax(const Batch& b, std::vector<int32_t>& ids) override { m_.forward_argmax(b, ids); }
    void forward_top(const Batch& b, int n, std::vector<float>& l, std::vector<int32_t>& ids) override {
        asked.push_back(n);
        m_.forward_top(b, n, l, ids);
    }
    void clear_slot(int slot) override { m_.clear_slot(slot); }
    int slot_length(int slot) const override { return m_.slot_length(slot); }
    std::shared_ptr<const StateStore::Snapshot> save_slot(
        int slot, std::shared_ptr<const StateStore::Snapshot> base) const override {
        return m_.save_slot(slot, std::move(base));
    }
    void restore_slot(int slot, const StateStore::Snapshot& snap, int keep) override {
        m_.restore_slot(slot, snap, keep);
    }
    std::string backend_description() const override { return m_.backend_description(); }
    bool layers_on_host() const override { return m_.layers_on_host(); }
    bool offloads_prompts() const override { return m_.offloads_prompts(); }
    std::vector<int> asked;

private:
    Model& m_;
};

// With penalties the candidates a pick needs follow the distinct ids of the
// recent history; the steps ask for a few rounded counts (each a shape of the
// step graph), not a new one at almost every token.
TEST(BatchStep, CandidateCountsAreFewShapes) {
    const std::string path = test::reference_path("tiny-qwen35.q8_0.gguf");
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    EngineOptions o;
    o.n_ctx = 96;
    o.n_slots = 1;
    o.n_threads = 2;
    auto engine = Engine::load(path, o);
    CountingModel model(engine->model());
    GenerateRequest req;
    req.sampling.temperature = 0.9f;
    req.sampling.repeat_penalty = 1.2f;
    req.sampling.seed = 4;
    req.max_tokens = 60;
    req.stop_at_eog = false;
    model.clear_slot(0);
    Sequence seq(engine->tokenizer(), int(model.hparams().n_vocab), o.n_ctx, 0, req);
    seq.set_prompt({8193, 872, 198, 39, 4791, 1879, 8194});
    BatchStep step(model);
    std::vector<Sequence*> running = {&seq};
    for (int steps = 0; step.run(running) > 0; steps++) ASSERT_LT(steps, 100);
    ASSERT_EQ(seq.result().tokens.size(), 60u);
    ASSERT_EQ(model.asked.size(), 60u);  // every step sent back candidates
    std::set<int> shapes(model.asked.begin(), model.asked.end());
    for (int n : shapes) EXPECT_EQ(n % 16, 0) << n;
    EXPECT_LE(shapes.size(), 5u);  // 40 + up to 60 distinct ids: 48 .. 112
    EXPECT_GE(*shapes.rbegin(), 64);  // the penalties' ids were counted
}
