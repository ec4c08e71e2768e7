// Engine::generate on a reference tiny model: reference greedy ids through the
// API, slot reuse giving the same result as a fresh prompt, hooks, limits.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/model.h"
#include "qinfer/engine.h"
#include "testutil.h"

using namespace qinfer;
namespace fs = std::filesystem;

namespace {

const std::vector<int32_t> kPrompt = {8193, 872, 198, 39, 4791, 1879, 8194};

class EngineTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        const std::string path = test::reference_path("tiny-qwen35.f16.gguf");
        if (!fs::exists(path)) return;
        EngineOptions o;
        o.n_ctx = 256;
        o.n_threads = 2;
        engine_ = Engine::load(path, o).release();
    }
    static void TearDownTestSuite() {
        delete engine_;
        engine_ = nullptr;
    }
    void SetUp() override {
        if (!engine_) GTEST_SKIP() << "reference model tiny-qwen35.f16.gguf not found in " << test::reference_dir();
    }

    static GenerateRequest greedy(std::vector<int32_t> ids, int n) {
        GenerateRequest r;
        r.prompt_ids = std::move(ids);
        r.sampling.temperature = 0.0f;
        r.max_tokens = n;
        r.stop_at_eog = false;
        return r;
    }

    static Engine* engine_;
};
Engine* EngineTest::engine_ = nullptr;

}  // namespace

TEST_F(EngineTest, GreedyMatchesReference) {
    const auto j = nlohmann::json::parse(test::read_text(test::reference_path("tiny-qwen35.f16.s7.json")));
    const std::vector<int32_t> expected = j.at("greedy").get<std::vector<int32_t>>();
    GenerateResult r = engine_->generate(greedy(kPrompt, 16));
    EXPECT_EQ(r.tokens, expected);
    EXPECT_EQ(r.finish_reason, FinishReason::Length);
    EXPECT_EQ(r.n_prompt, 7);
    EXPECT_EQ(r.n_generated, 16);
    EXPECT_GT(r.prompt_ms, 0.0);
    EXPECT_GE(r.ttft_ms, r.prompt_ms);
}

TEST_F(EngineTest, ReusedSlotGivesSameTokensAsFreshPrompt) {
    GenerateResult first = engine_->generate(greedy(kPrompt, 5));
    // Next "turn": the old prompt, what was generated (all but the last sampled
    // token were fed), then more text.
    std::vector<int32_t> next = kPrompt;
    next.insert(next.end(), first.tokens.begin(), first.tokens.end());
    next.insert(next.end(), {8193, 872, 198, 100, 200});
    GenerateResult reused = engine_->generate(greedy(next, 8));
    EXPECT_EQ(reused.n_cached, int(kPrompt.size() + first.tokens.size() - 1));
    GenerateRequest fresh = greedy(next, 8);
    fresh.reuse_cache = false;
    GenerateResult again = engine_->generate(fresh);
    EXPECT_EQ(again.n_cached, 0);
    EXPECT_EQ(reused.tokens, again.tokens);
    // A prompt that diverges from the slot starts over.
    std::vector<int32_t> other = kPrompt;
    other[3] = 40;
    EXPECT_EQ(engine_->generate(greedy(other, 2)).n_cached, 0);
}

TEST_F(EngineTest, PromptHooksAndChatRendering) {
    GenerateRequest r;
    r.messages = {{"system", "Be brief."}, {"user", "你好"}};
    r.chat.enable_thinking = false;
    r.max_tokens = 3;
    r.sampling.temperature = 0.0f;
    std::string seen_text;
    std::vector<int32_t> seen_ids;
    GenerateCallbacks cb;
    cb.on_prompt_text = [&](std::string& t) { seen_text = t; };
    cb.on_prompt_tokens = [&](std::vector<int32_t>& ids) { seen_ids = ids; };
    GenerateResult res = engine_->generate(r, cb);
    EXPECT_EQ(seen_text, engine_->render_chat(r.messages, r.chat));
    EXPECT_EQ(seen_text,
              "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n"
              "<think>\n\n</think>\n\n");
    EXPECT_EQ(seen_ids, engine_->tokenize(seen_text));
    EXPECT_EQ(seen_ids.front(), 8193);  // <|im_start|> parsed as the special token
    EXPECT_EQ(res.n_prompt, int(seen_ids.size()));
    // The token hook can rewrite the prompt.
    GenerateRequest raw = greedy({1, 2, 3}, 16);
    GenerateCallbacks swap;
    swap.on_prompt_tokens = [](std::vector<int32_t>& ids) { ids = kPrompt; };
    const auto j = nlohmann::json::parse(test::read_text(test::reference_path("tiny-qwen35.f16.s7.json")));
    EXPECT_EQ(engine_->generate(raw, swap).tokens, j.at("greedy").get<std::vector<int32_t>>());
}

TEST_F(EngineTest, CallbackStopsAndStreamsText) {
    GenerateRequest r = greedy(kPrompt, 50);
    std::string streamed;
    int n = 0;
    GenerateCallbacks cb;
    cb.on_token = [&](int32_t, std::string_view piece) {
        streamed += piece;
        return ++n < 4;
    };
    GenerateResult res = engine_->generate(r, cb);
    EXPECT_EQ(res.finish_reason, FinishReason::Cancelled);
    EXPECT_EQ(res.n_generated, 4);
    EXPECT_EQ(res.text, streamed);
}

