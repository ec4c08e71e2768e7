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

// What one forward pass sends back for its output rows, in batch order, and
// how each row reaches its sequence. The least that serves every row: the
// backend's pick (one id per row) when all are plain greedy; the best
// `n_top` logits of each row when every sequence samples from so few
// (Sequence::candidates_needed); else whole rows of logits.
struct RowOutputs {
    enum Kind { Ids, Candidates, Logits } kind = Logits;
    int n_top = 0;               // Candidates: per row
    std::vector<int32_t> ids;    // Ids: one per row; Candidates: n_top per row
    std::vector<float> values;   // Candidates: n_top per row; Logits: n_vocab per row

    // Row i's token for `seq` (sampling it where needed).
    void deliver(size_t i, Sequence& seq, int n_vocab);
};

// Runs the batch; `rows` are the sequences of its output rows, in batch
// order. QINFER_SAMPLE_CANDIDATES=0 turns the Candidates form off (A/B runs).
// Throws Error when the model returns another number of rows.
void forward_rows(Model& model, const Batch& batch, const std::vector<Sequence*>& rows, RowOutputs& out);

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
    RowOutputs out_;
    std::vector<Sequence*> want_;  // sequences expecting a logits row, in batch order
};

}  // namespace qinfer
