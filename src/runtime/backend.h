// The compute backend interface: a small, explicit set of ops on tensors the
// backend owns (CPU memory, or CUDA device memory). Model code calls only these
// ops and never asks which backend it runs on.
//
// Ops are enqueues: they may run asynchronously (the CUDA backend records a
// whole decode step into a graph), outputs are preallocated by the caller and
// nothing is read back to the host inside a step except through read(), which
// synchronizes. All activations are f32; weights may be any supported GGUF type.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "quant/types.h"
#include "runtime/top_k_order.h"

namespace qinfer {
namespace gguf { struct TensorInfo; }

class Backend;

// A view of (part of) a buffer owned by a backend. Plain value type: copying a
// Tensor copies the view, not the data. ne[0] is the contiguous dimension
// (ggml order); nb[] are byte strides (nb[0] is always the element / block size).
// Row-wise ops treat a tensor as rows of ne[0] elements indexed by (i1, i2, i3).
struct Tensor {
    GgmlType type = GgmlType::F32;
    int64_t ne[4] = {1, 1, 1, 1};
    size_t nb[4] = {0, 0, 0, 0};
    void* data = nullptr;
    Backend* backend = nullptr;
    const char* name = "";  // for error messages and dumps (static storage or owned by the binder)

    explicit operator bool() const { return data != nullptr; }
    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
    bool is_contiguous() const;
    size_t nbytes() const;  // contiguous size (ne * strides); views: span from data to the last byte

    // Row (i1, i2, i3) of ne[0] elements.
    template <class T = float> T* row(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
        return reinterpret_cast<T*>(static_cast<uint8_t*>(data) + i1 * nb[1] + i2 * nb[2] + i3 * nb[3]);
    }
};

// Contiguous strides for `ne` of type t.
void set_contiguous_strides(Tensor& t);
// A contiguous tensor of this type and extents owned by `backend` (data unset).
Tensor tensor_desc(GgmlType type, const int64_t ne[4], Backend* backend, const char* name);
// A view of t with extents ne and byte strides nb for dims 1.. (dim 0 stays
// contiguous; omitted strides are contiguous), starting `offset` bytes into t.
Tensor view(const Tensor& t, std::initializer_list<int64_t> ne, std::initializer_list<size_t> nb, size_t offset = 0);
// The first n rows (ne[1]) of a 2-D tensor, e.g. the first T tokens of an
// [E, n_batch] scratch buffer.
Tensor first_rows(const Tensor& t, int64_t n);
// A contiguous tensor reinterpreted with other extents (same element count).
Tensor reshape(const Tensor& t, std::initializer_list<int64_t> ne);
std::string shape_str(const Tensor& t);

// Appends to `best` the (at most) k largest top_k_order values of row[begin, end), unsorted.
void top_k_slice(const float* row, int64_t begin, int64_t end, int64_t k, std::vector<uint64_t>& best);
// Throws unless top_k's tensors fit each other (see Backend::top_k).
void check_top_k_shapes(const Tensor& logits, const Tensor& values, const Tensor& ids);

// Per-step token metadata, prepared once per forward call on every backend that
// runs part of it. Host copies size the work; device copies feed the kernels.
struct StepInfo {
    int n_tokens = 0;
    // host
    std::vector<int32_t> pos;   // position of each token in its sequence
    std::vector<int32_t> slot;  // state slot of each token
    struct Segment {
        int32_t first;  // first token index in the batch
        int32_t count;  // tokens of this segment (consecutive positions, one slot)
        int32_t slot;
        int32_t pos0;   // position of the first token
    };
    std::vector<Segment> segments;  // runs of one slot, in batch order
    // The most tokens of one sequence in this step (decode steps: 1 per sequence).
    int max_segment_len() const {
        int n = 0;
        for (const Segment& sg : segments) n = sg.count > n ? int(sg.count) : n;
        return n;
    }
    // on the backend (I32 [n_batch]; only the first n_tokens entries are valid)
    Tensor pos_t;
    Tensor slot_t;
    Tensor seg_t;  // I32 [4, n_seg_max]: Segment fields, first segments.size() rows valid
};

// One attention layer's cache: K and V as {head_dim, n_kv, n_ctx, n_slots}
// (F16, F32 or Q8_0: Backend::supports_kv_type). K is stored after q/k-norm and RoPE, V raw.
struct KvCache {
    Tensor k;
    Tensor v;
};

// One Gated DeltaNet layer's state: conv {C, K-1, n_slots} (raw pre-conv
// projections of the last K-1 tokens, oldest first) and S {d_k, d_v, H_v, n_slots}
// (f32, key index contiguous: element (key i, value j, head h)).
struct RecurrentState {
    Tensor conv;
    Tensor S;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;  // "CPU", "CUDA0"
    // True when tensor data is ordinary host memory the CPU may touch directly.
    virtual bool host_memory() const = 0;
    // Whether attention() takes a KV cache of this type (f16 and f32 everywhere).
    virtual bool supports_kv_type(GgmlType t) const { return t == GgmlType::F16 || t == GgmlType::F32; }