// Greedy decoding runs pipelined (each step queued before the previous pick
// reaches the host): the same tokens, text and finish reason as one step at a
// time (QINFER_DECODE_PIPELINE=0) whichever way generation ends, and a slot
// that took the extra step's token still continues exactly.
TEST_F(EngineTest, PipelinedDecodeEqualsOneStepAtATime) {
    std::vector<int32_t> long_prompt;
    while (long_prompt.size() < 250) long_prompt.insert(long_prompt.end(), kPrompt.begin(), kPrompt.end());
    long_prompt.resize(250);
    struct Case {
        const char* what;
        GenerateRequest req;
        int cancel_after;  // 0: never
    };
    std::vector<Case> cases = {{"limit", greedy(kPrompt, 16), 0},
                               {"one token", greedy(kPrompt, 1), 0},
                               {"context end", greedy(long_prompt, 50), 0},
                               {"callback", greedy(kPrompt, 30), 3}};
    cases[0].req.stop_at_eog = true;
    auto run = [&](const Case& c, bool pipelined) {
        test::set_env("QINFER_DECODE_PIPELINE", pipelined ? "1" : "0");
        GenerateRequest r = c.req;
        r.reuse_cache = false;
        int n = 0;
        GenerateCallbacks cb;
        if (c.cancel_after) cb.on_token = [&](int32_t, std::string_view) { return ++n < c.cancel_after; };
        GenerateResult res = engine_->generate(r, cb);
        test::unset_env("QINFER_DECODE_PIPELINE");
        return res;
    };
    std::string text16;
    for (const Case& c : cases) {
        const GenerateResult one = run(c, false), piped = run(c, true);
        EXPECT_EQ(piped.tokens, one.tokens) << c.what;
        EXPECT_EQ(piped.text, one.text) << c.what;
        EXPECT_EQ(piped.finish_reason, one.finish_reason) << c.what;
        if (std::string(c.what) == "limit") text16 = one.text;
    }
    EXPECT_EQ(run(cases[2], true).finish_reason, FinishReason::Length);
    // A stop string in the middle of the text: the pick that completes it was
    // already fed by the step queued after it. The next turn reuses the slot.
    ASSERT_GT(text16.size(), 8u);
    Case stop{"stop string", greedy(kPrompt, 16), 0};
    stop.req.stop = {text16.substr(text16.size() / 2, 2)};
    const GenerateResult one = run(stop, false), piped = run(stop, true);
    EXPECT_EQ(piped.finish_reason, FinishReason::Stop);
    EXPECT_EQ(piped.tokens, one.tokens);
    EXPECT_EQ(piped.text, one.text);
    GenerateRequest first = stop.req;  // again, keeping the slot
    const GenerateResult kept = engine_->generate(first);
    std::vector<int32_t> next = kPrompt;
    next.insert(next.end(), kept.tokens.begin(), kept.tokens.end());
    next.insert(next.end(), {8193, 872, 198, 100, 200});
    const GenerateResult reused = engine_->generate(greedy(next, 8));
    EXPECT_EQ(reused.n_cached, int(kPrompt.size() + kept.tokens.size()));
    GenerateRequest fresh = greedy(next, 8);
    fresh.reuse_cache = false;
    EXPECT_EQ(reused.tokens, engine_->generate(fresh).tokens);
}

TEST_F(EngineTest, ErrorsAreClear) {
    std::vector<int32_t> long_prompt(300, 100);
    EXPECT_THROW(engine_->generate(greedy(long_prompt, 1)), Error);
    EXPECT_THROW(engine_->generate(greedy({}, 1)), Error);  // empty text prompt
    // The engine still works afterwards.
    EXPECT_EQ(engine_->generate(greedy(kPrompt, 2)).n_generated, 2);
}

TEST_F(EngineTest, InfoAndDefaults) {
    const ModelInfo i = engine_->info();
    EXPECT_EQ(i.arch, "qwen35");
    EXPECT_EQ(i.n_vocab, 8218);
    EXPECT_EQ(i.n_ctx, 256);
    EXPECT_EQ(i.file_type, "F16");
    EXPECT_GT(i.n_params, 1000000u);
    const SamplingParams p = engine_->default_sampling();  // no general.sampling.* in the file
    EXPECT_FLOAT_EQ(p.temperature, 0.8f);
    EXPECT_EQ(p.top_k, 40);
    EXPECT_FLOAT_EQ(p.top_p, 0.95f);
    EXPECT_FLOAT_EQ(p.min_p, 0.05f);
    EXPECT_FLOAT_EQ(p.repeat_penalty, 1.0f);
    // The prompt batch, not given: 512 with layers on the CPU (2048 only when
    // the whole model is on the GPU; engine options default to gpu_layers 0).
    EXPECT_EQ(engine_->model().options().n_batch, 512);
}

TEST(EngineOptionsBatch, ExplicitKeptNegativeRefused) {
    const std::string path = test::reference_path("tiny-qwen35.f16.gguf");
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    EngineOptions o;
    o.n_ctx = 64;
    o.n_threads = 1;
    o.n_batch = 48;
    EXPECT_EQ(Engine::load(path, o)->model().options().n_batch, 48);
    o.n_batch = -1;
    try {
        Engine::load(path, o);
        ADD_FAILURE() << "a negative batch size loaded";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("batch size"), std::string::npos) << e.what();
    }
}
