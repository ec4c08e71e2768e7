#include "engine/batch_step.h"

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

    bool greedy = !want_.empty();
    for (const Sequence* s : want_) greedy = greedy && s->picks_argmax();
    if (forward_rows(model_, batch_, want_.size(), greedy, ids_, logits_))
        for (size_t i = 0; i < want_.size(); i++) want_[i]->on_token(ids_[i]);
    else
        for (size_t i = 0; i < want_.size(); i++) want_[i]->on_logits(logits_.data() + i * n_vocab);
    return int(batch_.size());
}

bool forward_rows(Model& model, const Batch& batch, size_t n_rows, bool all_greedy, std::vector<int32_t>& ids,
                  std::vector<float>& logits) {
    if (all_greedy) {
        model.forward_argmax(batch, ids);
        if (ids.size() != n_rows) fail(strfmt("model returned %zu tokens for %zu rows", ids.size(), n_rows));
        return true;
    }
    model.forward(batch, logits);
    const size_t n_vocab = size_t(model.hparams().n_vocab);
    if (logits.size() != n_rows * n_vocab)
        fail(strfmt("model returned %zu logits for %zu rows of %zu", logits.size(), n_rows, n_vocab));
    return false;
}

}  // namespace qinfer
