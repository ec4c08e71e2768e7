// Continuous batching: several Sequences on several slots through BatchStep
// produce exactly what each produces alone, including a sequence that joins
// while the others are generating and prompts split into chunks.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "engine/batch_step.h"
#include "engine/sequence.h"
#include "model/model.h"
#include "qinfer/engine.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

using namespace qinfer;

TEST(BatchStep, ManySequencesMatchSingleRuns) {
    const std::string path = test::reference_path("tiny-qwen35.q8_0.gguf");
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "reference model missing: " << path;
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
