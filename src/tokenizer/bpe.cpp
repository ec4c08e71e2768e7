#include "tokenizer/bpe.h"

#include <climits>
#include <cstring>
#include <algorithm>
#include <functional>

namespace qinfer {

// ---------------------------------------------------------------- TextIndex

void TextIndex::reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{0, -1});
    mask_ = cap - 1;
}

uint64_t TextIndex::hash(std::string_view s) {
    // Eight bytes per step (token texts and pieces are short); the byte order
    // does not matter, hashes never leave the process.
    constexpr uint64_t kMul = 0x9FB21C651E98DF25ULL;
    const char* p = s.data();
    size_t n = s.size();
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t(n) * 0xff51afd7ed558ccdULL);
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        h = (h ^ w) * kMul;
        h ^= h >> 29;
    }
    if (n) {
        uint64_t w = 0;
        for (size_t k = 0; k < n; ++k) w |= uint64_t(static_cast<unsigned char>(p[k])) << (8 * k);
        h = (h ^ w) * kMul;
        h ^= h >> 29;
    }
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

// ---------------------------------------------------------------- BpeMerges

void BpeMerges::build(const int32_t byte_symbols[256], size_t n_symbols, const int32_t* left, const int32_t* right,
                      const int32_t* result, size_t n_merges) {
    for (int b = 0; b < 256; ++b) byte_symbols_[b] = byte_symbols[b];
    // Counting sort by left symbol, then each group by (right, rank).
    first_.assign(n_symbols + 1, 0);
    for (size_t r = 0; r < n_merges; ++r)
        if (left[r] >= 0 && right[r] >= 0) ++first_[size_t(left[r]) + 1];
    for (size_t s = 0; s < n_symbols; ++s) first_[s + 1] += first_[s];
    entries_.resize(first_[n_symbols]);
    std::vector<uint32_t> fill(first_.begin(), first_.end() - 1);
    for (size_t r = 0; r < n_merges; ++r)
        if (left[r] >= 0 && right[r] >= 0) entries_[fill[size_t(left[r])]++] = Entry{right[r], int32_t(r), result[r]};
    // Sort each group by (right, rank); of duplicate pairs the lowest rank
    // comes first and the others are dropped.
    size_t out = 0;
    for (size_t s = 0; s < n_symbols; ++s) {
        const size_t b = first_[s], e = first_[s + 1];
        if (e - b > 1)
            std::sort(entries_.begin() + long(b), entries_.begin() + long(e), [](const Entry& x, const Entry& y) {
                return x.right != y.right ? x.right < y.right : x.rank < y.rank;
            });
        first_[s] = uint32_t(out);
        for (size_t i = b; i < e; ++i)
            if (i == b || entries_[i].right != entries_[i - 1].right) entries_[out++] = entries_[i];
    }
    first_[n_symbols] = uint32_t(out);
    entries_.resize(out);
}

// Symbols form a linked list; every adjacent pair that has a merge sits in a
// min-heap keyed by (rank, position of its left symbol), so equal ranks merge
// leftmost first. rank_at[i] is the rank of the pair that starts at symbol i
// now (INT32_MAX: none), so a heap entry is stale unless rank_at still holds
// its rank: the pair at a position with the same rank is the same merge rule,
// and merging it now is what its own entry, with the same key, would do.
// O(n log n) for any piece length.
void BpeMerges::merge(std::vector<int32_t>& syms) const {
    struct Scratch {
        std::vector<int32_t> prev, next, rank_at, result_at;
        std::vector<uint64_t> heap;
    };
    thread_local Scratch sc;
    const int32_t m = int32_t(syms.size());
    sc.prev.resize(size_t(m));
    sc.next.resize(size_t(m));
    sc.rank_at.resize(size_t(m));
    sc.result_at.resize(size_t(m));
    sc.heap.clear();
    int32_t* prev = sc.prev.data();
    int32_t* next = sc.next.data();
    int32_t* rank_at = sc.rank_at.data();
    int32_t* result_at = sc.result_at.data();
    int32_t* id = syms.data();
    auto key = [](int32_t rank, int32_t pos) { return (uint64_t(uint32_t(rank)) << 32) | uint32_t(pos); };
    auto update = [&](int32_t i) {  // pair starting at symbol i changed
        const Entry* e = next[i] >= 0 ? find(id[i], id[next[i]]) : nullptr;
        rank_at[i] = e ? e->rank : INT32_MAX;
        if (e) {
            result_at[i] = e->result;
            sc.heap.push_back(key(e->rank, i));
            std::push_heap(sc.heap.begin(), sc.heap.end(), std::greater<uint64_t>());
        }
    };
    for (int32_t i = 0; i < m; ++i) {
        prev[i] = i - 1;
        next[i] = i + 1 < m ? i + 1 : -1;
    }
    for (int32_t i = 0; i < m; ++i) {
        const Entry* e = i + 1 < m ? find(id[i], id[i + 1]) : nullptr;
        rank_at[i] = e ? e->rank : INT32_MAX;
        if (e) {
            result_at[i] = e->result;
            sc.heap.push_back(key(e->rank, i));
        }
    }
    std::make_heap(sc.heap.begin(), sc.heap.end(), std::greater<uint64_t>());
    while (!sc.heap.empty()) {
        std::pop_heap(sc.heap.begin(), sc.heap.end(), std::greater<uint64_t>());
        const uint64_t top = sc.heap.back();
        sc.heap.pop_back();
        const int32_t i = int32_t(uint32_t(top));
        if (rank_at[i] != int32_t(top >> 32)) continue;  // stale (merged away or neighbour changed)
        const int32_t j = next[i];
        id[i] = result_at[i];
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        rank_at[j] = INT32_MAX;  // j is gone
        if (prev[i] >= 0) update(prev[i]);
        update(i);
    }
    int32_t n = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) id[n++] = id[i];
    syms.resize(size_t(n));
    if (sc.heap.capacity() > (1u << 16)) sc = Scratch();  // do not keep huge buffers per thread
}

void BpeMerges::apply(const unsigned char* piece, size_t n, std::vector<int32_t>& out) const {
    if (n == 0) return;
    if (n == 1) {
        out.push_back(byte_symbols_[piece[0]]);
        return;
    }
    thread_local std::vector<int32_t> syms;
    syms.resize(n);
    for (size_t i = 0; i < n; ++i) syms[i] = byte_symbols_[piece[i]];
    if (n == 2) {
        if (const Entry* e = find(syms[0], syms[1])) {
            syms[0] = e->result;
            syms.resize(1);
        }
    } else {
        merge(syms);
    }
    out.insert(out.end(), syms.begin(), syms.end());
    if (syms.capacity() > (1u << 16)) std::vector<int32_t>().swap(syms);  // do not keep a huge buffer per thread
}

}  // namespace qinfer
