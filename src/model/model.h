// The model as the engine sees it: load a GGUF, run batches of tokens from one or
// more sequences (slots), get logits. Which backend runs which layer is decided
// at load (placement); the engine and the scheduler never see kernels.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "model/hparams.h"
#include "quant/types.h"
#include "runtime/state.h"

namespace qinfer {
namespace gguf { class File; }
class Backend;

// --gpu-layers auto: as many layers as the memory planner fits in the free
// device memory (0 without a GPU).
constexpr int kGpuLayersAuto = -1;
// ModelOptions::n_batch chosen by Model::load.
constexpr int kBatchAuto = 0;
constexpr int kBatchDefault = 512;
constexpr int kBatchFullGpu = 2048;

struct ModelOptions {
    int n_ctx = 4096;              // tokens of context per slot
    int n_slots = 1;               // parallel sequences (server -np)
    // Max tokens per forward call (larger prompts are split by the caller).
    // kBatchAuto in Model::load: kBatchFullGpu when every layer, the embedding
    // and the head end up on the GPU (fewer weight dequantizations and larger
    // GEMMs per prompt: TTFT of a 4096-token prompt 208 -> 138 ms on an H200),
    // else kBatchDefault.
    int n_batch = 512;
    int n_threads = 0;             // CPU threads; 0 = physical cores
    int gpu_layers = 0;            // layers on the GPU (-ngl; > n_layer: all + head); kGpuLayersAuto: planner
    GgmlType kv_type = GgmlType::F16;  // F16, F32 or Q8_0 (where the layers' backends take it)
    uint64_t vram_limit = 0;       // bytes the GPU allocator may use (0 = what is free)
    // Prompt offload: batches of at least this many tokens run the layers that
    // live in host memory on the GPU too, their weights streamed over the bus
    // (as llama.cpp's op offload). 0 = off. Needs a GPU; -ngl decides only
    // where weights and state live.
    int op_offload_min_batch = 0;
};

// One forward step. Tokens of one slot must be contiguous in the batch and have
// consecutive positions continuing that slot's history (pos == slot length).
struct Batch {
    std::vector<int32_t> tokens;
    std::vector<int32_t> pos;
    std::vector<int32_t> slot;
    std::vector<uint8_t> want_logits;  // 1 = return logits for this token

    void add(int32_t token, int32_t p, int32_t s, bool logits) {
        tokens.push_back(token);
        pos.push_back(p);
        slot.push_back(s);
        want_logits.push_back(logits ? 1 : 0);
    }
    size_t size() const { return tokens.size(); }
    void clear() { tokens.clear(); pos.clear(); slot.clear(); want_logits.clear(); }
};

// Which backend runs what. load(path, opt) builds it from ModelOptions
// (gpu_layers); tests and the GPU planner may build their own.
struct Placement {
    std::vector<std::shared_ptr<Backend>> backends;  // kept alive by the model
    std::vector<int> layer;  // backend index of each main layer (size n_layer)
    int embed = 0;           // token embedding lookup
    int head = 0;            // output norm + LM head
    int offload = -1;        // prompt offload target (ModelOptions::op_offload_min_batch), -1: none
};

class Model {
public:
    // Reads the GGUF, validates every tensor (clear error naming a missing or
    // mis-shaped tensor), places layers on backends and allocates state.
    static std::unique_ptr<Model> load(const std::string& path, const ModelOptions& opt);
    static std::unique_ptr<Model> load(const std::string& path, const ModelOptions& opt, Placement placement);
    virtual ~Model() = default;

    virtual const HParams& hparams() const = 0;
    virtual const gguf::File& file() const = 0;
    virtual const ModelOptions& options() const = 0;

    // Runs the batch. `logits` receives n_vocab floats per token with want_logits,
    // in batch order. Throws Error (e.g. context full) without changing state.
    virtual void forward(const Batch& batch, std::vector<float>& logits) = 0;
    // The same step for greedy decoding: `ids` receives, per token with
    // want_logits, the index of its largest logit (lowest on ties), picked
    // where the logits are computed, so a GPU sends back 4 bytes per row
    // instead of n_vocab floats.
    virtual void forward_argmax(const Batch& batch, std::vector<int32_t>& ids) = 0;
    // The same step for sampling from a few candidates: per token with
    // want_logits, its `n` largest logits (largest first, the lower id first
    // among equals; 1 <= n <= kMaxTop, clamped to n_vocab) in `logits` and
    // their ids in `ids`, n per row. Selected where the logits are computed.
    virtual void forward_top(const Batch& batch, int n, std::vector<float>& logits, std::vector<int32_t>& ids) = 0;
    static constexpr int kMaxTop = 256;

    // Pipelined greedy decoding. submit_argmax queues the step forward_argmax
    // runs and returns without waiting for it; collect_argmax waits for the
    // oldest submitted step not yet collected and gives its ids. With `chain`,
    // the tokens of the batch are the ids the previous submitted step picked,
    // row for row (batch.tokens is not read: that step had one row per token of
    // this batch, every one of which wants logits, and no other step ran in
    // between). A GPU then runs step after step while the host collects each
    // one's ids during the next, instead of idling while the host reads a token
    // and queues the step that consumes it. At most kMaxSubmitted steps may be
    // uncollected, and at most kHeadChunk rows per step. A step that fails to
    // submit throws and changes nothing.
    // The defaults run each step at once through forward_argmax.
    virtual void submit_argmax(const Batch& batch, bool chain);
    virtual void collect_argmax(std::vector<int32_t>& ids);
    virtual int uncollected() const { return int(ran_.size()); }  // submitted steps not yet collected
    static constexpr int kMaxSubmitted = 2;
    // LM-head rows per matmul: bounds the logits buffer ([V, 64] f32, 64 MiB at
    // V = 248k). A forward pass that wants more rows runs without a step graph
    // (it reads logits back between chunks), so this also sets the largest
    // decode batch (-np) that replays as one graph.
    static constexpr int kHeadChunk = 64;

    // Forgets a slot's history (KV length 0, recurrent state zero).
    virtual void clear_slot(int slot) = 0;
    // Tokens currently held by a slot.
    virtual int slot_length(int slot) const = 0;
    // Host copy of a slot's whole state (KV rows and DeltaNet state) and its
    // restoration into any slot: prompt-cache checkpoints, sequence forks.
    // `base`: an earlier snapshot of this slot's history (see StateStore::save);
    // `keep`: rows the slot already holds (see StateStore::restore).
    virtual std::shared_ptr<const StateStore::Snapshot> save_slot(
        int slot, std::shared_ptr<const StateStore::Snapshot> base = nullptr) const = 0;
    virtual void restore_slot(int slot, const StateStore::Snapshot& snap, int keep = 0) = 0;

    // Short description of the placement, e.g. "CPU (8 threads)" or "CUDA 24/24 layers".
    virtual std::string backend_description() const = 0;
    // Forward passes that ran host-memory layers on the GPU (prompt offload).
    virtual uint64_t offloaded_batches() const { return 0; }
    // Every layer is kept on a host-memory backend (decode reads host memory),
    // whether or not long prompts are offloaded to a GPU.
    virtual bool layers_on_host() const = 0;
    // Long prompts run host-memory layers on a GPU (Placement::offload).
    virtual bool offloads_prompts() const = 0;

private:
    std::deque<std::vector<int32_t>> ran_;  // the default submit_argmax's ids, uncollected
    std::vector<int32_t> last_submitted_;   // and those of the latest submitted step
};

}  // namespace qinfer
