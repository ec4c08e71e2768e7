// The tokenizer's compiled-in Unicode tables (unicode_tables.inc): golden
// classes and NFC results that hold on every platform, and -- where utf8proc is
// installed (Linux CI) -- a check of every code point against it, the library
// the tables were generated from.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/unicode.h"

#ifdef QINFER_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

using namespace qinfer;

namespace {

std::string utf8(std::initializer_list<uint32_t> cps) {
    std::string s;
    for (uint32_t cp : cps) unicode::append_utf8(s, cp);
    return s;
}

std::string nfc(const std::string& s) {
    std::string out;
    EXPECT_TRUE(unicode::to_nfc(s, out)) << "valid UTF-8 rejected";
    return out;
}

}  // namespace

TEST(UnicodeTables, Version) { EXPECT_STREQ(unicode::unicode_version(), "15.0.0"); }

TEST(UnicodeTables, GoldenClasses) {
    using namespace unicode;
    EXPECT_EQ(cp_flags('a'), kValid | kLetter);
    EXPECT_EQ(cp_flags('7'), kValid | kNumber);
    EXPECT_EQ(cp_flags(' '), kValid | kWhitespace);
    EXPECT_EQ(cp_flags('\n'), kValid | kWhitespace);
    EXPECT_EQ(cp_flags(','), kValid);
    EXPECT_EQ(cp_flags(0x4F60), kValid | kLetter);   // 你 (Lo)
    EXPECT_EQ(cp_flags(0x3000), kValid | kWhitespace);  // ideographic space
    EXPECT_EQ(cp_flags(0x3002), kValid);             // 。 (Po)
    EXPECT_EQ(cp_flags(0x0301), kValid | kMark);     // combining acute (Mn)
    EXPECT_EQ(cp_flags(0x00B2), kValid | kNumber);   // superscript two (No)
    EXPECT_EQ(cp_flags(0x200B), kValid);             // zero width space: not White_Space
    EXPECT_EQ(cp_flags(0x001C), kValid);             // not White_Space (Python's isspace says yes)
    EXPECT_EQ(cp_flags(0x1F600), kValid);            // emoji (So)
    EXPECT_EQ(cp_flags(0x20000), kValid | kLetter);  // CJK extension B
    EXPECT_EQ(cp_flags(0x31350), kValid | kLetter);  // CJK extension H, new in Unicode 15.0
    EXPECT_EQ(cp_flags(0x10FFFF), kValid);           // noncharacter
    EXPECT_EQ(cp_flags(unicode::kInvalidByte), kValid);
    EXPECT_EQ(to_lower('A'), uint32_t('a'));
    EXPECT_EQ(to_lower(0x0130), 0x69u);  // İ -> i (simple mapping)
    EXPECT_EQ(to_lower(0x0410), 0x0430u);  // Cyrillic А
    EXPECT_EQ(to_lower(0x10400), 0x10428u);  // Deseret
    EXPECT_EQ(to_lower(0x4F60), 0x4F60u);
}

TEST(UnicodeTables, GoldenNfc) {
    EXPECT_EQ(nfc("naive cafe"), "naive cafe");
    EXPECT_EQ(nfc(utf8({'e', 0x0301})), utf8({0x00E9}));
    EXPECT_EQ(nfc(utf8({'n', 'a', 'i', 0x0308, 'v', 'e'})), utf8({'n', 'a', 0x00EF, 'v', 'e'}));
    // Marks out of canonical order are reordered, then composed: u + dot below + diaeresis + macron.
    EXPECT_EQ(nfc(utf8({'u', 0x0308, 0x0304})), utf8({0x01D6}));
    EXPECT_EQ(nfc(utf8({'s', 0x0307, 0x0323})), utf8({0x1E69}));
    // A blocked mark stays separate: a + ring + ring -> å + ring.
    EXPECT_EQ(nfc(utf8({'a', 0x030A, 0x030A})), utf8({0x00E5, 0x030A}));
    // Singletons and excluded compositions are decomposed, not recomposed.
    EXPECT_EQ(nfc(utf8({0x212B})), utf8({0x00C5}));            // Angstrom sign -> Å
    EXPECT_EQ(nfc(utf8({0x0958})), utf8({0x0915, 0x093C}));    // Devanagari qa is excluded
    EXPECT_EQ(nfc(utf8({0x0344})), utf8({0x0308, 0x0301}));    // non-starter decomposition
    // Hangul: jamo compose arithmetically (LV, then LVT), syllables stay.
    EXPECT_EQ(nfc(utf8({0x1100, 0x1161})), utf8({0xAC00}));
    EXPECT_EQ(nfc(utf8({0x1100, 0x1161, 0x11A8})), utf8({0xAC01}));
    EXPECT_EQ(nfc(utf8({0xD55C, 0xAE00})), utf8({0xD55C, 0xAE00}));
    EXPECT_EQ(nfc("你好，世界"), "你好，世界");
    // A leading mark has no starter to join.
    EXPECT_EQ(nfc(utf8({0x0301, 'e'})), utf8({0x0301, 'e'}));
    std::string out;
    EXPECT_FALSE(unicode::to_nfc("ab\xFF", out));
    EXPECT_FALSE(unicode::to_nfc("\xED\xA0\x80", out));  // a surrogate
}

