// BPE merge step of the byte-level tokenizer (spec/tokenizer.md §6), working
// on symbol ids instead of strings: a piece starts as one symbol per byte and
// the adjacent pair with the lowest merge rank (leftmost on ties) is merged
// until no pair is in the merge table.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qinfer {

// Open-addressing map from a text (stored elsewhere) to an int32 id.
// Lookups compare against the stored texts through `text_of`.
class TextIndex {
public:
    void reserve(size_t n);
    // Inserts or overwrites (the last id wins, as in llama.cpp's text->id map).
    template <class TextOf>
    void put(std::string_view text, int32_t id, const TextOf& text_of);
    template <class TextOf>
    int32_t get(std::string_view text, const TextOf& text_of) const;  // -1 if absent
    static uint64_t hash(std::string_view s);

private:
    std::vector<int32_t> slots_;  // -1 = empty
    size_t mask_ = 0;
};

class BpeMerges {
public:
    // `byte_symbols[b]` is the symbol of the single byte b. Symbols are
    // vocabulary ids; ids >= n_vocab are "virtual" symbols for merge results
    // (or bytes) whose text is missing from the vocabulary.
    void init(const int32_t byte_symbols[256]);
    void add(int32_t left, int32_t right, int32_t rank, int32_t result);  // keeps the first rank of a pair
    size_t size() const { return n_; }

    // Merges the byte string `piece` and appends its final symbols to `out`.
    void apply(const unsigned char* piece, size_t n, std::vector<int32_t>& out) const;

private:
    struct Entry {
        uint64_t key;  // (left << 32) | right; kEmpty if unused
        int32_t rank;
        int32_t result;
    };
    static constexpr uint64_t kEmpty = ~uint64_t(0);
    static uint64_t key(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
    static size_t slot_hash(uint64_t k) {
        k ^= k >> 33;
        k *= 0xff51afd7ed558ccdULL;
        k ^= k >> 33;
        return size_t(k);
    }
    const Entry* find(int32_t l, int32_t r) const {
        const uint64_t k = key(l, r);
        for (size_t i = slot_hash(k) & mask_;; i = (i + 1) & mask_) {
            const Entry& e = table_[i];
            if (e.key == k) return &e;
            if (e.key == kEmpty) return nullptr;
        }
    }
    void grow();
    void apply_small(std::vector<int32_t>& syms) const;
    void apply_large(std::vector<int32_t>& syms) const;

    int32_t byte_symbols_[256] = {};
    std::vector<Entry> table_;
    size_t mask_ = 0;
    size_t n_ = 0;
};

// ---------------------------------------------------------------- TextIndex templates

template <class TextOf>
void TextIndex::put(std::string_view text, int32_t id, const TextOf& text_of) {
    for (size_t i = hash(text) & mask_;; i = (i + 1) & mask_) {
        if (slots_[i] < 0 || text_of(slots_[i]) == text) {
            slots_[i] = id;
            return;
        }
    }
}

template <class TextOf>
int32_t TextIndex::get(std::string_view text, const TextOf& text_of) const {
    if (slots_.empty()) return -1;
    for (size_t i = hash(text) & mask_;; i = (i + 1) & mask_) {
        const int32_t id = slots_[i];
        if (id < 0) return -1;
        if (text_of(id) == text) return id;
    }
}

}  // namespace qinfer
