// Prompt offload: a big batch (a prompt chunk) also runs the layers that live in
// host memory on the GPU. Their weights are streamed from the mapped file into
// one of two arenas (the next layer's copy overlaps this layer's compute), and
// the state of the batch's slots is copied into a small shadow (segment i of
// the batch uses shadow slot i) and back. Decode steps never offload: they
// would move every weight over the bus for a handful of tokens.
//
// Cost per offloaded step: every streamed layer's weights once (~60 MB per
// Qwen3.5-4B Q4_K_M layer) plus the slots' recurrent state both ways and, for
// attention layers, the KV rows before the batch up and the new rows down.
// Worth it from a few dozen tokens on (ModelOptions::op_offload_min_batch).
#pragma once
#include <memory>
#include <vector>

#include "model/layers.h"

namespace qinfer {

class PromptOffload {
public:
    // `target` runs the streamed layers: every layer whose backend keeps its
    // weights in host memory (layer_backend[il]->host_memory()). Allocates the
    // arenas, the shadow recurrent state and the step buffers on `target`;
    // throws Error when they do not fit.
    PromptOffload(Backend& target, const HParams& hp, const StateConfig& cfg, int n_batch, int min_batch,
                  const std::vector<LayerWeights>& layers, const std::vector<Backend*>& layer_backend);
    ~PromptOffload();
    PromptOffload(const PromptOffload&) = delete;
    PromptOffload& operator=(const PromptOffload&) = delete;

    Backend& target() const { return target_; }
    bool streams(int il) const { return streamed_[size_t(il)]; }
    bool streams_attention() const { return any_attn_; }
    bool streams_recurrent() const { return any_rec_; }
    bool pinned() const { return pinned_; }  // weights copied straight from the pinned file pages

    // Decides whether this batch is offloaded (enough tokens, few enough
    // segments, the KV shadow holds the longest segment) and, if so, writes
    // its token metadata (slots renumbered to shadow slots) to the target.
    bool begin(const std::vector<int32_t>& pos, const std::vector<StepInfo::Segment>& segs);
    const StepInfo& step() const { return step_; }

    // Queues the copy of layer il's weights and returns them on the target.
    const LayerWeights& stage(int il);
    // Copies layer il's state for this step's slots into the shadow.
    struct LayerState {
        const KvCache* kv = nullptr;
        const RecurrentState* rs = nullptr;
    };
    LayerState load_state(int il, const StateStore& state);
    // Copies the shadow state of the last loaded layer back to its host slots
    // (waits for that layer's ops). Call after stage() of the next layer, so
    // the copy of its weights runs while the GPU finishes this one.
    void store_state(const StateStore& state);

private:
    void release();
    void ensure_kv_capacity(int64_t rows);

    Backend& target_;
    const HParams& hp_;
    StateConfig cfg_;
    int min_batch_;
    int max_segments_;
    std::vector<bool> streamed_;
    bool any_attn_ = false, any_rec_ = false;
    bool pinned_ = false;
    const std::vector<LayerWeights>& host_;
    Tensor arena_[2];
    LayerWeights staged_[2];
    int next_arena_ = 0;
    int arena_user_[2] = {-1, -1};  // layer whose weights each arena holds this step
    KvCache kv_;            // {d, n_kv, kv_rows_, max_segments}
    int64_t kv_rows_ = 0;
    RecurrentState rs_;     // {.., max_segments}
    StepInfo step_;
    std::vector<StepInfo::Segment> segs_;  // this step's, with host slots
    int pending_layer_ = -1;
};

}  // namespace qinfer