#ifdef QINFER_HAVE_UTF8PROC

namespace {

uint8_t utf8proc_flags(uint32_t cp) {
    using namespace unicode;
    uint8_t f = kValid;
    if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
        (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
        cp == 0x3000)
        f |= kWhitespace;
    switch (utf8proc_category(utf8proc_int32_t(cp))) {
        case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: f |= kLetter; break;
        case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO: f |= kNumber; break;
        case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: f |= kMark; break;
        default: break;
    }
    return f;
}

// NFC by utf8proc (the call the tokenizer used to make); "" on failure.
std::string utf8proc_nfc(const std::string& s) {
    utf8proc_uint8_t* out = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                                      &out, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    std::string r = n >= 0 ? std::string(reinterpret_cast<char*>(out), size_t(n)) : std::string();
    std::free(out);
    return r;
}

}  // namespace

TEST(UnicodeTables, UnicodeVersionMatchesUtf8proc) {
    EXPECT_STREQ(unicode::unicode_version(), utf8proc_unicode_version());
}

TEST(UnicodeTables, EveryCodePointMatchesUtf8proc) {
    int bad = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF && bad < 10; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (unicode::cp_flags(cp) != utf8proc_flags(cp)) {
            ADD_FAILURE() << "class of U+" << std::hex << cp;
            ++bad;
        }
        if (unicode::to_lower(cp) != uint32_t(utf8proc_tolower(utf8proc_int32_t(cp)))) {
            ADD_FAILURE() << "lowercase of U+" << std::hex << cp;
            ++bad;
        }
        const std::string s = utf8({cp});
        if (nfc(s) != utf8proc_nfc(s)) {
            ADD_FAILURE() << "NFC of U+" << std::hex << cp;
            ++bad;
        }
    }
}

TEST(UnicodeTables, NfcOfDecomposedTextMatchesUtf8proc) {
    // Each code point's full decomposition, and random mixes of letters, marks
    // of several combining classes, Hangul jamo and composites.
    int bad = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF && bad < 10; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        utf8proc_uint8_t* d = nullptr;
        const std::string s = utf8({cp});
        utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                                          &d, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
        ASSERT_GE(n, 0);
        const std::string decomposed(reinterpret_cast<char*>(d), size_t(n));
        std::free(d);
        if (nfc(decomposed) != utf8proc_nfc(decomposed)) {
            ADD_FAILURE() << "NFC of the decomposition of U+" << std::hex << cp;
            ++bad;
        }
    }
    const uint32_t pool[] = {'a', 'e', 'o', 'u', 'A', 'S', 's', 0x3B1, 0x3C9, 0x0300, 0x0301, 0x0304, 0x0308, 0x030A,
                             0x0323, 0x0327, 0x0345, 0x0313, 0x05B4, 0x093C, 0x0B47, 0x0B3E, 0x1100, 0x1161, 0x11A8,
                             0xAC00, 0x00E9, 0x1E63, 0x0F71, 0x0F72, 0x0F80, 0x4F60, 0x1D158, 0x1D165, 0x1D16E};
    std::mt19937 rng(7);
    for (int t = 0; t < 20000 && bad < 10; ++t) {
        std::string s;
        const int len = 1 + int(rng() % 8);
        for (int i = 0; i < len; ++i) unicode::append_utf8(s, pool[rng() % std::size(pool)]);
        if (nfc(s) != utf8proc_nfc(s)) {
            ADD_FAILURE() << "NFC of a random sequence, case " << t;
            ++bad;
        }
    }
}

#endif  // QINFER_HAVE_UTF8PROC
