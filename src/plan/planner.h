// The memory planner: what each component of a model needs (weights per layer,
// KV cache per token, DeltaNet state per sequence, activation buffers, logits,
// CUDA runtime), how that splits between GPU and host for -ngl N, the largest
// N that fits a given amount of free GPU memory, and the largest context.
// Formulas and worked numbers: docs/memory-planning.md (from spec/models.md §9).
//
// Split rule (as Model::load places layers, and as llama.cpp counts -ngl):
// -ngl N runs the LAST min(N, n_layer) main layers on the GPU; N > n_layer
// (e.g. n_layer + 1, or 99) also moves the token embedding and the output head
// (final norm + LM head) there, so only token ids and logits cross the bus.
// A tied embedding matrix is then one copy serving both lookup and head.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/hparams.h"
#include "plan/model_desc.h"
#include "quant/types.h"
#include "runtime/cuda/sizing.h"

namespace qinfer {
namespace gguf { class File; }

constexpr uint64_t kMiB = uint64_t(1) << 20;
constexpr uint64_t kGiB = uint64_t(1) << 30;

// ---- split rule
inline int64_t first_gpu_layer(int64_t n_layer, int64_t gpu_layers) {
    return n_layer - (gpu_layers <= 0 ? 0 : gpu_layers >= n_layer ? n_layer : gpu_layers);
}
inline bool layer_on_gpu(int64_t n_layer, int64_t gpu_layers, int64_t il) {
    return il >= first_gpu_layer(n_layer, gpu_layers);
}
// Embedding lookup and output head: on the GPU only when every layer is.
inline bool head_on_gpu(int64_t n_layer, int64_t gpu_layers) { return gpu_layers > n_layer; }

// Memory that is neither weights nor state. Explicit estimates, to be
// calibrated against measured peaks; each term is a line of the report.
struct ComputeModel {
    // LM-head rows per matmul (model.cpp kHeadChunk): the head's input and
    // logits buffers on its device are [E + n_vocab, head_chunk_rows] f32.
    int64_t head_chunk_rows = 64;
    // Rows of logits returned to the caller by one forward call (the host
    // vector). -1: n_slots, one per sequence, as generation asks; `qinfer
    // logits` asks for every token (n_batch).
    int64_t logit_rows = -1;
    // CUDA context as cudaMemGetInfo sees it. Measured 526 MiB on an H200
    // (driver 580, CUDA 13, lazy module loading); set 0 when the free memory
    // was measured in-process after the context exists.
    uint64_t cuda_context_bytes = 526 * kMiB;
    // cuBLAS: the handle (measured +68 MiB on the same machine) plus the 32 MiB
    // workspace the CUDA backend gives it.
    uint64_t cublas_bytes = (68 + 32) * kMiB;
    // Matmul input scratch on the GPU: two buffers of the quantized (Q8, about
    // 1.14-1.25 B/elem) or f16 copy of the widest [K, n_batch] input; bounded
    // by 2 buffers x 2 bytes x K x n_batch.
    bool act_scratch = true;
    // Prompt steps of f16_prefill_min_batch+ tokens multiply quantized weights
    // as f16 on cuBLAS (CUDA backend matmul; thresholds and the weight chunk in
    // runtime/cuda/sizing.h): a weight scratch and an f16 copy of the
    // [K, n_batch] input. 0: never counted (the path forced off).
    int64_t f16_prefill_min_batch = cuda::kF16MinTokens;
    // Pinned host buffers for weight uploads (3 x 32 MiB in the CUDA backend).
    uint64_t host_staging_bytes = 96 * kMiB;
    // cudaMalloc rounds an allocation above 1 MiB up to a multiple of 2 MiB
    // (measured on the H200: 1474560 B takes 2 MiB, 11796480 B takes 12 MiB);
    // smaller ones share pooled pages. Every GPU tensor is one allocation, so
    // this adds 150-200 MiB for a 4B model. 0 turns the rounding off.
    uint64_t alloc_granularity = 2 * kMiB;
    uint64_t alloc_small_limit = kMiB;
    uint64_t gpu_alloc(uint64_t bytes) const;  // bytes one allocation takes on the GPU
};

struct PlanOptions {
    int64_t n_ctx = 4096;  // tokens of context per slot (KV is allocated per slot)
    int n_slots = 1;       // parallel sequences
    int n_batch = 512;     // max tokens per forward call: sizes the activation buffers
    GgmlType kv_type = GgmlType::F16;  // F16, F32 or Q8_0
    // Prompt offload (model/offload.h): with layers in host memory, the GPU
    // also holds two weight arenas, a shadow of one layer's state for up to 4
    // sequences and the activation sets of the layer kinds it streams.
    bool op_offload = false;
    ComputeModel compute;
};

struct LayerPlan {
    int64_t index = 0;
    bool recurrent = false;            // Gated DeltaNet (qwen35) vs attention
    uint64_t weight_bytes = 0;         // all blk.N.* tensors
    uint64_t kv_bytes_per_token = 0;   // attention layers: K + V of one token, one sequence
    uint64_t state_bytes_per_seq = 0;  // DeltaNet layers: conv + recurrent S (f32)
    int64_t widest_input = 0;          // largest ne[0] of its 2-D tensors (matmul K)
    uint64_t weight_padding = 0;       // GPU: allocation rounding of its tensors
    uint64_t f16_copy_bytes = 0;       // GPU: f16 copies of its prompt-product weights (see Split)
};

// Bytes on one device for one split and context.
struct DeviceBytes {
    uint64_t weights = 0;
    uint64_t kv_cache = 0;
    uint64_t recurrent_state = 0;
    uint64_t scratch = 0;    // activation buffers [width, n_batch] f32 (model/layers.h Scratch)
    uint64_t logits = 0;     // head buffers (head device), logits returned (host)
    uint64_t workspace = 0;  // cuBLAS, matmul input scratch, attention split scratch (GPU)
    uint64_t runtime = 0;    // CUDA context (GPU), pinned upload staging (host)
    uint64_t offload = 0;    // prompt offload: weight arenas + shadow DeltaNet state (its KV shadow is in kv_cache)
    uint64_t padding = 0;    // GPU: cudaMalloc rounding of all the above
    uint64_t total() const;  // saturates instead of wrapping
};

struct Split {
    int gpu_layers = 0;
    int64_t n_ctx = 0;
    bool head_on_gpu = false;
    bool embed_on_gpu = false;
    int64_t gpu_attention_layers = 0;
    int64_t gpu_recurrent_layers = 0;
    DeviceBytes gpu, host;
    // Not in the totals: the f16 copies the CUDA backend keeps of the GPU
    // layers' quantized prompt-product weights, made only into memory that
    // stays a quarter free after each (runtime/cuda/cuda_backend.cpp, f16_copy).
    uint64_t gpu_f16_copies = 0;
};

struct MemoryPlan {
    std::string model;  // path or preset name
    HParams hp;
    PlanOptions opt;
    std::vector<LayerPlan> layers;
    uint64_t token_embd_bytes = 0;
    uint64_t output_bytes = 0;       // output.weight; 0 when tied to token_embd
    uint64_t output_norm_bytes = 0;
    uint64_t unused_bytes = 0;       // tensors the engine does not load (MTP layers, vision, ...)
    int64_t unused_tensors = 0;
    uint64_t kv_bytes_per_token = 0;       // all attention layers, one sequence, at opt.kv_type
    uint64_t recurrent_bytes_per_seq = 0;  // all DeltaNet layers: conv + S
    // Activation buffers per backend (model.cpp alloc_scratch): the base set
    // every used backend has, plus the attention and DeltaNet sets where it
    // runs such layers, plus the head's buffers on the head's backend.
    uint64_t scratch_base_bytes = 0;
    uint64_t scratch_attention_bytes = 0;
    uint64_t scratch_deltanet_bytes = 0;
    uint64_t head_buffer_bytes = 0;
    uint64_t logit_bytes = 0;              // logits returned by one forward call (host)
    uint64_t attention_split_bytes = 0;    // GPU decode attention partial results at opt.n_ctx
    uint64_t attention_split_bytes_at(int64_t n_ctx) const;
    // GPU allocation rounding of the buffer sets above and of the global tensors.
    uint64_t scratch_base_padding = 0, scratch_attention_padding = 0, scratch_deltanet_padding = 0;
    uint64_t head_padding = 0;             // token_embd, output, output_norm and head buffers
    uint64_t act_scratch_bytes = 0;        // GPU matmul input scratch (both buffers, allocated size)
    uint64_t f16_prefill_bytes = 0;        // GPU f16 weight chunk + f16 input for prompt steps (allocated)

