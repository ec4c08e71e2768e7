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
        std::memcpy(&w, p, n);
        h = (h ^ w) * kMul;
        h ^= h >> 29;
    }
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

// ---------------------------------------------------------------- BpeMerges

void BpeMerges::init(const int32_t byte_symbols[256], size_t expected_merges) {
    for (int b = 0; b < 256; ++b) byte_symbols_[b] = byte_symbols[b];
    size_t cap = 1024;
    while (cap < 2 * expected_merges) cap <<= 1;
    table_.assign(cap, Entry{kEmpty, 0, 0});
    mask_ = table_.size() - 1;
    n_ = 0;
}

void BpeMerges::grow() {
    std::vector<Entry> old;
    old.swap(table_);
    table_.assign(old.size() * 2, Entry{kEmpty, 0, 0});
    mask_ = table_.size() - 1;
    for (const Entry& e : old) {
        if (e.key == kEmpty) continue;
        size_t i = slot_hash(e.key) & mask_;
        while (table_[i].key != kEmpty) i = (i + 1) & mask_;
        table_[i] = e;
    }
}

void BpeMerges::add(int32_t left, int32_t right, int32_t rank, int32_t result) {
    if (2 * (n_ + 1) > table_.size()) grow();
    const uint64_t k = key(left, right);
    size_t i = slot_hash(k) & mask_;
    for (; table_[i].key != kEmpty; i = (i + 1) & mask_)
        if (table_[i].key == k) return;  // duplicate pair: the first (lowest) rank stays
    table_[i] = Entry{k, rank, result};
    ++n_;
}

// Short pieces (nearly all of them): keep the rank of every adjacent pair in
// an array, merge the leftmost lowest, look up only the two new pairs.
void BpeMerges::apply_small(std::vector<int32_t>& syms) const {
    constexpr int kMax = 256;
    int32_t rank[kMax], result[kMax];
    int m = int(syms.size());
    auto look = [&](int i) {
        const Entry* e = find(syms[i], syms[i + 1]);
        rank[i] = e ? e->rank : INT_MAX;
        result[i] = e ? e->result : -1;
    };
    for (int i = 0; i + 1 < m; ++i) look(i);
    for (;;) {
        int best = -1;
        int32_t best_rank = INT_MAX;
        for (int i = 0; i + 1 < m; ++i)
            if (rank[i] < best_rank) best_rank = rank[i], best = i;
        if (best < 0) break;
        syms[best] = result[best];
        for (int i = best + 1; i + 1 < m; ++i) {
            syms[i] = syms[i + 1];
            rank[i] = rank[i + 1];
            result[i] = result[i + 1];
        }
        --m;
        if (best > 0) look(best - 1);
        if (best + 1 < m) look(best);
    }
    syms.resize(size_t(m));
}

// Long pieces (a line of text without spaces, a long run of one symbol):
// linked list of symbols plus a min-heap of candidate pairs keyed by
// (rank, position). O(n log n). A heap entry is only a key: when it comes up,
// the pair now at that position is looked up again, and the entry is stale
// unless that pair still has the entry's rank. (A pair at the same position
// with the same rank is the same merge rule, and merging it now is exactly
// what its own entry, which has the same key, would do.)
void BpeMerges::apply_large(std::vector<int32_t>& syms) const {
    struct Node {
        int32_t id, prev, next;
    };
    const int32_t m = int32_t(syms.size());
    std::vector<Node> nodes(static_cast<size_t>(m));
    for (int32_t i = 0; i < m; ++i) nodes[size_t(i)] = Node{syms[size_t(i)], i - 1, i + 1 < m ? i + 1 : -1};
    auto pair_at = [&](int32_t l) -> const Entry* {
        const int32_t r = nodes[size_t(l)].next;
        return r < 0 ? nullptr : find(nodes[size_t(l)].id, nodes[size_t(r)].id);
    };
    std::vector<uint64_t> heap;
    heap.reserve(size_t(m));
    auto push = [&](int32_t l) {
        if (const Entry* e = pair_at(l)) {
            heap.push_back((uint64_t(uint32_t(e->rank)) << 32) | uint32_t(l));
            std::push_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
        }
    };
    for (int32_t i = 0; i + 1 < m; ++i)
        if (const Entry* e = pair_at(i)) heap.push_back((uint64_t(uint32_t(e->rank)) << 32) | uint32_t(i));
    std::make_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
        const uint64_t top = heap.back();
        heap.pop_back();
        const int32_t left = int32_t(uint32_t(top));
        Node& L = nodes[size_t(left)];
        if (L.id < 0) continue;  // absorbed by its left neighbour
        const Entry* e = pair_at(left);
        if (!e || uint32_t(e->rank) != uint32_t(top >> 32)) continue;
        Node& R = nodes[size_t(L.next)];
        L.id = e->result;
        L.next = R.next;
        if (R.next >= 0) nodes[size_t(R.next)].prev = left;
        R.id = -1;
        if (L.prev >= 0) push(L.prev);
        push(left);
    }
    syms.clear();
    for (int32_t i = 0; i >= 0; i = nodes[size_t(i)].next) syms.push_back(nodes[size_t(i)].id);
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
    if (n <= 256)
        apply_small(syms);
    else
        apply_large(syms);
    out.insert(out.end(), syms.begin(), syms.end());
    if (syms.capacity() > (1u << 16)) std::vector<int32_t>().swap(syms);  // do not keep a huge buffer per thread
}

}  // namespace qinfer