    // ---- memory
    // Zero-initialized buffer; freed by free() or when the backend is destroyed.
    virtual Tensor alloc(GgmlType type, std::initializer_list<int64_t> ne, const char* name = "") = 0;
    virtual void free(Tensor& t) = 0;
    // Makes a GGUF tensor usable by this backend's ops (CPU: zero-copy view into
    // the mapped file; GPU: copy to device memory).
    virtual Tensor upload_weight(const gguf::TensorInfo& ti) = 0;
    // Host <-> backend copies of `bytes` bytes at byte `offset` of a contiguous
    // tensor. write() may return before the copy finishes only if `src` stays
    // valid until the next synchronize(); read() synchronizes.
    virtual void write(const Tensor& dst, const void* src, size_t bytes, size_t offset = 0) = 0;
    virtual void read(const Tensor& src, void* dst, size_t bytes, size_t offset = 0) = 0;
    virtual void fill_zero(const Tensor& t) = 0;  // contiguous tensor
    // A read that need not wait: read_async takes `bytes` bytes of src as the
    // work enqueued before it leaves them (work enqueued after it may overwrite
    // src) and returns at once with a ticket; finish_read(ticket, dst) waits for
    // that copy and delivers it, once per ticket. The default reads at once (a
    // backend whose ops have run when they return).
    virtual uint64_t read_async(const Tensor& src, size_t bytes, size_t offset = 0);
    virtual void finish_read(uint64_t ticket, void* dst);
    // Waits for all enqueued work.
    virtual void synchronize() = 0;

