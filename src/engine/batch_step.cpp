#include "engine/batch_step.h"

#include <algorithm>

#include "common/env.h"
#include "common/error.h"

namespace qinfer {

int BatchStep::run(const std::vector<Sequence*>& seqs) {
    const int budget = model_.options().n_batch;
    const size_t n_vocab = size_t(model_.hparams().n_vocab);
    batch_.clear();
    want_.clear();
    auto take = [&](Sequence* s) {
        const int room = budget - int(batch_.size());
        if (room <= 0 || s->done()) return;
        s->add_to_batch(batch_, room);
        if (s->wants_logits()) want_.push_back(s);
    };
    for (Sequence* s : seqs)
        if (!s->prefilling()) take(s);
    for (Sequence* s : seqs)
        if (s->prefilling()) take(s);
    if (batch_.size() == 0) return 0;

    forward_rows(model_, batch_, want_, out_);
    for (size_t i = 0; i < want_.size(); i++) out_.deliver(i, *want_[i], int(n_vocab));
    return int(batch_.size());
}

static_assert(Sampler::kMaxTopCandidates <= Model::kMaxTop, "the model returns as many candidates as a sampler needs");

void forward_rows(Model& model, const Batch& batch, const std::vector<Sequence*>& rows, RowOutputs& out) {
    static const bool candidates_on = env_int("QINFER_SAMPLE_CANDIDATES", 0, 1, 1) != 0;
    const size_t n_rows = rows.size();
    bool greedy = n_rows > 0, all_few = candidates_on && n_rows > 0;
    int n_top = 0;  // the most any row needs; each row samples from its own prefix of them
    for (const Sequence* s : rows) {
        greedy = greedy && s->picks_argmax();
        const int need = all_few ? s->candidates_needed() : 0;
        all_few = all_few && need > 0;
        n_top = std::max(n_top, need);
    }
    const size_t n_vocab = size_t(model.hparams().n_vocab);
    if (greedy) {
        out.kind = RowOutputs::Ids;
        model.forward_argmax(batch, out.ids);
        if (out.ids.size() != n_rows) fail(strfmt("model returned %zu tokens for %zu rows", out.ids.size(), n_rows));
    } else if (all_few) {
        // Rounded up to a multiple of 16: the count is part of the step's graph
        // key, and with penalties it follows the distinct ids of the recent
        // history, which would otherwise make nearly every step a new shape
        // (run eagerly, then recorded). More candidates than needed are harmless.
        n_top = int(std::min<int64_t>({int64_t(n_top + 15) / 16 * 16, Model::kMaxTop, model.hparams().n_vocab}));
        out.kind = RowOutputs::Candidates;
        out.n_top = n_top;
        model.forward_top(batch, n_top, out.values, out.ids);
        if (out.ids.size() != n_rows * size_t(n_top) || out.values.size() != out.ids.size())
            fail(strfmt("model returned %zu candidates for %zu rows of %d", out.ids.size(), n_rows, n_top));
    } else {
        out.kind = RowOutputs::Logits;
        model.forward(batch, out.values);
        if (out.values.size() != n_rows * n_vocab)
            fail(strfmt("model returned %zu logits for %zu rows of %zu", out.values.size(), n_rows, n_vocab));
    }
}

void RowOutputs::deliver(size_t i, Sequence& seq, int n_vocab) {
    switch (kind) {
        case Ids: seq.on_token(ids[i]); break;
        case Candidates: {
            const size_t at = i * size_t(n_top);
            seq.on_candidates(values.data() + at, ids.data() + at, n_top);
            break;
        }
        case Logits: seq.on_logits(values.data() + i * size_t(n_vocab)); break;
    }
}

}  // namespace qinfer
