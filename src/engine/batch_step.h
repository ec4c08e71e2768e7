// One step of continuous batching: many Sequences (each on its own model
// slot), one Model::forward. Decode tokens go first (one per generating
// sequence, so generation never waits behind a long prompt), then prompt
// chunks fill the rest of the n_batch budget. Each sequence's logits row is
// handed back to it, which samples and streams its token.
//
// The caller owns slot assignment (clear_slot before a new sequence uses a
// slot, unless its prompt continues what the slot holds) and removes
// finished sequences between steps.
#pragma once
#include <vector>

#include "engine/sequence.h"
#include "model/model.h"

namespace qinfer {

class BatchStep {
public:
    explicit BatchStep(Model& model) : model_(model) {}

    // Runs one step over the running (not done) sequences; returns the number
    // of tokens processed (0: nothing to do). Throws Error from the model; the
    // sequences in the failed batch should then be cancelled.
    int run(const std::vector<Sequence*>& seqs);

    const Batch& last_batch() const { return batch_; }

private:
    Model& model_;
    Batch batch_;
    std::vector<float> logits_;
    std::vector<int32_t> ids_;  // greedy picks (forward_argmax)
    std::vector<Sequence*> want_;  // sequences expecting a logits row, in batch order
};

}  // namespace qinfer
