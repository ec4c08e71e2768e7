// Pre-tokenizer pieces of the worked examples in spec/tokenizer.md §7, plus
// linear-time and coverage properties of the scanner.
#include <gtest/gtest.h>

#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

using namespace qinfer;

namespace {

std::vector<std::string> pieces(PreTokenizer pre, const std::string& text) {
    std::vector<size_t> ends;
    pretokenize(pre, text, ends);
    std::vector<std::string> out;
    size_t begin = 0;
    for (size_t e : ends) {
        out.push_back(text.substr(begin, e - begin));
        begin = e;
    }
    return out;
}

using P = std::vector<std::string>;

struct Example {
    const char* text;
    P expected;
};

// Examples where qwen2 and qwen35 agree.
const Example kCommon[] = {
    {"Hello world", {"Hello", " world"}},
    {"Hello, world!", {"Hello", ",", " world", "!"}},
    {"I'm sure you're right, he'll say it's FINE.",
     {"I", "'m", " sure", " you", "'re", " right", ",", " he", "'ll", " say", " it", "'s", " FINE", "."}},
    {"DON'T SHOUT, I'VE HEARD", {"DON", "'T", " SHOUT", ",", " I", "'VE", " HEARD"}},
    {"O'Neil's dog", {"O", "'Neil", "'s", " dog"}},
    {"year 2024: 12345 items",
     {"year", " ", "2", "0", "2", "4", ":", " ", "1", "2", "3", "4", "5", " items"}},
    {"pi = 3.14159", {"pi", " =", " ", "3", ".", "1", "4", "1", "5", "9"}},
    {"  leading spaces", {" ", " leading", " spaces"}},
    {"trailing spaces   ", {"trailing", " spaces", "   "}},
    {"a  b   c", {"a", " ", " b", "  ", " c"}},
    {"line1\nline2\n\nline3", {"line", "1", "\n", "line", "2", "\n\n", "line", "3"}},
    {"end.\n\n\nNext", {"end", ".\n\n\n", "Next"}},
    {"x\r\ny", {"x", "\r\n", "y"}},
    {"tab\there\t\tand", {"tab", "\there", "\t", "\tand"}},
    {"  \n  x", {"  \n", " ", " x"}},
    {"foo_bar(baz) -> qux;", {"foo", "_bar", "(baz", ")", " ->", " qux", ";"}},
    {"if (a>=b) { return -1; }", {"if", " (", "a", ">=", "b", ")", " {", " return", " -", "1", ";", " }"}},
    {"https://example.com/a?b=c&d=e", {"https", "://", "example", ".com", "/a", "?b", "=c", "&d", "=e"}},
    {"\u4f60\u597d\uff0c\u4e16\u754c\uff01", {"\u4f60\u597d", "\uff0c\u4e16\u754c", "\uff01"}},
    {"emoji \U0001F44D\U0001F3FD test \U0001F680!", {"emoji", " \U0001F44D\U0001F3FD", " test", " \U0001F680!"}},
    {"$100.00 -- 50%", {"$", "1", "0", "0", ".", "0", "0", " --", " ", "5", "0", "%"}},
    {"'quoted' and \"double\"", {"'quoted", "'", " and", " \"", "double", "\""}},
    {"abc123def", {"abc", "1", "2", "3", "def"}},
    {"...!!!???", {"...!!!???"}},
    {"x\u00A0y", {"x", "\u00A0y"}},
    {"\u3053\u3093\u306b\u3061\u306f\u4e16\u754c", {"\u3053\u3093\u306b\u3061\u306f\u4e16\u754c"}},
    {"\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440", {"\u041f\u0440\u0438\u0432\u0435\u0442", ",", " \u043c\u0438\u0440"}},
    // Not in the spec table; follow from §4.3/§4.4.
    {"", {}},
    {"'", {"'"}},
    {"'sun", {"'s", "un"}},
    {"it\xe2\x80\x99s", {"it", "\xe2\x80\x99s"}},  // U+2019 is no contraction apostrophe
    {"\xe2\x85\xab\xc2\xb2", {"\xe2\x85\xab", "\xc2\xb2"}},  // Roman numeral and superscript are numbers
    {"a\xe2\x80\x8b" "b", {"a", "\xe2\x80\x8b" "b"}},  // ZWSP is not whitespace: it prefixes the word
    {"a \xef\xbb\xbf" "b", {"a", " \xef\xbb\xbf", "b"}},  // U+FEFF is "other", not \s
    {"x   ", {"x", "   "}},
    {"x \n", {"x", " \n"}},
    {"\r\n\r\n  ", {"\r\n\r\n", "  "}},
};

}  // namespace

