// Round trips (random Unicode, invalid UTF-8), long inputs without spaces,
// the streaming decoder, an independent string-based BPE cross-check, and
// concurrent encoding.
#include <gtest/gtest.h>

#include <ctime>
#include <cstdio>
#include <climits>
#include <map>
#include <unordered_map>
#include <memory>
#include <random>
#include <thread>

#include "gguf/gguf.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace qinfer;

namespace {

struct Vocab {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<Tokenizer> tok;
};

const Vocab& vocab(const std::string& name) {
    static std::map<std::string, Vocab> cache;
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    Vocab v;
    v.file = gguf::File::open(test::reference_path(name));
    v.tok = std::make_unique<Tokenizer>(*v.file);
    return cache.emplace(name, std::move(v)).first->second;
}

const char* const kVocabs[] = {"vocab-qwen3.gguf", "vocab-qwen35.gguf"};

std::string utf8(uint32_t cp) {
    std::string s;
    unicode::append_utf8(s, cp);
    return s;
}

// Random text mixing the scripts and classes the pre-tokenizer distinguishes.
std::string random_text(std::mt19937& rng, size_t n_chars) {
    static const uint32_t ranges[][2] = {
        {0x20, 0x7E},       {0x20, 0x20},       {0x09, 0x0D},     {0xA0, 0x17F},   {0x300, 0x36F},
        {0x370, 0x3FF},     {0x400, 0x4FF},     {0x590, 0x6FF},   {0x900, 0x97F},  {0xE00, 0xE7F},
        {0x1680, 0x1680},   {0x2000, 0x206F},   {0x2100, 0x27FF}, {0x3000, 0x30FF}, {0x4E00, 0x9FFF},
        {0xAC00, 0xD7A3},   {0xFE00, 0xFE0F},   {0xFEFF, 0xFEFF}, {0xFF00, 0xFFEF}, {0x1F300, 0x1FAFF},
        {0x10000, 0x10FFFF}, {0xE000, 0xF8FF},
    };
    static const char* const words[] = {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "</s>", "'s", "'LL",
                                        "\r\n", "    ", "```", "<|endoftext|>"};
    std::string s;
    for (size_t i = 0; i < n_chars; ++i) {
        if (rng() % 16 == 0) {
            s += words[rng() % (sizeof words / sizeof *words)];
            continue;
        }
        const auto& r = ranges[rng() % (sizeof ranges / sizeof *ranges)];
        uint32_t cp = r[0] + rng() % (r[1] - r[0] + 1);
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';  // surrogates are not characters
        s += utf8(cp);
    }
    return s;
}

}  // namespace

TEST(TokenizerRoundTrip, RandomUnicodeCorpus) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    std::mt19937 rng(12345);
    std::vector<std::string> corpus;
    for (int i = 0; i < 1500; ++i) corpus.push_back(random_text(rng, 1 + rng() % 80));
    for (const char* name : kVocabs) {
        const Tokenizer& tok = *vocab(name).tok;
        for (const std::string& s : corpus) {
            for (bool special : {true, false}) {
                auto ids = tok.encode(s, special);
                ASSERT_EQ(tok.decode(ids, true), s) << name << " special=" << special;
                for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.n_vocab());
                if (!special) {
                    for (int32_t id : ids) ASSERT_FALSE(tok.is_control(id)) << "control token " << id << " in " << s;
                }
            }
        }
    }
}

TEST(TokenizerRoundTrip, InvalidUtf8KeepsItsBytes) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    const std::string fixed[] = {
        "\xff", "\xfe\xff", "\xc0\x80", "\xc1\xbf", "\xed\xa0\x80", "\xe0\x80\x80", "\xf4\x90\x80\x80",
        "\xf8\x88\x80\x80\x80", "\xe4\xbd", "abc\xe4", "\x80\x80\x80", "x \xe4\xbd\xa0\xe5 y", std::string("a\0b", 3),
        "<|im_end|>\xff<think>\xc3",
    };
    std::mt19937 rng(99);
    for (const char* name : kVocabs) {
        const Tokenizer& tok = *vocab(name).tok;
        for (const std::string& s : fixed) EXPECT_EQ(tok.decode(tok.encode(s), true), s);
        for (int i = 0; i < 1500; ++i) {
            std::string s(1 + rng() % 48, '\0');
            for (char& c : s) c = char(rng());
            ASSERT_EQ(tok.decode(tok.encode(s, rng() % 2 == 0), true), s);
        }
    }
}

