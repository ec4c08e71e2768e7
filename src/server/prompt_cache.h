// Prompt cache: host copies of slot state at reusable token positions.
//
// Full-attention layers keep K/V per token, so any prefix of a slot's history
// could be reused in place; Gated DeltaNet layers keep one recurrent state per
// sequence that cannot be rolled back. A checkpoint is therefore a whole-slot
// snapshot (KV rows [0, n) plus the recurrent state at n) taken at a position
// worth returning to: the start of the last message of a prompt (where the
// next turn of the conversation diverges from this one), the end of the
// prompt, and every K tokens of a long prefill. A new request restores the
// longest checkpoint that is a prefix of its prompt and processes only the
// rest. Entries are evicted least-recently-used beyond a byte budget.
//
// A checkpoint taken on top of an earlier one of the same history stores only
// the KV rows it adds (StateStore::Snapshot::base): its entry counts only
// those bytes, and evicting an entry evicts every entry built on it, so the
// budget covers all snapshot memory the cache keeps alive.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "runtime/state.h"

namespace qinfer::server {

class PromptCache {
public:
    struct Entry {
        std::vector<int32_t> tokens;                       // the prefix the state represents
        std::shared_ptr<const StateStore::Snapshot> state;  // state->length == tokens.size()
    };

    explicit PromptCache(uint64_t budget_bytes) : budget_(budget_bytes) {}

    // The longest entry whose tokens are a proper prefix of `prompt` (at
    // least one prompt token must remain to produce logits), marked as
    // recently used; nullptr when none.
    std::shared_ptr<const Entry> find(const std::vector<int32_t>& prompt);

    // Whether an entry for exactly these tokens exists (refreshes it).
    bool contains(const std::vector<int32_t>& tokens);

    // Stores a checkpoint; evicts the least recently used entries to stay
    // within the budget (an entry larger than the whole budget is dropped).
    void add(std::vector<int32_t> tokens, std::shared_ptr<const StateStore::Snapshot> state);

    // Whether `snap` is the state of an entry still in the cache (a new
    // checkpoint may then be built on it).
    bool holds(const StateStore::Snapshot* snap) const;

    void clear();
    uint64_t bytes() const { return bytes_; }
    size_t size() const { return entries_.size(); }
    uint64_t budget() const { return budget_; }

private:
    static uint64_t entry_bytes(const Entry& e);
    void evict_back();  // the least recently used entry and every entry built on it
    void touch(std::list<std::shared_ptr<const Entry>>::iterator it);  // it and its bases to the front
    void touch_bases(const StateStore::Snapshot* snap);                // the entries snap is built on
    uint64_t budget_;
    uint64_t bytes_ = 0;
    std::list<std::shared_ptr<const Entry>> entries_;  // front = most recently used
};

}  // namespace qinfer::server
