// Greedy decoding of several sequences for the tests that compare pipelined
// decoding (Model::submit_argmax) with one forward_argmax at a time. Header
// only: it needs the model layer, which qinfer_testutil does not link.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace qinfer::test {

// `steps` decode steps of slots 0 .. first.size() - 1, one token each per step,
// starting from their picks `first` at position p0: one forward_argmax at a
// time, or pipelined (each step chained to the one before and collected one
// step behind). Returns every step's picks.
inline std::vector<std::vector<int32_t>> greedy_steps(Model& m, const std::vector<int32_t>& first, int32_t p0,
                                                      int steps, bool pipelined) {
    std::vector<std::vector<int32_t>> picks;
    std::vector<int32_t> tok = first;
    for (int i = 0; i < steps; ++i) {
        Batch b;
        for (size_t s = 0; s < first.size(); ++s)
            b.add(pipelined && i > 0 ? 0 : tok[s], p0 + i, int32_t(s), true);
        if (!pipelined) {
            m.forward_argmax(b, tok);
            picks.push_back(tok);
            continue;
        }
        m.submit_argmax(b, i > 0);
        if (m.uncollected() == Model::kMaxSubmitted) {
            picks.emplace_back();
            m.collect_argmax(picks.back());
        }
    }
    while (pipelined && m.uncollected() > 0) {
        picks.emplace_back();
        m.collect_argmax(picks.back());
    }
    return picks;
}

}  // namespace qinfer::test
