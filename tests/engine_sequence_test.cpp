// The per-sequence half of the decode loop, driven without a model: logits
// are one-hot rows that force chosen tokens, so stop strings, UTF-8
// streaming, limits and batching are checked exactly.
#include <gtest/gtest.h>

#include <memory>

#include "common/error.h"
#include "engine/sequence.h"
#include "engine/stop_matcher.h"
#include "gguf/gguf.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

using namespace qinfer;

// ---- StopMatcher on its own

namespace {
std::string feed_all(StopMatcher& m, const std::vector<std::string>& pieces, std::vector<std::string>* out = nullptr) {
    std::string s;
    for (const std::string& p : pieces) {
        std::string e = m.push(p);
        if (out) out->push_back(e);
        s += e;
    }
    return s;
}
}  // namespace

TEST(StopMatcher, MatchAcrossPiecesNeverEmitsStop) {
    StopMatcher m({"</answer>"});
    std::vector<std::string> emitted;
    std::string s = feed_all(m, {"The result", " is 4</", "ans", "wer> and more"}, &emitted);
    EXPECT_EQ(s, "The result is 4");
    EXPECT_TRUE(m.matched());
    EXPECT_EQ(m.match(), "</answer>");
    EXPECT_EQ(emitted[1], " is 4");  // "</" held back
    EXPECT_EQ(emitted[2], "");       // "</ans" still a prefix
    EXPECT_EQ(m.push("later"), "");
    EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, HeldTextReleasedWhenItDiverges) {
    StopMatcher m({"STOP"});
    std::vector<std::string> emitted;
    std::string s = feed_all(m, {"ab S", "T", "x", "yz ST"}, &emitted);
    EXPECT_EQ(emitted[0], "ab ");
    EXPECT_EQ(emitted[1], "");
    EXPECT_EQ(emitted[2], "STx");
    EXPECT_EQ(s, "ab STxyz ");
    EXPECT_FALSE(m.matched());
    EXPECT_EQ(m.flush(), "ST");
}

TEST(StopMatcher, EarliestMatchWinsAndLongestAtSamePosition) {
    StopMatcher a({"world", "lo"});
    EXPECT_EQ(a.push("hello world"), "hel");
    EXPECT_EQ(a.match(), "lo");
    StopMatcher b({"ab", "abc"});
    EXPECT_EQ(b.push("xxabcd"), "xx");
    EXPECT_EQ(b.match(), "abc");
}

TEST(StopMatcher, NoStopsPassesThrough) {
    StopMatcher m({"", ""});
    EXPECT_EQ(m.push("abc"), "abc");
    EXPECT_EQ(m.held(), 0u);
}

TEST(StopMatcher, MultiByteStopString) {
    StopMatcher m({"。结束"});
    std::string s = feed_all(m, {"你好", "。", "结", "束了"});
    EXPECT_EQ(s, "你好");
    EXPECT_TRUE(m.matched());
}

// ---- Sequence with a real tokenizer and forced tokens

namespace {

class SequenceTest : public ::testing::Test {
protected:
    void SetUp() override {
        const std::string path = test::reference_path("tiny-qwen35.q8_0.gguf");
        if (!test::reference_available()) GTEST_SKIP() << "reference data missing: " << path;
        file_ = gguf::File::open(path);
        tok_ = std::make_unique<Tokenizer>(*file_);
    }

    GenerateRequest greedy(int max_tokens, std::vector<std::string> stop = {}) {
        GenerateRequest r;
        r.sampling.temperature = 0.0f;
        r.max_tokens = max_tokens;
        r.stop = std::move(stop);
        return r;
    }

    // Runs the sequence, forcing `forced[i]` as the i-th sampled token (the
    // last one repeats). Returns the pieces passed to on_token.
    std::vector<std::string> drive(Sequence& seq, const std::vector<int32_t>& forced, int budget = 512) {
        std::vector<float> logits(size_t(tok_->n_vocab()));
        size_t step = 0;
        for (int guard = 0; !seq.done() && guard < 10000; guard++) {
            Batch b;
            const int n = seq.add_to_batch(b, budget);
            EXPECT_GT(n, 0);
            if (n == 0) break;
            for (size_t i = 1; i < b.size(); i++) EXPECT_EQ(b.pos[i], b.pos[i - 1] + 1);
            if (!seq.wants_logits()) continue;
            std::fill(logits.begin(), logits.end(), 0.0f);
            logits[size_t(forced[std::min(step, forced.size() - 1)])] = 10.0f;
            step++;
            seq.on_logits(logits.data());
        }
        return pieces_;
    }

