// Pre-tokenizer of the Qwen byte-level BPE (spec/tokenizer.md §4): splits a
// text fragment into the pieces that BPE merges independently. Implemented as
// the deterministic scanner of §4.4 (what llama.cpp runs), not a regex engine.
#pragma once
#include <cstddef>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace qinfer {

// Appends the end offset (in bytes, relative to `text`) of every piece to
// `ends`; pieces are contiguous, so piece k is [ends[k-1], ends[k]).
// Invalid UTF-8 bytes are pieces' ordinary members (classified like U+FFFD);
// every byte of `text` ends up in exactly one piece. Linear in text size.
void pretokenize(PreTokenizer pre, std::string_view text, std::vector<size_t>& ends);

}  // namespace qinfer
