#include "engine/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace qinfer {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
    for (std::string& s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
    if (matched()) return {};
    buf_.append(text);
    if (stops_.empty()) return std::exchange(buf_, {});

    // Earliest occurrence wins; at the same position the longer stop string.
    size_t best = std::string::npos;
    const std::string* which = nullptr;
    for (const std::string& s : stops_) {
        const size_t p = buf_.find(s);
        if (p == std::string::npos) continue;
        if (p < best || (p == best && s.size() > which->size())) {
            best = p;
            which = &s;
        }
    }
    if (which) {
        match_ = *which;
        std::string out = buf_.substr(0, best);
        buf_.clear();
        return out;
    }

    // Hold back the longest tail of buf_ that is a proper prefix of a stop string.
    size_t hold = 0;
    for (const std::string& s : stops_) {
        const size_t max_k = std::min(s.size() - 1, buf_.size());
        for (size_t k = max_k; k > hold; k--) {
            if (buf_.compare(buf_.size() - k, k, s, 0, k) == 0) {
                hold = k;
                break;
            }
        }
    }
    std::string out = buf_.substr(0, buf_.size() - hold);
    buf_.erase(0, buf_.size() - hold);
    return out;
}

std::string StopMatcher::flush() {
    if (matched()) return {};
    return std::exchange(buf_, {});
}

}  // namespace qinfer
