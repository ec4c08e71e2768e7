// Stop strings over streamed text. Text that could be the start of a stop
// string is held back until the next piece decides it, so the stop string
// itself (or a prefix of it) never reaches the user, and a stop string split
// across tokens still matches.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace qinfer {

class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops = {});

    // Appends text; returns what can be emitted now. After a match, returns
    // the text before the stop string and matched() is true; later pushes
    // return nothing.
    std::string push(std::string_view text);
    // End of stream: the held-back tail (it did not turn into a stop string).
    std::string flush();

    bool matched() const { return !match_.empty(); }
    const std::string& match() const { return match_; }
    size_t held() const { return buf_.size(); }

private:
    std::vector<std::string> stops_;
    std::string buf_;
    std::string match_;
};

}  // namespace qinfer
