// Vocabulary loading: special ids, token types and the EOG set of the real
// files (MANIFEST.md §1, §3), load errors on synthetic GGUF files, load time,
// and the merge-rank semantics on a hand-made vocabulary.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "gguf/gguf.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace qinfer;

namespace {

// Minimal GGUF v3 writer for metadata-only files.
class GgufBuilder {
public:
    void str(const std::string& key, const std::string& v) {
        begin(key, 8);
        put_str(v);
    }
    void u32(const std::string& key, uint32_t v) {
        begin(key, 4);
        put(v);
    }
    void boolean(const std::string& key, bool v) {
        begin(key, 7);
        kv_.push_back(char(v));
    }
    void str_array(const std::string& key, const std::vector<std::string>& v) {
        begin(key, 9);
        put(uint32_t(8));
        put(uint64_t(v.size()));
        for (const auto& s : v) put_str(s);
    }
    void i32_array(const std::string& key, const std::vector<int32_t>& v) {
        begin(key, 9);
        put(uint32_t(5));
        put(uint64_t(v.size()));
        for (int32_t x : v) put(x);
    }
    std::vector<uint8_t> bytes() const {
        std::string out = "GGUF";
        auto app = [&](auto x) { out.append(reinterpret_cast<const char*>(&x), sizeof x); };
        app(uint32_t(3));
        app(uint64_t(0));
        app(uint64_t(n_));
        out += kv_;
        while (out.size() % 32) out += '\0';
        return std::vector<uint8_t>(out.begin(), out.end());
    }

private:
    template <class T>
    void put(T x) {
        kv_.append(reinterpret_cast<const char*>(&x), sizeof x);
    }
    void put_str(const std::string& s) {
        put(uint64_t(s.size()));
        kv_ += s;
    }
    void begin(const std::string& key, uint32_t type) {
        put_str(key);
        put(type);
        ++n_;
    }
    std::string kv_;
    uint64_t n_ = 0;
};

std::string enc(const std::string& bytes) {  // byte-level alphabet
    std::string s;
    for (unsigned char c : bytes) unicode::append_utf8(s, unicode::byte_to_cp(c));
    return s;
}

// 256 byte tokens, then "ab", "abc", " a" (byte-level "Ġa"), then specials.
struct MiniVocab {
    std::string model = "gpt2", pre = "qwen2";
    bool with_pre = true, with_merges = true, with_types = true;
    int32_t eos = 259;
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<std::string> merges = {"a b", "ab c", enc(" ") + " a", "a b"};  // duplicate pair: rank 0 stays
    MiniVocab() {
        for (int b = 0; b < 256; ++b) tokens.push_back(enc(std::string(1, char(b))));
        tokens.push_back("ab");                // 256
        tokens.push_back("abc");               // 257
        tokens.push_back(enc(" ") + "a");      // 258
        tokens.push_back("<|im_end|>");        // 259 control
        tokens.push_back("<think>");           // 260 user defined
        tokens.push_back("[PAD261]");          // 261 unused
        tokens.push_back("<|im_end|>x");       // 262 normal token that looks special: plain BPE only
        types.assign(tokens.size(), 1);
        types[259] = 3;
        types[260] = 4;
        types[261] = 5;
    }
    std::vector<uint8_t> build() const {
        GgufBuilder b;
        b.str("general.architecture", "qwen3");
        b.str("tokenizer.ggml.model", model);
        if (with_pre) b.str("tokenizer.ggml.pre", pre);
        b.str_array("tokenizer.ggml.tokens", tokens);
        if (with_types) b.i32_array("tokenizer.ggml.token_type", types);
        if (with_merges) b.str_array("tokenizer.ggml.merges", merges);
        b.u32("tokenizer.ggml.eos_token_id", uint32_t(eos));
        b.boolean("tokenizer.ggml.add_bos_token", false);
        return b.bytes();
    }
};

std::unique_ptr<Tokenizer> load(const MiniVocab& mv) {
    auto bytes = mv.build();
    auto f = gguf::File::parse_memory(bytes.data(), bytes.size(), "mini.gguf");
    return std::make_unique<Tokenizer>(*f);  // the tokenizer must not need the file afterwards
}

std::string load_error(const MiniVocab& mv) {
    try {
        load(mv);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(TokenizerVocab, MiniVocabMergesByRank) {
    auto tok = load(MiniVocab());
    EXPECT_EQ(tok->n_vocab(), 263);
    // " abc": pairs (Ġ,a)=2, (a,b)=0 -> "ab" first, then (ab,c)=1; (Ġ,ab) is no merge.
    EXPECT_EQ(tok->encode(" abc"), (std::vector<int32_t>{32, 257}));
    EXPECT_EQ(tok->encode(" ab"), (std::vector<int32_t>{32, 256}));
    EXPECT_EQ(tok->encode(" a"), (std::vector<int32_t>{258}));
    EXPECT_EQ(tok->encode("abcabc"), (std::vector<int32_t>{257, 257}));
    // Specials: control only with parse_special, user-defined always.
    EXPECT_EQ(tok->encode("<|im_end|><think>"), (std::vector<int32_t>{259, 260}));
    auto plain = tok->encode("<|im_end|><think>", false);
    ASSERT_GT(plain.size(), 2u);
    EXPECT_EQ(plain.back(), 260);
    EXPECT_EQ(tok->decode(plain), "<|im_end|><think>");
    EXPECT_EQ(tok->decode({259, 260, 261, 97}), "<think>a");
    EXPECT_EQ(tok->decode({259, 260, 261, 97}, true), "<|im_end|><think>a");
    EXPECT_EQ(tok->token_type(261), TokenType::Unused);
    EXPECT_EQ(tok->token_type(262), TokenType::Normal);
    EXPECT_EQ(tok->eos_id(), 259);
    EXPECT_TRUE(tok->is_eog(259));
    EXPECT_EQ(tok->eog_ids(), (std::vector<int32_t>{259}));
    EXPECT_EQ(tok->find_token("abc"), 257);
    EXPECT_EQ(tok->find_token("abcd"), Tokenizer::kNoToken);
    EXPECT_EQ(tok->bos_id(), Tokenizer::kNoToken);
    EXPECT_THROW(tok->decode({263}), Error);
    EXPECT_THROW(tok->decode({-1}), Error);
}

TEST(TokenizerVocab, DuplicateTextsUseTheLastId) {
    // llama.cpp's text->id map keeps the last id of a repeated text; merge
    // results and lookups must agree with it.
    MiniVocab mv;
    mv.tokens.push_back("ab");  // 263 repeats 256
    mv.types.push_back(1);
    auto tok = load(mv);
    EXPECT_EQ(tok->find_token("ab"), 263);
    EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{263}));
    EXPECT_EQ(tok->encode(" abc"), (std::vector<int32_t>{32, 257}));
    EXPECT_EQ(tok->decode({256, 263}), "abab");
}

TEST(TokenizerVocab, LoadErrorsAreClear) {
    MiniVocab mv;
    mv.pre = "llama-bpe";
    EXPECT_NE(load_error(mv).find("unknown pre-tokenizer 'llama-bpe'"), std::string::npos) << load_error(mv);
    mv = MiniVocab();
    mv.with_pre = false;
    EXPECT_NE(load_error(mv).find("missing tokenizer.ggml.pre"), std::string::npos) << load_error(mv);
    mv = MiniVocab();
    mv.model = "llama";
    EXPECT_NE(load_error(mv).find("unsupported tokenizer model 'llama'"), std::string::npos) << load_error(mv);
    mv = MiniVocab();
    mv.with_merges = false;
    EXPECT_NE(load_error(mv).find("missing tokenizer.ggml.merges"), std::string::npos) << load_error(mv);
    mv = MiniVocab();
    mv.types.resize(100);
    EXPECT_NE(load_error(mv).find("token_type has 100 entries"), std::string::npos) << load_error(mv);
    for (const char* pre : {"qwen2", "qwen35", "deepseek-r1-qwen"}) {
        mv = MiniVocab();
        mv.pre = pre;
        EXPECT_EQ(load_error(mv), "") << pre;
    }
    // Every message names the file.
    mv = MiniVocab();
    mv.pre = "gpt-4o";
    EXPECT_NE(load_error(mv).find("mini.gguf"), std::string::npos);
}

TEST(TokenizerVocab, OutOfRangeSpecialIdIsIgnoredWithWarning) {
    MiniVocab mv;
    mv.eos = 100000;
    auto tok = load(mv);
    EXPECT_EQ(tok->eos_id(), Tokenizer::kNoToken);
    bool warned = false;
    for (const auto& w : tok->warnings()) warned |= w.find("eos_token_id") != std::string::npos;
    EXPECT_TRUE(warned);
    EXPECT_TRUE(tok->is_eog(259));  // still EOG by its text
}

TEST(TokenizerVocab, Qwen3VocabSpecials) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    for (const char* name : {"vocab-qwen3.gguf", "vocab-qwen35.gguf"}) {
        auto f = gguf::File::open(test::reference_path(name));
        auto t0 = std::chrono::steady_clock::now();
        Tokenizer tok(*f);
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        std::printf("%s: tokenizer built in %.1f ms\n", name, ms);
        EXPECT_LT(ms, 2000.0);  // tens of ms in Release; generous for sanitizer builds
        EXPECT_EQ(tok.n_vocab(), 151936);
        EXPECT_EQ(tok.n_merges(), 151387);
        EXPECT_EQ(tok.pre_tokenizer(), std::string(name) == "vocab-qwen3.gguf" ? PreTokenizer::Qwen2 : PreTokenizer::Qwen35);
        EXPECT_EQ(tok.bos_id(), 151643);
        EXPECT_EQ(tok.eos_id(), 151645);
        EXPECT_EQ(tok.eot_id(), 151645);
        EXPECT_EQ(tok.pad_id(), 151643);
        EXPECT_FALSE(tok.add_bos());
        // MANIFEST §1: llama.cpp's EOG set, including "</s>" (128247).
        EXPECT_EQ(tok.eog_ids(), (std::vector<int32_t>{128247, 151643, 151645, 151662, 151663, 151664}));
        EXPECT_TRUE(tok.is_eog(151645));
        EXPECT_FALSE(tok.is_eog(151644));
        EXPECT_FALSE(tok.is_eog(-1));
        EXPECT_EQ(tok.token_type(128247), TokenType::Control);
        EXPECT_EQ(tok.token_type(151644), TokenType::Control);
        EXPECT_EQ(tok.token_type(151667), TokenType::UserDefined);
        EXPECT_EQ(tok.token_type(151700), TokenType::Unused);
        EXPECT_EQ(tok.token_type(1879), TokenType::Normal);
        EXPECT_EQ(tok.find_token("<|im_start|>"), 151644);
        EXPECT_EQ(tok.find_token("<think>"), 151667);
        EXPECT_EQ(tok.token_text(1879), "\xc4\xa0world");  // "Ġworld"
        EXPECT_EQ(tok.token_bytes(1879), " world");
        EXPECT_EQ(tok.token_bytes(151645), "<|im_end|>");
        EXPECT_EQ(tok.token_bytes(151700), "");
        // Detokenizer visibility (spec §8).
        EXPECT_EQ(tok.decode({151644, 872, 198, 151667, 151645, 151700}), "user\n<think>");
        EXPECT_EQ(tok.decode({151644, 872, 198, 151667, 151645, 151700}, true), "<|im_start|>user\n<think><|im_end|>");
        EXPECT_TRUE(tok.warnings().size() >= 1);  // "</s>" forced to control
    }
}

