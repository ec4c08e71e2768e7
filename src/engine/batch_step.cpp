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

    // Greedy sequences only: the backend picks the tokens, no logits come back.
    bool argmax = !want_.empty();
    for (const Sequence* s : want_) argmax = argmax && s->picks_argmax();
    if (argmax) {
        model_.forward_argmax(batch_, ids_);
        if (ids_.size() != want_.size())
            fail(strfmt("model returned %zu tokens for %zu rows", ids_.size(), want_.size()));
        for (size_t i = 0; i < want_.size(); i++) want_[i]->on_token(ids_[i]);
        return int(batch_.size());
    }
    model_.forward(batch_, logits_);
    if (logits_.size() != want_.size() * n_vocab)
        fail(strfmt("model returned %zu logits for %zu rows of %zu", logits_.size(), want_.size(), n_vocab));
    for (size_t i = 0; i < want_.size(); i++) want_[i]->on_logits(logits_.data() + i * n_vocab);
    return int(batch_.size());
}

}  // namespace qinfer
