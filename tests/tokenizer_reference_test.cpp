// Exactness against the reference ids produced by llama.cpp
// (tokenize-cases.txt with vocab-qwen3.gguf / vocab-qwen35.gguf), the worked
// examples of spec/tokenizer.md §7, and the special-token bookkeeping of
// MANIFEST.md §1.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <sstream>

#include "common/error.h"
#include "gguf/gguf.h"
#include "testutil.h"
#include "tokenizer/escape.h"
#include "tokenizer/tokenizer.h"

using namespace qinfer;

namespace {

std::vector<int32_t> parse_ids(const std::string& line) {
    std::vector<int32_t> ids;
    std::istringstream in(line);
    int64_t v;
    while (in >> v) ids.push_back(int32_t(v));
    return ids;
}

std::string show(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) {
        if (!s.empty()) s += ' ';
        s += std::to_string(id);
    }
    return s;
}

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

void check_reference(const std::string& vocab_name, const std::string& ids_name) {
    const Tokenizer& tok = *vocab(vocab_name).tok;
    auto cases = split_case_lines(test::read_text(test::reference_path("tokenize-cases.txt")), true);
    auto expected = split_case_lines(test::read_text(test::reference_path(ids_name)), false);
    ASSERT_EQ(cases.size(), 65u);
    ASSERT_EQ(expected.size(), cases.size());
    int mismatches = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        auto got = tok.encode(cases[i], true);
        if (show(got) != show(parse_ids(expected[i]))) {
            ++mismatches;
            ADD_FAILURE() << ids_name << " line " << i + 1 << "\n  got:      " << show(got)
                          << "\n  expected: " << expected[i];
        }
        // Whatever the ids, the text comes back (specials shown).
        EXPECT_EQ(tok.decode(got, true), cases[i]) << "line " << i + 1;
    }
    EXPECT_EQ(mismatches, 0);
}

}  // namespace

TEST(TokenizerReference, AllCasesQwen2) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    check_reference("vocab-qwen3.gguf", "tokenize-cases.qwen2.ids");
}

TEST(TokenizerReference, AllCasesQwen35) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    check_reference("vocab-qwen35.gguf", "tokenize-cases.qwen35.ids");
}