TEST(TokenizerVocab, TinyModelEogSet) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    // MANIFEST §3: the tiny models keep 8192 BPE tokens and renumber the specials.
    for (const char* name : {"tiny-qwen3.q4_k_m.gguf", "tiny-qwen35.q8_0.gguf", "tiny-qwen2.q8_0.gguf"}) {
        auto f = gguf::File::open(test::reference_path(name));
        Tokenizer tok(*f);
        EXPECT_EQ(tok.n_vocab(), 8218) << name;
        EXPECT_EQ(tok.eog_ids(), (std::vector<int32_t>{8192, 8194, 8211, 8212, 8213})) << name;
        EXPECT_EQ(tok.encode("<|im_start|>user\nHi<|im_end|>").front(), 8193) << name;
        EXPECT_EQ(tok.encode("<think>", false), (std::vector<int32_t>{8216})) << name;
        // The 7-token prompt of the *.s7.json logits references ("Hello" = 9707
        // is not in the truncated vocabulary, so it is "H" + "ello").
        EXPECT_EQ(tok.encode("<|im_start|>user\nHello world<|im_end|>"),
                  (std::vector<int32_t>{8193, 872, 198, 39, 4791, 1879, 8194})) << name;
    }
}

TEST(TokenizerVocab, SpecWorkedExamples) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    auto f = gguf::File::open(test::reference_path("vocab-qwen3.gguf"));
    Tokenizer tok(*f);
    struct Ex {
        const char* text;
        std::vector<int32_t> ids;
        bool special;
    };
    const Ex examples[] = {
        {"Hello world", {9707, 1879}, true},
        {"Hello, world!", {9707, 11, 1879, 0}, true},
        {"I'm sure you're right, he'll say it's FINE.",
         {40, 2776, 2704, 498, 2299, 1290, 11, 566, 3278, 1977, 432, 594, 434, 3981, 13}, true},
        {"year 2024: 12345 items", {3157, 220, 17, 15, 17, 19, 25, 220, 16, 17, 18, 19, 20, 3589}, true},
        {"  leading spaces", {220, 6388, 12621}, true},
        {"line1\nline2\n\nline3", {1056, 16, 198, 1056, 17, 271, 1056, 18}, true},
        {"end.\n\n\nNext", {408, 4192, 5847}, true},
        {"\u4f60\u597d\uff0c\u4e16\u754c\uff01", {108386, 3837, 99489, 6313}, true},
        {"emoji \U0001F44D\U0001F3FD test \U0001F680!", {37523, 61804, 235, 145375, 1273, 11162, 248, 222, 0}, true},
        {"<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
         {151644, 872, 198, 13048, 0, 151645, 198, 151644, 77091, 198}, true},
        {"<think>\n\n</think>\n\n", {151667, 271, 151668, 271}, false},
    };
    for (const Ex& ex : examples) EXPECT_EQ(tok.encode(ex.text, ex.special), ex.ids) << ex.text;
    // With parse_special off, control tokens are plain text.
    auto plain = tok.encode("<|im_start|>user", false);
    for (int32_t id : plain) EXPECT_LT(id, 151643);
    EXPECT_EQ(tok.decode(plain), "<|im_start|>user");
    // "</s>" is a control token in llama.cpp's view (MANIFEST §1, case 65) ...
    EXPECT_EQ(tok.encode("</s>"), (std::vector<int32_t>{128247}));
    // ... and so plain text when special parsing is off.
    EXPECT_NE(tok.encode("</s>", false), (std::vector<int32_t>{128247}));
}

TEST(TokenizerVocab, NfcOptionMatchesHuggingFace) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    auto f = gguf::File::open(test::reference_path("vocab-qwen3.gguf"));
    TokenizerOptions opts;
    opts.nfc = true;
    Tokenizer hf(*f, opts);
    Tokenizer llama(*f);
    // spec §7 example 26: NFC first gives "naïve café" = 3376 37572 586 51950.
    const std::string decomposed = "nai\u0308ve cafe\u0301";
    EXPECT_EQ(hf.encode(decomposed), (std::vector<int32_t>{3376, 37572, 586, 51950}));
    EXPECT_NE(llama.encode(decomposed), hf.encode(decomposed));
    EXPECT_EQ(hf.encode("\xff" "abc"), llama.encode("\xff" "abc"));  // invalid UTF-8: left as is
}
