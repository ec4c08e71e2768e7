#include "tokenizer/bpe.h"

#include <climits>
#include <queue>

namespace qinfer {

// ---------------------------------------------------------------- TextIndex

void TextIndex::reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, -1);
    mask_ = cap - 1;
}

uint64_t TextIndex::hash(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a: token texts are short
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

// ---------------------------------------------------------------- BpeMerges

void BpeMerges::init(const int32_t byte_symbols[256]) {
    for (int b = 0; b < 256; ++b) byte_symbols_[b] = byte_symbols[b];
    table_.assign(1024, Entry{kEmpty, 0, 0});
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

// Long pieces (a line of text without spaces, a long run of digits-free
// symbols): linked list of symbols plus a heap of candidate pairs ordered by
// (rank, position), with stale entries skipped. O(n log n).
void BpeMerges::apply_large(std::vector<int32_t>& syms) const {
    struct Node {
        int32_t id, prev, next;
    };
    struct Cand {
        int32_t rank, left, lid, rid, result;
        bool operator<(const Cand& o) const {  // priority_queue is a max-heap: invert
            return rank != o.rank ? rank > o.rank : left > o.left;
        }
    };
    const int32_t m = int32_t(syms.size());
    std::vector<Node> nodes(static_cast<size_t>(m));
    for (int32_t i = 0; i < m; ++i) nodes[size_t(i)] = Node{syms[size_t(i)], i - 1, i + 1 < m ? i + 1 : -1};
    std::vector<Cand> storage;
    storage.reserve(size_t(m));
    std::priority_queue<Cand> heap(std::less<Cand>(), std::move(storage));
    auto push = [&](int32_t l) {
        const int32_t r = nodes[size_t(l)].next;
        if (r < 0) return;
        const Entry* e = find(nodes[size_t(l)].id, nodes[size_t(r)].id);
        if (e) heap.push(Cand{e->rank, l, nodes[size_t(l)].id, nodes[size_t(r)].id, e->result});
    };
    for (int32_t i = 0; i + 1 < m; ++i) push(i);
    while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        Node& L = nodes[size_t(c.left)];
        // Stale if either side changed since the pair was queued: a symbol's
        // id only ever changes to a longer symbol, so equal ids mean unchanged.
        if (L.id != c.lid || L.next < 0 || nodes[size_t(L.next)].id != c.rid) continue;
        Node& R = nodes[size_t(L.next)];
        L.id = c.result;
        L.next = R.next;
        if (R.next >= 0) nodes[size_t(R.next)].prev = c.left;
        R.id = -1;
        if (L.prev >= 0) push(L.prev);
        push(c.left);
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
}

}  // namespace qinfer
