// `qinfer tokenize` end to end: the reference case files through --ids-only
// --file must reproduce the reference .ids files byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "gguf/gguf.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

using namespace qinfer;

namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }

std::string tokenize(const std::string& args, int* rc = nullptr) {
    std::string out;
    int r = test::run_command(q(test::qinfer_binary()) + " tokenize " + args, &out);
    if (rc) *rc = r;
    return out;
}

}  // namespace

TEST(TokenizeCli, ReferenceCasesBothPreTokenizers) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    const std::string cases = q(test::reference_path("tokenize-cases.txt"));
    for (auto [vocab, ids] : {std::pair{"vocab-qwen3.gguf", "tokenize-cases.qwen2.ids"},
                              std::pair{"vocab-qwen35.gguf", "tokenize-cases.qwen35.ids"}}) {
        int rc = -1;
        std::string out = tokenize("-m " + q(test::reference_path(vocab)) + " --ids-only --file " + cases, &rc);
        EXPECT_EQ(rc, 0);
        EXPECT_EQ(out, test::read_text(test::reference_path(ids))) << vocab;
    }
}

TEST(TokenizeCli, TextPiecesAndFlags) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    const std::string m = "-m " + q(test::reference_path("vocab-qwen3.gguf"));
    EXPECT_EQ(tokenize(m + " --ids-only --text 'Hello world'"), "9707 1879\n");
    EXPECT_EQ(tokenize(m + " --ids-only --text '<|im_start|>user'"), "151644 872\n");
    std::string plain = tokenize(m + " --ids-only --no-special --text '<|im_start|>user'");
    EXPECT_EQ(plain.find("151644"), std::string::npos) << plain;
    EXPECT_EQ(tokenize(m + " --ids-only --no-special --text '<think>'"), "151667\n");

    std::string listing = tokenize(m + " --text '<|im_start|>Hello world'");
    EXPECT_NE(listing.find("151644  '<|im_start|>'  [control]"), std::string::npos) << listing;
    EXPECT_NE(listing.find("9707  'Hello'"), std::string::npos) << listing;
    EXPECT_NE(listing.find("1879  ' world'"), std::string::npos) << listing;

    // Escaped vs raw lines.
    const std::string dir = test::temp_dir();
    {
        std::ofstream f(dir + "/lines.txt", std::ios::binary);
        f << "a\\nb\n\nx\\\\y\n";
    }
    const std::string file = q(dir + "/lines.txt");
    std::string escaped = tokenize(m + " --ids-only --file " + file);
    std::string raw = tokenize(m + " --ids-only --raw-lines --file " + file);
    // Line 1 escaped is "a", LF, "b"; raw it is a, backslash, n, b.
    auto gguf = gguf::File::open(test::reference_path("vocab-qwen3.gguf"));
    Tokenizer tok(*gguf);
    auto line = [&](const std::string& text) {
        std::string s;
        for (int32_t id : tok.encode(text)) {
            if (!s.empty()) s += ' ';
            s += std::to_string(id);
        }
        return s + "\n";
    };
    EXPECT_EQ(escaped, line("a\nb") + "\n" + line("x\\y"));
    EXPECT_EQ(raw, line("a\\nb") + "\n" + line("x\\\\y"));
}

TEST(TokenizeCli, ErrorsAreOneLine) {
    int rc = 0;
    std::string out;
    rc = test::run_command(q(test::qinfer_binary()) + " tokenize -m /nonexistent.gguf --text hi", &out, true);
    EXPECT_EQ(rc, 1);
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    if (!test::reference_available()) return;
    out.clear();
    rc = test::run_command(q(test::qinfer_binary()) + " tokenize -m " + q(test::reference_path("vocab-qwen3.gguf")), &out, true);
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find("--text"), std::string::npos) << out;
    out.clear();
    rc = test::run_command(q(test::qinfer_binary()) + " tokenize -m " + q(test::reference_path("vocab-qwen3.gguf")) +
                               " --ids-only --file /nonexistent.txt",
                           &out, true);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("cannot open '/nonexistent.txt'"), std::string::npos) << out;
}
