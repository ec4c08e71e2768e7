#include "server/prompt_cache.h"

#include <algorithm>

namespace qinfer::server {

uint64_t PromptCache::entry_bytes(const Entry& e) {
    return uint64_t(e.state.bytes.size()) + uint64_t(e.tokens.size()) * sizeof(int32_t);
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
    entries_.splice(entries_.begin(), entries_, best);
    return entries_.front();
}

bool PromptCache::contains(const std::vector<int32_t>& tokens) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if ((*it)->tokens == tokens) {
            entries_.splice(entries_.begin(), entries_, it);
            return true;
        }
    }
    return false;
}

void PromptCache::add(std::vector<int32_t> tokens, StateStore::Snapshot state) {
    if (tokens.empty() || contains(tokens)) return;
    auto e = std::make_shared<Entry>();
    e->tokens = std::move(tokens);
    e->state = std::move(state);
    const uint64_t n = entry_bytes(*e);
    if (n > budget_) return;
    while (!entries_.empty() && bytes_ + n > budget_) {
        bytes_ -= entry_bytes(*entries_.back());
        entries_.pop_back();
    }
    entries_.push_front(std::move(e));
    bytes_ += n;
}

void PromptCache::clear() {
    entries_.clear();
    bytes_ = 0;
}

}  // namespace qinfer::server
