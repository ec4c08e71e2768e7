// Unicode helpers of the tokenizer: code point classes for the pre-tokenizer
// (spec/tokenizer.md §4.2), UTF-8 decoding that never fails, and the GPT-2
// byte <-> code point alphabet (§3).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qinfer::unicode {

// Class bits of one code point. kValid is set for every decoded position
// (including invalid bytes), so "flags == 0" means "past the end".
enum : uint8_t {
    kValid = 1,
    kLetter = 2,      // \p{L}
    kNumber = 4,      // \p{N}
    kMark = 8,        // \p{M}
    kWhitespace = 16, // \s = Unicode White_Space
};

// Class bits of a code point: general categories and White_Space from the
// compiled-in tables (unicode_tables.inc, Unicode 15.0, generated from utf8proc
// 2.8 by tools/gen_unicode_tables.cpp; llama.cpp's own tables may be newer,
// which only matters for code points assigned since). Anything else --
// punctuation, symbols, controls, format characters, unassigned -- is just
// kValid ("other").
uint8_t cp_flags(uint32_t cp);

// Unicode version of the compiled-in tables, e.g. "15.0.0".
const char* unicode_version();

// NFC (canonical composition) of text into out. Returns false, leaving out
// unspecified, when text is not valid UTF-8: the caller keeps such text as it is.
bool to_nfc(std::string_view text, std::string& out);

// Simple lowercase mapping (for the contraction rule).
uint32_t to_lower(uint32_t cp);

// Stands for one byte that is not part of a valid UTF-8 sequence. It is
// classified like U+FFFD (a symbol), as llama.cpp does.
inline constexpr uint32_t kInvalidByte = 0xFFFFFFFFu;

struct Decoded {
    uint32_t cp;   // code point, or kInvalidByte
    uint32_t len;  // bytes consumed, >= 1
};

// Strict UTF-8 decoding of the sequence starting at s[i] (i < n): overlong
// forms, surrogates and values above U+10FFFF are invalid. An invalid or
// truncated sequence consumes exactly one byte.
inline Decoded decode_utf8(const unsigned char* s, size_t n, size_t i) {
    const unsigned c = s[i];
    if (c < 0x80) return {c, 1};
    if (c < 0xC2) return {kInvalidByte, 1};
    auto cont = [&](size_t k) { return i + k < n && (s[i + k] & 0xC0) == 0x80; };
    if (c < 0xE0) {
        if (!cont(1)) return {kInvalidByte, 1};
        return {((c & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu), 2};
    }
    if (c < 0xF0) {
        if (!cont(1) || !cont(2)) return {kInvalidByte, 1};
        const unsigned c1 = s[i + 1];
        if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F)) return {kInvalidByte, 1};
        return {((c & 0x0Fu) << 12) | ((c1 & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu), 3};
    }
    if (c < 0xF5) {
        if (!cont(1) || !cont(2) || !cont(3)) return {kInvalidByte, 1};
        const unsigned c1 = s[i + 1];
        if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) return {kInvalidByte, 1};
        return {((c & 0x07u) << 18) | ((c1 & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3Fu), 4};
    }
    return {kInvalidByte, 1};
}

// Appends the UTF-8 encoding of a valid code point.
void append_utf8(std::string& out, uint32_t cp);

// GPT-2 byte-level alphabet: byte -> code point, and back (-1 if cp is not in it).
uint32_t byte_to_cp(uint8_t b);
int cp_to_byte(uint32_t cp);

}  // namespace qinfer::unicode