    GenerateCallbacks recorder() {
        GenerateCallbacks cb;
        cb.on_token = [this](int32_t id, std::string_view piece) {
            ids_.push_back(id);
            pieces_.emplace_back(piece);
            return true;
        };
        return cb;
    }

    std::unique_ptr<gguf::File> file_;
    std::unique_ptr<Tokenizer> tok_;
    std::vector<std::string> pieces_;
    std::vector<int32_t> ids_;
};

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (auto& x : v) s += x;
    return s;
}

}  // namespace

TEST_F(SequenceTest, StopStringAcrossTokenBoundary) {
    std::vector<int32_t> text = tok_->encode("Hello world, and more text here");
    // Find two neighbouring tokens of at least 2 bytes each and start there.
    size_t i = 0;
    while (i + 1 < text.size() && (tok_->piece(text[i]).size() < 2 || tok_->piece(text[i + 1]).size() < 2)) i++;
    ASSERT_LT(i + 1, text.size());
    text.erase(text.begin(), text.begin() + long(i));
    // A stop string that starts inside token 0's text and ends inside token 1's.
    const std::string t0(tok_->piece(text[0])), t1(tok_->piece(text[1]));
    const std::string stop = t0.substr(1) + t1.substr(0, t1.size() - 1);
    Sequence seq(*tok_, tok_->n_vocab(), 256, 0, greedy(20, {stop}), recorder());
    seq.set_prompt(tok_->encode("<|im_start|>user\nhi"));
    drive(seq, text);
    EXPECT_EQ(seq.result().finish_reason, FinishReason::Stop);
    EXPECT_EQ(seq.result().stop_string, stop);
    EXPECT_EQ(join(pieces_), t0.substr(0, 1));
    EXPECT_EQ(seq.result().text, t0.substr(0, 1));
    EXPECT_EQ(seq.result().n_generated, 2);
    for (const std::string& p : pieces_) EXPECT_EQ(p.find(stop), std::string::npos);
}

TEST_F(SequenceTest, HeldBackPrefixIsReleasedAtTheEnd) {
    const std::string s = "Hello world";
    const std::vector<int32_t> text = tok_->encode(s);
    // "world!" never completes: the held "world" must come out when the limit hits.
    Sequence seq(*tok_, tok_->n_vocab(), 256, 0, greedy(int(text.size()), {"world!"}), recorder());
    seq.set_prompt({1, 2, 3});
    drive(seq, text);
    EXPECT_EQ(seq.result().finish_reason, FinishReason::Length);
    EXPECT_EQ(join(pieces_), s);
    EXPECT_TRUE(seq.result().stop_string.empty());
}

TEST_F(SequenceTest, Utf8NeverSplitInPieces) {
    const std::string s = "你好，世界 👍 Ünïcödé";
    std::vector<int32_t> text = tok_->encode(s);
    text.push_back(8194);  // <|im_end|>
    Sequence seq(*tok_, tok_->n_vocab(), 256, 0, greedy(-1), recorder());
    seq.set_prompt({1});
    drive(seq, text);
    EXPECT_EQ(seq.result().finish_reason, FinishReason::Stop);
    EXPECT_EQ(join(pieces_), s);
    for (const std::string& p : pieces_) EXPECT_EQ(utf8_sanitize(p), p) << "piece splits a character";
    EXPECT_EQ(ids_.back(), 8194);
    EXPECT_EQ(pieces_.back(), "");  // the end-of-turn token prints nothing
}

TEST_F(SequenceTest, EndOfGenerationStops) {
    ASSERT_TRUE(tok_->is_eog(8194));
    Sequence seq(*tok_, tok_->n_vocab(), 256, 0, greedy(50), recorder());
    seq.set_prompt({5, 6});
    drive(seq, {100, 101, 8194, 102});
    EXPECT_EQ(seq.result().finish_reason, FinishReason::Stop);
    EXPECT_EQ(seq.result().tokens, (std::vector<int32_t>{100, 101, 8194}));
    // With stop_at_eog off it runs to the limit.
    GenerateRequest r = greedy(5);
    r.stop_at_eog = false;
    Sequence seq2(*tok_, tok_->n_vocab(), 256, 0, r);
    seq2.set_prompt({5, 6});
    drive(seq2, {100, 8194, 101});
    EXPECT_EQ(seq2.result().finish_reason, FinishReason::Length);
    EXPECT_EQ(seq2.result().n_generated, 5);
}