TEST(TokenizerRoundTrip, LongLinesWithoutSpacesAreNotQuadratic) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    const Tokenizer& tok = *vocab("vocab-qwen3.gguf").tok;
    const size_t n = 1 << 20;
    std::string cjk;
    while (cjk.size() < n) cjk += "\xe6\x95\x8f\xe6\x8d\xb7\xe7\x9a\x84\xe6\xa3\x95\xe8\x89\xb2\xe7\x8b\x90\xe7\x8b\xb8";
    std::mt19937 rng(5);
    std::string bytes(n, '\0');
    for (char& c : bytes) c = char(0x80 + rng() % 64);  // continuation bytes only: all invalid
    const std::pair<const char*, std::string> inputs[] = {
        {"one letter", std::string(n, 'a')}, {"cjk", cjk},
        {"spaces", std::string(n, ' ')},    {"punctuation", std::string(n, '!')}, {"invalid bytes", bytes},
        {"digits", std::string(n, '7')},
    };
    for (const auto& [what, s] : inputs) {
        // CPU time, so that a busy machine does not fail the test. Linear work
        // takes well under a second (Release) or a few (sanitizers);
        // quadratic work on 1 MiB would take hours.
        const std::clock_t c0 = std::clock();
        auto ids = tok.encode(s);
        const double sec = double(std::clock() - c0) / CLOCKS_PER_SEC;
        EXPECT_LT(sec, 20.0) << what;
        std::printf("%-16s %8.1f ms CPU, %zu ids\n", what, sec * 1e3, ids.size());
        EXPECT_EQ(tok.decode(ids), s) << what;
        EXPECT_LT(ids.size(), s.size() + 1) << what;
    }
}

// Plain string-based BPE following spec §6 literally, to cross-check the
// id-based implementation (small and heap paths) on single-piece words.
TEST(TokenizerRoundTrip, MatchesNaiveBpeOnLongWords) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    const Vocab& v = vocab("vocab-qwen3.gguf");
    const Tokenizer& tok = *v.tok;
    std::unordered_map<std::string, int> ranks;  // "left right" -> rank
    const auto* merges = v.file->get_string_array("tokenizer.ggml.merges");
    ASSERT_NE(merges, nullptr);
    for (size_t r = 0; r < merges->size(); ++r) ranks.emplace(std::string((*merges)[r]), int(r));
    auto naive = [&](const std::string& piece) {
        std::vector<std::string> syms;
        for (unsigned char c : piece) syms.push_back(utf8(unicode::byte_to_cp(c)));
        for (;;) {
            int best = INT_MAX;
            size_t at = 0;
            for (size_t i = 0; i + 1 < syms.size(); ++i) {
                auto it = ranks.find(syms[i] + " " + syms[i + 1]);
                if (it != ranks.end() && it->second < best) best = it->second, at = i;
            }
            if (best == INT_MAX) break;
            syms[at] += syms[at + 1];
            syms.erase(syms.begin() + long(at) + 1);
        }
        std::vector<int32_t> ids;
        for (const auto& s : syms) ids.push_back(tok.find_token(s));
        return ids;
    };
    std::mt19937 rng(2024);
    const char* alphabets[] = {"etaoinshrdlu", "abcdefghijklmnopqrstuvwxyzABCDEFGH", "\xe4\xb8\x80\xe4\xba\x8c\xe4\xb8\x89"};
    for (int i = 0; i < 30; ++i) {
        const std::string alpha = alphabets[i % 3];
        const size_t len = (i % 2 == 0) ? 20 + rng() % 200 : 260 + rng() % 300;  // both sides of the 256-byte switch
        std::string word;
        if (i % 3 == 2) {
            while (word.size() < len) word += alpha.substr(3 * (rng() % 3), 3);
        } else {
            while (word.size() < len) word += alpha[rng() % alpha.size()];
        }
        ASSERT_EQ(tok.encode(word), naive(word)) << "word of " << word.size() << " bytes";
    }
}

