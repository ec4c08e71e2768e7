#include "server/prompt_cache.h"

#include <algorithm>

namespace qinfer::server {

uint64_t PromptCache::entry_bytes(const Entry& e) {
    return (e.state ? e.state->own_bytes() : 0) + uint64_t(e.tokens.size()) * sizeof(int32_t);
}

std::shared_ptr<const PromptCache::Entry> PromptCache::find(const std::vector<int32_t>& prompt) {
    auto best = entries_.end();
    size_t best_len = 0;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        const std::vector<int32_t>& t = (*it)->tokens;
        if (t.size() <= best_len || t.size() >= prompt.size()) continue;
        if (std::equal(t.begin(), t.end(), prompt.begin())) {
            best = it;
            best_len = t.size();
        }
    }
    if (best == entries_.end()) return nullptr;
    touch(best);
    return entries_.front();
}

// Most recently used: the entry, and right behind it the entries its state is
// built on (a restore needs them all, so they must not look colder than it).
void PromptCache::touch(std::list<std::shared_ptr<const Entry>>::iterator it) {
    const std::shared_ptr<const Entry> e = *it;
    touch_bases(e->state.get());
    for (auto j = entries_.begin(); j != entries_.end(); ++j)
        if (*j == e) {
            entries_.splice(entries_.begin(), entries_, j);
            break;
        }
}

void PromptCache::touch_bases(const StateStore::Snapshot* snap) {
    for (const StateStore::Snapshot* b = snap ? snap->base.get() : nullptr; b; b = b->base.get())
        for (auto j = entries_.begin(); j != entries_.end(); ++j)
            if ((*j)->state.get() == b) {
                entries_.splice(entries_.begin(), entries_, j);
                break;
            }
}

bool PromptCache::contains(const std::vector<int32_t>& tokens) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if ((*it)->tokens == tokens) {
            touch(it);
            return true;
        }
    }
    return false;
}

void PromptCache::add(std::vector<int32_t> tokens, std::shared_ptr<const StateStore::Snapshot> state) {
    if (tokens.empty() || !state || contains(tokens)) return;
    // A piece built on a snapshot the cache no longer holds would keep that
    // memory alive outside the budget.
    if (state->base && !holds(state->base.get())) return;
    auto e = std::make_shared<Entry>();
    e->tokens = std::move(tokens);
    e->state = std::move(state);
    const uint64_t n = entry_bytes(*e);
    if (n > budget_) return;
    // The new entry's bases must survive the evictions that make room for it.
    touch_bases(e->state.get());
    while (!entries_.empty() && bytes_ + n > budget_) evict_back();
    if (e->state->base && !holds(e->state->base.get())) return;  // the budget could not keep its base
    entries_.push_front(std::move(e));
    bytes_ += n;
}

bool PromptCache::holds(const StateStore::Snapshot* snap) const {
    for (const auto& e : entries_)
        if (e->state.get() == snap) return true;
    return false;
}

void PromptCache::evict_back() {
    const StateStore::Snapshot* gone = entries_.back()->state.get();
    bytes_ -= entry_bytes(*entries_.back());
    entries_.pop_back();
    for (auto it = entries_.begin(); it != entries_.end();) {
        bool built_on = false;
        for (const StateStore::Snapshot* b = (*it)->state->base.get(); b && !built_on; b = b->base.get())
            built_on = b == gone;
        if (built_on) {
            bytes_ -= entry_bytes(**it);
            it = entries_.erase(it);
        } else {
            ++it;
        }
    }
}

void PromptCache::clear() {
    entries_.clear();
    bytes_ = 0;
}

}  // namespace qinfer::server