TEST(TokenizerPretokenize, SpecExamplesBothPreTokenizers) {
    for (PreTokenizer pre : {PreTokenizer::Qwen2, PreTokenizer::Qwen35})
        for (const Example& ex : kCommon) EXPECT_EQ(pieces(pre, ex.text), ex.expected) << "text: " << ex.text;
}

TEST(TokenizerPretokenize, CombiningMarksDifferBetweenPreTokenizers) {
    // spec §7 examples 26 and 27
    const std::string naive = "nai\u0308ve cafe\u0301";
    EXPECT_EQ(pieces(PreTokenizer::Qwen2, naive), (P{"nai", "\u0308ve", " cafe", "\u0301"}));
    EXPECT_EQ(pieces(PreTokenizer::Qwen35, naive), (P{"nai\u0308ve", " cafe\u0301"}));
    const std::string hindi = "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e";
    EXPECT_EQ(pieces(PreTokenizer::Qwen2, hindi),
              (P{"\u0928\u092e\u0938", "\u094d\u0924", "\u0947", " \u0926", "\u0941\u0928", "\u093f\u092f", "\u093e"}));
    EXPECT_EQ(pieces(PreTokenizer::Qwen35, hindi),
              (P{"\u0928\u092e\u0938\u094d\u0924\u0947", " \u0926\u0941\u0928\u093f\u092f\u093e"}));
}

TEST(TokenizerPretokenize, InvalidBytesActLikeSymbols) {
    // Each invalid byte is one "other" character: it joins punctuation runs
    // and prefixes words like U+FFFD would, and its bytes stay unchanged.
    EXPECT_EQ(pieces(PreTokenizer::Qwen2, "a\xff" "b"), (P{"a", "\xff" "b"}));
    EXPECT_EQ(pieces(PreTokenizer::Qwen2, "!\xff\xfe?"), (P{"!\xff\xfe?"}));
    EXPECT_EQ(pieces(PreTokenizer::Qwen2, "x \xe4\xbd"), (P{"x", " \xe4\xbd"}));
    EXPECT_EQ(pieces(PreTokenizer::Qwen2, "\xc0\x80" "1"), (P{"\xc0\x80", "1"}));
}

TEST(TokenizerPretokenize, RandomBytesCoverEveryByteOnce) {
    std::mt19937 rng(7);
    for (int iter = 0; iter < 2000; ++iter) {
        std::string s(rng() % 40, '\0');
        for (char& c : s) c = char(rng() % 4 == 0 ? " \n\r\t'a1"[rng() % 7] : rng());
        for (PreTokenizer pre : {PreTokenizer::Qwen2, PreTokenizer::Qwen35}) {
            std::vector<size_t> ends;
            pretokenize(pre, s, ends);
            size_t prev = 0;
            for (size_t e : ends) {
                ASSERT_GT(e, prev);
                prev = e;
            }
            ASSERT_EQ(prev, s.size());
        }
    }
}

TEST(TokenizerPretokenize, LinearOnLongRuns) {
    // Long runs of one class are where a careless scanner goes quadratic.
    const size_t n = 1 << 20;
    const std::string runs[] = {std::string(n, 'a'), std::string(n, ' '), std::string(n, '!'),
                                std::string(n, '\n'), std::string(n / 2, ' ') + "\n" + std::string(n / 2, ' ') + "x",
                                std::string(n, '7')};
    for (const std::string& s : runs) {
        const std::clock_t c0 = std::clock();  // CPU time: robust on a busy machine
        std::vector<size_t> ends;
        pretokenize(PreTokenizer::Qwen2, s, ends);
        const double sec = double(std::clock() - c0) / CLOCKS_PER_SEC;
        EXPECT_LT(sec, 5.0) << "run of '" << int(s.back()) << "'";
        EXPECT_EQ(ends.back(), s.size());
    }
}