    uint64_t layer_weight_bytes() const;   // sum over main layers
    uint64_t weight_bytes() const;         // everything the engine loads
    int n_layer() const { return int(layers.size()); }
    int max_gpu_layers() const { return n_layer() + 1; }  // all layers + embedding + head
    // Device totals for -ngl gpu_layers (clamped to [0, n_layer + 1]) at opt.n_ctx or n_ctx.
    Split split(int gpu_layers) const { return split(gpu_layers, opt.n_ctx); }
    Split split(int gpu_layers, int64_t n_ctx) const;
};

MemoryPlan plan_memory(const ModelDesc& model, const PlanOptions& opt);
MemoryPlan plan_memory(const gguf::File& f, const HParams& hp, const PlanOptions& opt);

// A safety margin that grows with the card: max(256 MiB, vram / 32).
uint64_t default_safety_margin(uint64_t vram_bytes);

// Whether a split fits: GPU total + margin <= free_vram (nothing on the GPU
// always fits) and, when host_bytes > 0, host total <= host_bytes.
bool split_fits(const Split& s, uint64_t free_vram_bytes, uint64_t safety_margin, uint64_t host_bytes = 0);

// The largest -ngl (0 .. n_layer + 1) whose split fits at plan.opt.n_ctx. Throws Error saying
// what is short when not even -ngl 0 (or any N the GPU holds) fits the host.
int recommend_gpu_layers(const MemoryPlan& plan, uint64_t free_vram_bytes, uint64_t safety_margin,
                         uint64_t host_bytes = 0);

// --gpu-layers auto for Model::load: the -ngl (0 .. n_layer + 1) for these
// settings on a device with free_vram_bytes free, as cudaMemGetInfo reports
// it once the CUDA context exists but before the backend is created (so the
// context is not counted again; cuBLAS and the buffers are), with the default
// safety margin. Never throws for lack of memory: 0 means "CPU only".
int auto_gpu_layers(const gguf::File& f, const HParams& hp, int64_t n_ctx, int n_slots, int n_batch,
                    GgmlType kv_type, uint64_t free_vram_bytes, bool op_offload = false);

// The largest context per slot (a multiple of 256, at most the trained
// context) for -ngl gpu_layers; 0 when even 256 tokens do not fit.
struct ContextFit {
    int64_t n_ctx = 0;
    const char* limited_by = "";  // "gpu", "host" or "trained context"
};
ContextFit max_context_fit(const MemoryPlan& plan, int gpu_layers, uint64_t free_vram_bytes, uint64_t safety_margin,
                           uint64_t host_bytes = 0);
inline int64_t max_context(const MemoryPlan& plan, int gpu_layers, uint64_t free_vram_bytes, uint64_t safety_margin,
                           uint64_t host_bytes = 0) {
    return max_context_fit(plan, gpu_layers, free_vram_bytes, safety_margin, host_bytes).n_ctx;
}

}  // namespace qinfer