    // ---- ops (all outputs preallocated; in-place where noted)
    // out[:, t] = dequantize(w row ids[t]).  w {E, V} any type, ids I32 [T], out f32 [E, T].
    virtual void get_rows(const Tensor& w, const Tensor& ids, const Tensor& out) = 0;
    // y[:, t] = W x[:, t] (+ bias). W {K, N} any type, x f32 [K, T] contiguous rows,
    // y f32 [N, T] (rows may be strided), bias f32 [N] or empty.
    virtual void matmul(const Tensor& w, const Tensor& x, const Tensor& y, const Tensor* bias = nullptr) = 0;
    // Per row over ne[0]: y = x / sqrt(mean(x^2) + eps) * w. x and y may be strided
    // views and may alias (in place). w f32 [ne0].
    virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) = 0;
    // Per row: y = x / max(||x||, eps).  May be in place.
    virtual void l2_norm(const Tensor& x, float eps, const Tensor& y) = 0;
    // Per row: y = RMSNorm(x; w, eps) * silu(z). x, z, y with the same shape.
    virtual void rms_norm_gated(const Tensor& x, const Tensor& w, const Tensor& z, float eps, const Tensor& y) = 0;
    // y = a + b (same shape; y may alias a).
    virtual void add(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
    // y = silu(gate) * up.
    virtual void swiglu(const Tensor& gate, const Tensor& up, const Tensor& y) = 0;
    // y = x * sigmoid(gate), elementwise; gate may be a strided view.
    virtual void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& y) = 0;
    // In place NEOX rotary embedding of x {d, n_heads, T} (rows may be strided):
    // pairs (i, i + n_rot/2) for i < n_rot/2, angle pos[t] * freq_scale * base^(-2i/n_rot);
    // dims >= n_rot unchanged.
    virtual void rope_neox(const Tensor& x, const StepInfo& step, int n_rot, float base, float freq_scale) = 0;
    // Causal GQA attention. Writes k, v {d, n_kv, T} into the cache at (slot[t], pos[t]),
    // then for every token t and q head h (kv head h / (n_head/n_kv)):
    // out[:, h, t] = softmax_j(scale * q.K[j]) V[j] over positions j <= pos[t] of slot[t].
    // q {d, n_head, T}, out {d, n_head, T} contiguous.
    virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const KvCache& cache,
                           const StepInfo& step, float scale, const Tensor& out) = 0;
    // Causal depthwise conv over each segment's [conv state; x] window, then SiLU:
    // out[c, t] = silu(sum_r w[c][r] x[c, t-(K-1)+r]). Updates the conv state.
    // x f32 [C, T], w f32 {K, C}, out f32 [C, T].
    virtual void conv1d_silu(const Tensor& x, const Tensor& w, const RecurrentState& state, const StepInfo& step,
                             const Tensor& out) = 0;
    // Gated delta rule (spec/models.md §5.6 Step E), sequential per token within
    // each segment, reading and updating state.S of the segment's slot.
    // q, k {d_k, H_k, T} (already L2-normed; scaled here by 1/sqrt(d_k)),
    // v {d_v, H_v, T}; value head j uses key head j % H_k.
    // a, b f32 [H_v, T] raw projections: g = softplus(a + dt_bias) * ssm_a, beta = sigmoid(b).
    // out {d_v, H_v, T} contiguous.
    virtual void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a,
                                  const Tensor& b, const Tensor& dt_bias, const Tensor& ssm_a,
                                  const RecurrentState& state, const StepInfo& step, const Tensor& out) = 0;
    // dst = src element by element (shapes equal; src may be strided, dst contiguous).
    virtual void copy(const Tensor& src, const Tensor& dst) = 0;

    // ---- state slots (contiguous byte ranges of a state tensor)
    // Copies `bytes` bytes within one tensor's buffer: dst_offset <- src_offset.
    virtual void copy_bytes(const Tensor& t, size_t dst_offset, size_t src_offset, size_t bytes) = 0;

    // ---- weights streamed from the host (prompt offload: a layer that lives on
    // another backend runs here for one big batch, its weights copied in first)
    // Bytes a weight of this type and shape occupies on this backend.
    virtual size_t weight_bytes(GgmlType type, const int64_t ne[4]) const;
    // Copies a weight's blocks (GGUF layout at host address `src`) to byte
    // `offset` of `arena` (a buffer from alloc(); offset a multiple of 256) and
    // returns the weight there, usable by ops until those bytes are overwritten.
    // Ops issued after the call see the data. The copy is not ordered after
    // earlier ops (so it can overlap them): the caller makes sure none of them
    // still reads these bytes, e.g. by having read back a result computed after
    // them (read() and synchronize() wait). `src` must stay valid until the
    // next synchronize().
    virtual Tensor stream_weight(const Tensor& arena, size_t offset, GgmlType type, const int64_t ne[4],
                                 const void* src, const char* name);
    // Weights will be streamed from [host, host + bytes) (a read-only mapped
    // file) again and again: a backend may pin the range so that copies run
    // from it directly. Best effort; false when the range stays as it is. Pins
    // whole pages, read-only: the pages the range touches must belong to the
    // same mapping (a file mapping's do), or memory beside it becomes read-only
    // for the device too.
    virtual bool pin_streamed_range(const void* host, size_t bytes) { (void)host; (void)bytes; return false; }

    // ---- optional, for fast decode (the defaults run every op as issued)
    // ids[t] = argmax of logits[:, t], lowest index on ties. logits f32 [V, T],
    // ids I32 [T], both on this backend: a greedy step then copies back one id
    // per token instead of V floats.
    virtual void argmax(const Tensor& logits, const Tensor& ids);
    // The k = values.ne[0] largest logits of each row t < T: values[:, t] from
    // the largest down, the lower index first among equals (-0 counts as +0,
    // NaN below everything), their indices in ids[:, t]. logits f32 [V, T]
    // with k <= V; values f32 [k, T'] and ids I32 [k, T'] contiguous, T' >= T,
    // all on this backend: a sampling step copies back a few candidates per
    // token instead of V floats.
    virtual void top_k(const Tensor& logits, const Tensor& values, const Tensor& ids);
    // Step graphs. The ops issued between begin_graph(key) and end_graph() form
    // one step that a backend may record once and replay. begin_graph returns
    // false when a recording for `key` exists: the caller then skips issuing the
    // ops, and end_graph() replays it (either way the step has been enqueued when
    // end_graph returns). Rules for the caller: between the two calls issue ops
    // only (no write/read/alloc); every value that changes between steps must
    // come from tensors on this backend whose addresses never change (token ids,
    // StepInfo tensors, written before begin_graph); `key` identifies the rest
    // (token count, segment count, which rows get logits). record = false: a
    // step not worth recording (a long prompt chunk: its kernels take far longer
    // than issuing them, and its shape seldom repeats); it runs as issued.
    virtual bool begin_graph(uint64_t key, bool record = true) {
        (void)key;
        (void)record;
        return true;
    }
    virtual void end_graph() {}
    // After an error between begin_graph and end_graph: drop the half-issued
    // step so the backend is usable again (the step did not happen).
    virtual void abort_graph() {}

private:
    // read_async's copies for the default form, by ticket.
    std::map<uint64_t, std::vector<uint8_t>> early_reads_;
    uint64_t next_ticket_ = 1;
};

// Copies the contiguous tensor src to dst, which may live on another backend
// (the hidden state crossing between layers placed on different devices).
void copy_between(const Tensor& src, const Tensor& dst);

// The CPU backend (runtime/cpu). n_threads <= 0: physical cores. Several
// instances may share one thread pool (pass the same pool).
class ThreadPool;
std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<ThreadPool> pool);

// The CUDA backend (runtime/cuda) on GPU `device`. Throws Error when the build
// has no CUDA or no usable GPU is present. memory_limit > 0 caps the bytes it
// may allocate (allocations beyond it fail as if the device were that small).
std::unique_ptr<Backend> make_cuda_backend(int device = 0, uint64_t memory_limit = 0);
// Number of usable CUDA devices (0 without CUDA or without a GPU); never throws.
int cuda_device_count();
// Free and total device memory as cudaMemGetInfo reports it (this creates the
// CUDA context if it does not exist yet); false without CUDA or on error.
bool cuda_memory_info(int device, uint64_t* free_bytes, uint64_t* total_bytes);

}  // namespace qinfer