TEST_F(SequenceTest, MaxTokensAndZero) {
    Sequence seq(*tok_, tok_->n_vocab(), 256, 0, greedy(7));
    seq.set_prompt({5});
    drive(seq, {300});
    EXPECT_EQ(seq.result().finish_reason, FinishReason::Length);
    EXPECT_EQ(seq.result().n_generated, 7);
    Sequence zero(*tok_, tok_->n_vocab(), 256, 0, greedy(0));
    zero.set_prompt({5});
    drive(zero, {300});
    EXPECT_EQ(zero.result().finish_reason, FinishReason::Length);
    EXPECT_EQ(zero.result().n_generated, 0);
}

TEST_F(SequenceTest, ContextEndGivesLength) {
    // Prompt of 5 in a context of 8: tokens fed at positions 5, 6, 7, and the
    // 4th sampled token has nowhere to go.
    Sequence seq(*tok_, tok_->n_vocab(), 8, 0, greedy(-1));
    seq.set_prompt({1, 2, 3, 4, 5});
    drive(seq, {300});
    EXPECT_EQ(seq.result().finish_reason, FinishReason::Length);
    EXPECT_EQ(seq.result().n_generated, 4);
    EXPECT_EQ(seq.n_past(), 8);
}

TEST_F(SequenceTest, PromptTooLongIsAClearError) {
    Sequence seq(*tok_, tok_->n_vocab(), 4, 0, greedy(-1));
    try {
        seq.set_prompt({1, 2, 3, 4});
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("context"), std::string::npos) << e.what();
    }
    EXPECT_THROW(seq.set_prompt({}), Error);
    EXPECT_THROW(seq.set_prompt({1, tok_->n_vocab()}), Error);
    EXPECT_THROW(seq.set_prompt({-1}), Error);
}

TEST_F(SequenceTest, CallbackCanCancel) {
    GenerateCallbacks cb;
    int calls = 0;
    cb.on_token = [&](int32_t, std::string_view) { return ++calls < 3; };
    Sequence seq(*tok_, tok_->n_vocab(), 256, 0, greedy(50), cb);
    seq.set_prompt({1});
    drive(seq, {300});
    EXPECT_EQ(seq.result().finish_reason, FinishReason::Cancelled);
    EXPECT_EQ(calls, 3);
    EXPECT_EQ(seq.result().n_generated, 3);
}

TEST_F(SequenceTest, PromptChunksAndCachedPrefix) {
    Sequence seq(*tok_, tok_->n_vocab(), 64, 3, greedy(1));
    seq.set_prompt({10, 11, 12, 13, 14, 15, 16}, 2);
    EXPECT_EQ(seq.result().n_cached, 2);
    Batch b;
    EXPECT_EQ(seq.add_to_batch(b, 3), 3);
    EXPECT_FALSE(seq.wants_logits());
    EXPECT_EQ(b.tokens, (std::vector<int32_t>{12, 13, 14}));
    EXPECT_EQ(b.pos, (std::vector<int32_t>{2, 3, 4}));
    EXPECT_EQ(b.slot, (std::vector<int32_t>{3, 3, 3}));
    EXPECT_EQ(b.want_logits, (std::vector<uint8_t>{0, 0, 0}));
    EXPECT_EQ(seq.n_pending(), 2);
    b.clear();
    EXPECT_EQ(seq.add_to_batch(b, 3), 2);
    EXPECT_TRUE(seq.wants_logits());
    EXPECT_EQ(b.want_logits, (std::vector<uint8_t>{0, 1}));
    // A fully cached prompt still feeds its last token (its logits start generation).
    Sequence all(*tok_, tok_->n_vocab(), 64, 0, greedy(1));
    all.set_prompt({10, 11, 12}, 3);
    EXPECT_EQ(all.n_pending(), 1);
}

TEST_F(SequenceTest, SeededSamplingReproducible) {
    auto run = [&](int64_t seed) {
        GenerateRequest r;
        r.sampling.temperature = 1.0f;
        r.sampling.top_k = 0;
        r.sampling.top_p = 1.0f;
        r.sampling.min_p = 0.0f;
        r.sampling.seed = seed;
        r.max_tokens = 32;
        Sequence seq(*tok_, tok_->n_vocab(), 256, 0, r);
        seq.set_prompt({1});
        std::vector<float> logits(size_t(tok_->n_vocab()));
        while (!seq.done()) {
            Batch b;
            seq.add_to_batch(b, 64);
            for (size_t i = 0; i < logits.size(); i++) logits[i] = float((i * 2654435761u) % 1000) / 250.0f;
            seq.on_logits(logits.data());
        }
        return seq.result().tokens;
    };
    EXPECT_EQ(run(5), run(5));
    EXPECT_NE(run(5), run(6));
}
