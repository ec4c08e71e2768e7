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

// One forward pass whose `n_rows` output rows belong to sequences that are
// all greedy (`all_greedy`: the backend picks the tokens, one id per row comes
// back in `ids`) or not (`logits`, n_rows x n_vocab). Returns whether ids came
// back; throws Error when the model returns another number of rows.
bool forward_rows(Model& model, const Batch& batch, size_t n_rows, bool all_greedy, std::vector<int32_t>& ids,
                  std::vector<float>& logits);

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
