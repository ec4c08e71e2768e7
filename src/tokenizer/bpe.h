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

#if defined(__GNUC__) || defined(__clang__)
#define QINFER_PREFETCH(p) __builtin_prefetch(p)
#else
#define QINFER_PREFETCH(p) ((void)(p))
#endif

// Open-addressing map from a text (stored elsewhere) to an int32 id.
// Lookups compare against the stored texts through `text_of`.
class TextIndex {
public:
    void reserve(size_t n);
    // Inserts or overwrites (the last id wins, as in llama.cpp's text->id
    // map); returns false when it overwrote.
    template <class TextOf>
    bool put(std::string_view text, int32_t id, const TextOf& text_of) {
        return put_hashed(hash(text), text, id, text_of);
    }
    template <class TextOf>
    int32_t get(std::string_view text, const TextOf& text_of) const {  // -1 if absent
        return get_hashed(hash(text), text, text_of);
    }
    static uint64_t hash(std::string_view s);
    template <class TextOf>
    bool put_hashed(uint64_t h, std::string_view text, int32_t id, const TextOf& text_of);
    template <class TextOf>
    int32_t get_hashed(uint64_t h, std::string_view text, const TextOf& text_of) const;

    // Loading does ~450k random lookups into tables larger than the caches;
    // these let a batch of lookups fetch their memory in parallel.
    void prefetch(uint64_t h) const { QINFER_PREFETCH(&slots_[h & mask_]); }
    // First id on the probe chain of `h` whose tag matches (-1: none). A hint only.
    int32_t candidate(uint64_t h) const {
        const uint32_t tag = uint32_t(h >> 32);
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            if (slots_[i].id < 0) return -1;
            if (slots_[i].tag == tag) return slots_[i].id;
        }
    }

private:
    // The high hash bits are kept next to the id, so a probe only touches the
    // stored text when the hashes agree (loading does ~450k lookups).
    struct Slot {
        uint32_t tag;
        int32_t id;  // -1 = empty
    };
    std::vector<Slot> slots_;
    size_t mask_ = 0;
};

class BpeMerges {
public:
    // `byte_symbols[b]` is the symbol of the single byte b. Symbols are
    // vocabulary ids; ids in [n_vocab, n_symbols) are "virtual" symbols for
    // merge results (or bytes) whose text is missing from the vocabulary.
    // Merge r joins left[r] and right[r] into result[r]; r is its rank.
    // Entries with a negative part are skipped; of a pair listed twice the
    // first (lowest) rank counts.
    void build(const int32_t byte_symbols[256], size_t n_symbols, const int32_t* left, const int32_t* right,
               const int32_t* result, size_t n_merges);
    size_t size() const { return entries_.size(); }

    // Merges the byte string `piece` and appends its final symbols to `out`.
    void apply(const unsigned char* piece, size_t n, std::vector<int32_t>& out) const;

private:
    // Merges grouped by left symbol (CSR layout), each group sorted by right
    // symbol: the pairs that a text keeps looking up (a CJK lead byte with its
    // continuation bytes, a frequent prefix with its suffixes) sit together in
    // a few cache lines, unlike in a hash table.
    struct Entry {
        int32_t right;
        int32_t rank;
        int32_t result;
    };
    const Entry* find(int32_t l, int32_t r) const {
        const Entry* b = entries_.data() + first_[size_t(l)];
        const Entry* e = entries_.data() + first_[size_t(l) + 1];
        while (e - b > 8) {
            const Entry* mid = b + (e - b) / 2;
            if (mid->right < r)
                b = mid + 1;
            else
                e = mid + 1;
            if (mid->right == r) return mid;
        }
        for (; b < e; ++b)
            if (b->right == r) return b;
        return nullptr;
    }
    void merge(std::vector<int32_t>& syms) const;

    int32_t byte_symbols_[256] = {};
    std::vector<uint32_t> first_;  // n_symbols + 1 offsets into entries_
    std::vector<Entry> entries_;
};

// ---------------------------------------------------------------- TextIndex templates

template <class TextOf>
bool TextIndex::put_hashed(uint64_t h, std::string_view text, int32_t id, const TextOf& text_of) {
    const uint32_t tag = uint32_t(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
        Slot& s = slots_[i];
        const bool empty = s.id < 0;
        if (empty || (s.tag == tag && text_of(s.id) == text)) {
            s = Slot{tag, id};
            return empty;
        }
    }
}

template <class TextOf>
int32_t TextIndex::get_hashed(uint64_t h, std::string_view text, const TextOf& text_of) const {
    if (slots_.empty()) return -1;
    const uint32_t tag = uint32_t(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
        const Slot& s = slots_[i];
        if (s.id < 0) return -1;
        if (s.tag == tag && text_of(s.id) == text) return s.id;
    }
}

}  // namespace qinfer
