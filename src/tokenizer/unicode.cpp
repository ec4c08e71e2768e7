#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <utility>
#include <memory>
#include <vector>

namespace qinfer::unicode {
namespace {

// Generated from the Unicode data (tools/gen_unicode_tables.cpp): class runs,
// combining classes, simple lowercase, canonical decompositions/compositions.
#include "tokenizer/unicode_tables.inc"

// Value of the run that contains cp in a (start | value << 24) run table.
template <size_t N>
unsigned run_value(const uint32_t (&runs)[N], uint32_t cp) {
    const uint32_t* it = std::upper_bound(runs, runs + N, cp,
                                          [](uint32_t c, uint32_t run) { return c < (run & 0xFFFFFFu); });
    return it == runs ? 0u : (it[-1] >> 24);
}

// kWhitespace is Unicode White_Space (PropList.txt), the set llama.cpp and
// Oniguruma use for \s: not U+200B, U+FEFF, U+180E, and not U+001C..U+001F
// (Python's isspace differs). The other bits are general categories L*, N*, M*.
uint8_t compute_flags(uint32_t cp) { return uint8_t(kValid | run_value(kClassRuns, cp)); }

// The Basic Multilingual Plane covers nearly all text; a 64 KiB table built
// once keeps the pre-tokenizer's inner loop free of binary searches.
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
    const auto* end = kLowercase + std::size(kLowercase);
    const auto* it = std::lower_bound(kLowercase, end, cp, [](const uint32_t(&e)[2], uint32_t c) { return e[0] < c; });
    return it != end && (*it)[0] == cp ? (*it)[1] : cp;
}

// ---------------------------------------------------------------- NFC
// Canonical decomposition, canonical ordering, canonical composition (UAX #15),
// with Hangul syllables done arithmetically as the standard describes.
namespace {

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

unsigned combining_class(uint32_t cp) { return cp < 0x300 ? 0u : run_value(kCombiningClassRuns, cp); }

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
    if (cp - kSBase < kSCount) {
        const uint32_t s = cp - kSBase;
        out.push_back(kLBase + s / kNCount);
        out.push_back(kVBase + (s % kNCount) / kTCount);
        if (s % kTCount) out.push_back(kTBase + s % kTCount);
        return;
    }
    const auto* end = kDecompositions + std::size(kDecompositions);
    const auto* it = std::lower_bound(kDecompositions, end, cp, [](const uint32_t(&e)[2], uint32_t c) { return e[0] < c; });
    if (it == end || (*it)[0] != cp) {
        out.push_back(cp);
        return;
    }
    const uint32_t off = (*it)[1] & 0xFFFFFFu, len = (*it)[1] >> 24;
    out.insert(out.end(), kDecompositionData + off, kDecompositionData + off + len);
}

// The primary composite of <first, second>, or 0 if there is none.
uint32_t compose(uint32_t first, uint32_t second) {
    if (first - kLBase < kLCount && second - kVBase < kVCount)
        return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
    if (first - kSBase < kSCount && (first - kSBase) % kTCount == 0 && second - kTBase - 1 < kTCount - 1)
        return first + (second - kTBase);
    const auto* end = kCompositions + std::size(kCompositions);
    const auto* it = std::lower_bound(kCompositions, end, std::make_pair(first, second),
                                      [](const uint32_t(&e)[3], std::pair<uint32_t, uint32_t> k) {
                                          return e[0] != k.first ? e[0] < k.first : e[1] < k.second;
                                      });
    return it != end && (*it)[0] == first && (*it)[1] == second ? (*it)[2] : 0;
}

}  // namespace

bool to_nfc(std::string_view text, std::string& out) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    std::vector<uint32_t> cps;
    cps.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        const Decoded d = decode_utf8(s, text.size(), i);
        if (d.cp == kInvalidByte) return false;
        decompose(d.cp, cps);
        i += d.len;
    }
    // Canonical ordering: stable sort of each run of non-starters by combining class.
    std::vector<uint8_t> ccc(cps.size());
    for (size_t i = 0; i < cps.size(); ++i) ccc[i] = uint8_t(combining_class(cps[i]));
    for (size_t i = 1; i < cps.size(); ++i) {
        for (size_t j = i; j > 0 && ccc[j] != 0 && ccc[j - 1] > ccc[j]; --j) {
            std::swap(cps[j], cps[j - 1]);
            std::swap(ccc[j], ccc[j - 1]);
        }
    }
    // Composition: each code point joins the last starter unless a code point of
    // the same or a zero class stands between them (it is "blocked").
    size_t n = 0, starter = SIZE_MAX;
    for (size_t i = 0; i < cps.size(); ++i) {
        const uint8_t c = ccc[i];
        if (starter != SIZE_MAX && (n - 1 == starter || ccc[n - 1] < c)) {
            if (const uint32_t p = compose(cps[starter], cps[i])) {
                cps[starter] = p;
                continue;
            }
        }
        if (c == 0) starter = n;
        cps[n] = cps[i];
        ccc[n] = c;
        ++n;
    }
    out.clear();
    out.reserve(text.size());
    for (size_t i = 0; i < n; ++i) append_utf8(out, cps[i]);
    return true;
}

const char* unicode_version() { return kUnicodeVersion; }

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
