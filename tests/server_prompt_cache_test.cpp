// PromptCache bookkeeping with chained snapshots: entries count only their own
// bytes, evicting an entry evicts every entry built on it, and a piece whose
// base is no longer cached is refused (it would keep memory outside the budget).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "server/prompt_cache.h"

namespace qinfer::server {
namespace {

using Snap = StateStore::Snapshot;

std::shared_ptr<const Snap> piece(int length, size_t bytes, std::shared_ptr<const Snap> base = nullptr) {
    auto s = std::make_shared<Snap>();
    s->length = length;
    if (base) {
        s->first = base->length;
        s->base = std::move(base);
    }
    s->bytes.assign(bytes, 0);
    return s;
}

std::vector<int32_t> tokens(int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; i++) t[size_t(i)] = i;
    return t;
}

uint64_t cost(size_t own_bytes, int n_tokens) { return own_bytes + uint64_t(n_tokens) * sizeof(int32_t); }

TEST(PromptCache, ChainedEntriesCountOwnBytesAndLeaveWithTheirBase) {
    PromptCache cache(10000);
    auto a = piece(10, 1000);
    auto b = piece(20, 500, a);   // rows [10, 20) on top of a
    auto c = piece(30, 500, b);   // and [20, 30) on top of b
    auto x = piece(12, 2000);     // another history
    cache.add(tokens(10), a);
    cache.add(tokens(20), b);
    cache.add(tokens(30), c);
    cache.add(std::vector<int32_t>(12, 7), x);
    EXPECT_EQ(cache.size(), 4u);
    EXPECT_EQ(cache.bytes(), cost(1000, 10) + cost(500, 20) + cost(500, 30) + cost(2000, 12));

    // The longest cached prefix of a 25-token prompt is b (found = recently used).
    auto hit = cache.find(tokens(25));
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->state, b);

    // Using b refreshed its base a too: a new entry that needs 620 bytes of
    // room evicts c (the least recently used), not the chain b stands on.
    cache.find(std::vector<int32_t>(13, 7));  // x is now the most recent
    auto y = piece(5, 6000);
    cache.add(std::vector<int32_t>(5, 9), y);
    EXPECT_FALSE(cache.holds(c.get()));
    for (const auto& s : {a, b, x, y}) EXPECT_TRUE(cache.holds(s.get()));
    EXPECT_EQ(cache.bytes(), cost(1000, 10) + cost(500, 20) + cost(2000, 12) + cost(6000, 5));

    // Now a is the least recently used: making room evicts it, and b with it.
    auto z = piece(6, 1000);
    cache.add(std::vector<int32_t>(6, 3), z);
    EXPECT_FALSE(cache.holds(a.get()));
    EXPECT_FALSE(cache.holds(b.get()));
    for (const auto& s : {x, y, z}) EXPECT_TRUE(cache.holds(s.get()));
    EXPECT_EQ(cache.size(), 3u);
    EXPECT_EQ(cache.bytes(), cost(2000, 12) + cost(6000, 5) + cost(1000, 6));

    // b's base is gone: a piece on top of b is refused, the cache unchanged.
    cache.add(tokens(40), piece(40, 100, b));
    EXPECT_EQ(cache.size(), 3u);
    EXPECT_FALSE(cache.find(tokens(41)));
}

TEST(PromptCache, AddingAPieceKeepsItsBase) {
    // Budget for the base and the new piece only: making room evicts the
    // unrelated older entry, never the base the new piece needs.
    PromptCache cache(cost(1000, 10) + cost(500, 20) + 10);
    auto a = piece(10, 1000);
    auto other = piece(3, 400);
    cache.add(tokens(10), a);
    cache.add(std::vector<int32_t>{5, 5, 5}, other);  // most recent; a is the least recently used
    auto b = piece(20, 500, a);
    cache.add(tokens(20), b);
    EXPECT_TRUE(cache.holds(a.get()));
    EXPECT_TRUE(cache.holds(b.get()));
    EXPECT_FALSE(cache.holds(other.get()));
    EXPECT_EQ(cache.bytes(), cost(1000, 10) + cost(500, 20));
}

}  // namespace
}  // namespace qinfer::server
