#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <array>
#include <memory>

namespace qinfer::unicode {
namespace {

bool is_white_space(uint32_t cp) {
    // Unicode White_Space (PropList.txt), the set llama.cpp and Oniguruma use for \s.
    // Not U+200B, U+FEFF, U+180E, and not U+001C..U+001F (Python's isspace differs).
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

uint8_t compute_flags(uint32_t cp) {
    uint8_t f = kValid;
    if (is_white_space(cp)) f |= kWhitespace;
    switch (utf8proc_category(utf8proc_int32_t(cp))) {
        case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
            f |= kLetter;
            break;
        case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
            f |= kNumber;
            break;
        case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
            f |= kMark;
            break;
        default:
            break;
    }
    return f;
}

// The Basic Multilingual Plane covers nearly all text; a 64 KiB table built
// once keeps the pre-tokenizer's inner loop free of utf8proc calls.
const std::array<uint8_t, 0x10000>& bmp_table() {
    static const std::unique_ptr<std::array<uint8_t, 0x10000>> table = [] {
        auto t = std::make_unique<std::array<uint8_t, 0x10000>>();
        for (uint32_t cp = 0; cp < 0x10000; ++cp) (*t)[cp] = compute_flags(cp);
        return t;
    }();
    return *table;
}

struct ByteTables {
    uint32_t to_cp[256];
    int16_t from_cp[0x144];
};

constexpr ByteTables make_byte_tables() {
    ByteTables bt{};
    for (auto& v : bt.from_cp) v = -1;
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        bt.to_cp[b] = printable ? uint32_t(b) : next++;
        bt.from_cp[bt.to_cp[b]] = int16_t(b);
    }
    return bt;
}

constexpr ByteTables kByteTables = make_byte_tables();

}  // namespace

uint8_t cp_flags(uint32_t cp) {
    if (cp < 0x10000) return bmp_table()[cp];
    if (cp == kInvalidByte) return kValid;  // like U+FFFD: a symbol
    if (cp > 0x10FFFF) return kValid;
    return compute_flags(cp);
}

uint32_t to_lower(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    if (cp > 0x10FFFF) return cp;
    return uint32_t(utf8proc_tolower(utf8proc_int32_t(cp)));
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

uint32_t byte_to_cp(uint8_t b) { return kByteTables.to_cp[b]; }

int cp_to_byte(uint32_t cp) { return cp < 0x144 ? kByteTables.from_cp[cp] : -1; }

}  // namespace qinfer::unicode