TEST(TokenizerStream, NeverEmitsPartialCharacters) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    const Tokenizer& tok = *vocab("vocab-qwen3.gguf").tok;
    // spec §7 example 20: the thumbs-up emoji is split over tokens 61804 and 235.
    StreamDecoder sd(tok);
    EXPECT_EQ(sd.push(37523), "emoji");
    EXPECT_EQ(sd.push(61804), " ");
    EXPECT_EQ(sd.pending_bytes(), 3u);
    EXPECT_EQ(sd.push(235), "\xF0\x9F\x91\x8D");
    EXPECT_EQ(sd.flush(), "");

    std::mt19937 rng(77);
    const std::string texts[] = {
        "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd "
        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 \xf0\x9f\x87\xba\xf0\x9f\x87\xb8",
        "<|im_start|>assistant\n\xe6\x95\x8f\xe6\x8d\xb7\xe7\x9a\x84\xe6\xa3\x95\xe8\x89\xb2<|im_end|>",
    };
    std::vector<std::string> all(std::begin(texts), std::end(texts));
    for (int i = 0; i < 300; ++i) all.push_back(random_text(rng, 1 + rng() % 40));
    for (const std::string& text : all) {
        auto ids = tok.encode(text);
        StreamDecoder stream(tok);
        std::string joined;
        for (int32_t id : ids) {
            std::string out = stream.push(id);
            ASSERT_EQ(utf8_sanitize(out), out) << "partial or invalid UTF-8 emitted";
            joined += out;
        }
        joined += stream.flush();
        ASSERT_EQ(joined, tok.decode(ids)) << text;  // the texts are valid UTF-8
    }
}

TEST(TokenizerStream, InvalidBytesBecomeReplacementCharacters) {
    EXPECT_EQ(utf8_complete_prefix("ab\xe4\xbd"), 2u);
    EXPECT_EQ(utf8_complete_prefix("ab\xe4\xbd\xa0"), 5u);
    EXPECT_EQ(utf8_complete_prefix("ab\xf0\x9f\x91"), 2u);
    EXPECT_EQ(utf8_complete_prefix("ab\xe0\x80"), 4u);   // overlong: can never complete
    EXPECT_EQ(utf8_complete_prefix("ab\x80\x80\x80"), 5u);
    EXPECT_EQ(utf8_complete_prefix("\xc3"), 0u);
    EXPECT_EQ(utf8_sanitize("a\xff" "b"), "a\xEF\xBF\xBD" "b");
    EXPECT_EQ(utf8_sanitize("a\xe4\xbd" "b"), "a\xEF\xBF\xBD" "b");  // one U+FFFD per maximal subpart
    EXPECT_EQ(utf8_sanitize("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(utf8_sanitize("\xf0\x9f\x91\x8d"), "\xf0\x9f\x91\x8d");
    if (!test::reference_available()) return;
    const Tokenizer& tok = *vocab("vocab-qwen3.gguf").tok;
    StreamDecoder sd(tok);
    auto ids = tok.encode("x\xe4\xbd");  // truncated character at the end of generation
    std::string out;
    for (int32_t id : ids) out += sd.push(id);
    out += sd.flush();
    EXPECT_EQ(out, "x\xEF\xBF\xBD");
}

TEST(TokenizerConcurrency, ThreadsGetTheSameIds) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    const Tokenizer& tok = *vocab("vocab-qwen35.gguf").tok;
    std::mt19937 rng(3);
    std::vector<std::string> texts;
    for (int i = 0; i < 200; ++i) texts.push_back(random_text(rng, 1 + rng() % 60));
    std::vector<std::vector<int32_t>> expected;
    for (const auto& t : texts) expected.push_back(tok.encode(t));
    std::vector<int> failures(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int rep = 0; rep < 5; ++rep)
                for (size_t i = 0; i < texts.size(); ++i) {
                    size_t k = (i * 7 + size_t(t) * 13 + size_t(rep)) % texts.size();
                    if (tok.encode(texts[k]) != expected[k]) ++failures[size_t(t)];
                }
        });
    for (auto& th : threads) th.join();
    for (int f : failures) EXPECT_EQ(f, 0);
}
