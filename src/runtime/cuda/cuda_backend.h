// CUDA backend: weights, KV cache, recurrent state and activations in device
// memory (plain cudaMalloc); every op is an enqueue on one stream; nothing comes
// back to the host inside a step except through read(). Decode steps can be
// recorded once as a CUDA graph and replayed (begin_graph / end_graph).
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/backend.h"
#include "runtime/cuda/kernels.h"

namespace qinfer {

class CudaBackend final : public Backend {
public:
    // memory_limit > 0: allocations beyond that many bytes fail with a clear
    // error as if the device were that small (--vram-limit).
    explicit CudaBackend(int device = 0, uint64_t memory_limit = 0);
    uint64_t memory_in_use() const { return in_use_; }
    ~CudaBackend() override;

    std::string name() const override;
    bool host_memory() const override { return false; }
    // f16, f32 and q8_0 (GGUF blocks, quantized as the CPU backend does).
    bool supports_kv_type(GgmlType t) const override;

    Tensor alloc(GgmlType type, std::initializer_list<int64_t> ne, const char* name) override;
    void free(Tensor& t) override;
    Tensor upload_weight(const gguf::TensorInfo& ti) override;
    void write(const Tensor& dst, const void* src, size_t bytes, size_t offset) override;
    void read(const Tensor& src, void* dst, size_t bytes, size_t offset) override;
    uint64_t read_async(const Tensor& src, size_t bytes, size_t offset) override;
    void finish_read(uint64_t ticket, void* dst) override;
    void fill_zero(const Tensor& t) override;
    void synchronize() override;

    void get_rows(const Tensor& w, const Tensor& ids, const Tensor& out) override;
    void matmul(const Tensor& w, const Tensor& x, const Tensor& y, const Tensor* bias) override;
    void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override;
    void l2_norm(const Tensor& x, float eps, const Tensor& y) override;
    void rms_norm_gated(const Tensor& x, const Tensor& w, const Tensor& z, float eps, const Tensor& y) override;
    void add(const Tensor& a, const Tensor& b, const Tensor& y) override;
    void swiglu(const Tensor& gate, const Tensor& up, const Tensor& y) override;
    void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& y) override;
    void rope_neox(const Tensor& x, const StepInfo& step, int n_rot, float base, float freq_scale) override;
    void attention(const Tensor& q, const Tensor& k, const Tensor& v, const KvCache& cache, const StepInfo& step,
                   float scale, const Tensor& out) override;
    void conv1d_silu(const Tensor& x, const Tensor& w, const RecurrentState& state, const StepInfo& step,
                     const Tensor& out) override;
    void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
                          const Tensor& dt_bias, const Tensor& ssm_a, const RecurrentState& state,
                          const StepInfo& step, const Tensor& out) override;
    void copy(const Tensor& src, const Tensor& dst) override;
    void copy_bytes(const Tensor& t, size_t dst_offset, size_t src_offset, size_t bytes) override;

    size_t weight_bytes(GgmlType type, const int64_t ne[4]) const override;
    Tensor stream_weight(const Tensor& arena, size_t offset, GgmlType type, const int64_t ne[4], const void* src,
                         const char* name) override;
    bool pin_streamed_range(const void* host, size_t bytes) override;

    void argmax(const Tensor& logits, const Tensor& ids) override;
    void top_k(const Tensor& logits, const Tensor& values, const Tensor& ids) override;
    bool begin_graph(uint64_t key, bool record = true) override;
    void end_graph() override;
    void abort_graph() override;

    // A weight from raw GGUF block bytes (what upload_weight does with a mapped
    // tensor); used by tests and tools that build weights in memory.
    Tensor upload_weight_bytes(GgmlType type, std::initializer_list<int64_t> ne, const void* data, const char* name);

    cudaStream_t stream() const { return stream_; }
    // Load statistics: bytes and seconds spent uploading weights.
    double upload_seconds() const { return upload_s_; }
    uint64_t upload_bytes() const { return upload_bytes_; }

private:
    struct WeightInfo {
        cuda::DeviceWeight dw;
        bool resident = false;      // uploaded for good (not streamed into a reused arena)
        void* f16 = nullptr;        // the weight dequantized to f16 (f16_copy)
        bool f16_declined = false;  // no room for f16 when it was first wanted
        size_t f16_bytes() const { return size_t(dw.N) * size_t(dw.K) * 2; }
    };
    // A growing device buffer (reallocated outside graph capture only).
    struct Scratch {
        void* p = nullptr;
        size_t bytes = 0;
    };
    void* scratch(Scratch& s, size_t bytes, const char* what);
    void* device_malloc(size_t bytes, const char* what);
    void device_free(void* p, size_t bytes);
    cuda::DeviceWeight device_weight(const Tensor& w) const;
    const void* f16_copy(const cuda::DeviceWeight& dw);
    bool f16_copy_fits(size_t bytes) const;
    Tensor weight_desc(GgmlType type, const int64_t ne[4], const char* name) const;
    void gate_op(cuda::Gate g, const Tensor& a, const Tensor& b, const Tensor& y, const char* what);
    Tensor upload_blocks(GgmlType type, const int64_t ne[4], const void* data, const char* name);
    void copy_weight_blocks(GgmlType type, const cuda::WeightLayout& l, int64_t n_blocks, const uint8_t* src,
                            uint8_t* dst);
    // Quantized activations of x for weight type wt, reusing the last result
    // while x was not written since.
    cuda::ActQ activations(GgmlType wt, const Tensor& x, int64_t K, int64_t T);
    void wrote(const Tensor& t);  // an op wrote t: drop cached activations that overlap it
    // The kernel chain: kernels queued since the last copy, memset or
    // synchronization run under programmatic dependent launch, so a kernel's
    // start may overlap the kernels before it in the chain, never what came
    // before the chain. A KV cache or recurrent state that no kernel of the
    // chain wrote may be loaded before the reader's wait (tensors by address).
    bool written_in_chain(const void* p) const;
    void chain_wrote(const void* p);
    void chain_break() { chain_written_.clear(); }
    void tag_norm(const cuda::NormJob& j);  // the op just queued is this norm (for fusion at flush)
    void check_ours(const Tensor& t, const char* op) const;
    void print_load_stats_once();

    int device_ = 0;
    std::string name_;
    std::vector<const void*> chain_written_;  // caches and states written in the chain (a few per layer)
    cudaStream_t stream_ = nullptr;
    cudaStream_t upload_stream_ = nullptr;
    void* cublas_ = nullptr;  // cublasHandle_t
    std::unordered_map<const void*, size_t> owned_;  // allocation -> bytes
    uint64_t limit_ = 0;   // bytes this backend may allocate (0: no limit but the device's)
    uint64_t in_use_ = 0;  // bytes allocated now
    std::unordered_map<const void*, WeightInfo> weights_;

    // pinned staging ring for weight uploads
    static constexpr int kStaging = 3;
    static constexpr size_t kStagingBytes = size_t(32) << 20;
    void* staging_[kStaging] = {};
    cudaEvent_t staging_done_[kStaging] = {};
    int staging_next_ = 0;
    double upload_s_ = 0;
    uint64_t upload_bytes_ = 0;
    bool load_stats_printed_ = false;
    // stream_weight: the compute stream waits for the copy.
    cudaEvent_t streamed_ = nullptr;
    // Host ranges registered with cudaHostRegister (copied from by DMA), and
    // the device buffer raw blocks of repacked types land in before the kernel
    // splits them into the layout.
    std::vector<std::pair<const uint8_t*, size_t>> pinned_ranges_;
    void* raw_stage_ = nullptr;
    size_t raw_stage_bytes_ = 0;
    bool in_pinned_range(const void* p, size_t bytes) const;

    Scratch act_buf_[2];
    struct ActCache {
        const void* x = nullptr;
        int64_t K = 0, T = 0;
        size_t ldx = 0;
        cuda::ActKind kind = cuda::ActKind::F32;
        bool valid = false;
    } act_cache_[2];
    int act_next_ = 0;
    Scratch attn_work_, half_w_, half_x_, ids_buf_;
    Scratch top_k_work_;
    Scratch cublas_ws_;
    Scratch ffn_barrier_;  // the grid barrier words of the FFN kernel (zeroed once)

    // ---- deferred execution and automatic graphs
    // Ops are queued with a byte signature of everything that shapes their
    // launches (pointers, sizes, scalars) and run at the next sync point (read,
    // synchronize, free, scratch growth). A queue whose signature was seen before
    // is captured as a CUDA graph the second time and replayed from then on; the
    // data of queued write()s travels through pinned buffers owned by the graph.
    // So any model code gets graph replay for repeated steps (decode) without
    // changes. QINFER_CUDA_GRAPHS=0 runs every op at once instead.
    struct Payload {
        void* dst;
        std::vector<uint8_t> data;
    };
    struct PendingOp {
        std::function<void()> run;  // empty for a write (payload index)
        int payload = -1;
        // What peephole fusion at flush needs to know (kind 0: opaque).
        enum Kind { Opaque = 0, Matvec = 1, Add = 2, Norm = 3, Gate = 4, Quantize = 5, Rope = 6, Conv = 7, Gdr = 8,
                    Attention = 9 } kind = Opaque;
        cuda::MatvecJob mv;  // Matvec: quantized weight, T <= 8
        cuda::ActQ act;
        int64_t T = 0;
        cuda::Rows a, b, y;  // Add, Gate (a, b -> y)
        cuda::NormJob norm;  // Norm
        cuda::RopeJob rope;  // Rope
        cuda::Gate gate = cuda::Gate::Swiglu;
        cuda::ActDest dest;  // Quantize: what it quantizes, and where to
        cuda::ConvAfter conv;  // Conv of one token (n_seg == 1, T == 1): its input is a
        const float* conv_x = nullptr;  // product's output and it may ride in that launch
        int64_t conv_C = 0;
        cuda::DeltaArgs gdr{};  // Gdr (all segments on the serial kernel): the call,
        const cuda::Segment* gdr_seg = nullptr;  // which may take over the l2 norms
        int gdr_n_seg = 0, gdr_max_len = 0;      // of q and k just before it
        cuda::KvStoreJob kv_store;  // Attention: its cache store, which the q / k norm + rope
        int64_t kv_T = 0;           // launch may take over (kv_T tokens), and the attention alone,
        std::function<bool(const cuda::AttnQuant*)> run_attention;  // maybe with the quantization after it
        std::string label;   // QINFER_CUDA_PROFILE only
        uint32_t code = 0;   // the op's signature code (op_name)
    };
    bool fuse_ = true;
    // Norms, swiglu and sigmoid_mul computed inside the activation quantization
    // that follows them, and two independent norms in one launch
    // (QINFER_CUDA_FUSE_NORM=0 turns just these off).
    bool fuse_norm_ = true;
    // A decode step's conv1d in the epilogue of the product that makes its
    // input (QINFER_CUDA_FUSE_CONV=0 turns just this off).
    bool fuse_conv_ = true;
    // The l2 norms of q and k inside a serial delta rule (QINFER_CUDA_FUSE_L2=0: separate).
    bool fuse_l2_ = true;
    // A decode step's gated norm of the delta rule's output, and its quantization,
    // inside the delta rule's launch (QINFER_CUDA_FUSE_GDR_NORM=0: separate).
    bool fuse_gdr_norm_ = true;
    // A decode step's K / V cache rows written by the q / k norm + rope launch
    // before the attention (QINFER_CUDA_FUSE_KV_STORE=0: kv_store's own launch).
    bool fuse_kv_store_ = true;
    // A decode step's quantization of the attention's output (after its sigmoid
    // gate, qwen35) inside the launch that merges the key-range splits
    // (QINFER_CUDA_FUSE_ATTN_QUANT=0: separate).
    bool fuse_attn_quant_ = true;
    // A one-token FFN block (norm .. down + residual) as one launch
    // (cuda::ffn_decode), with QINFER_CUDA_FUSE_FFN=1 only: bit-identical, but
    // tg128 450 vs 507 tok/s on an H200 in its first form (docs/cuda-notes.md).
    bool fuse_ffn_ = false;
    uint64_t fused_producers_ = 0;
    struct GraphRec {
        std::vector<uint8_t> sig;
        cudaGraphExec_t exec = nullptr;
        std::vector<void*> pinned;  // one per payload, in queue order
        cudaEvent_t done = nullptr;
        int seen = 0;
        uint64_t hits = 0;
    };
    bool deferring() const { return graphs_enabled_; }
    template <class... A> void sig(const A&... a);
    void enqueue(std::function<void()> fn);
    void flush();
    void run_pending(const std::vector<void*>* pinned);
    void destroy_graph(GraphRec& g);
    void drop_graphs();  // after freeing memory a recorded step may point at

    bool graphs_enabled_ = true;
    bool capturing_ = false;
    std::vector<PendingOp> pending_;
    std::vector<Payload> payloads_;
    std::vector<uint8_t> sig_;
    std::unordered_map<uint64_t, GraphRec> auto_graphs_;
    // explicit begin_graph / end_graph
    std::unordered_map<uint64_t, GraphRec> keyed_graphs_;
    bool in_keyed_ = false, keyed_replay_ = false, keyed_eager_ = false;
    uint64_t keyed_key_ = 0;
    uint64_t graph_launches_ = 0, eager_flushes_ = 0;

    // QINFER_CUDA_PROFILE=1: every queued op runs eagerly between timing
    // events (no graphs), and the backend prints GPU time per op at exit.
    struct ProfileStat {
        uint64_t calls = 0;
        double ms = 0;
    };
    bool profile_ = false;
    size_t last_sig_at_ = 0;    // where the latest op's signature starts in sig_
    std::string next_label_;    // a more specific label for the next enqueue (matmul)
    std::map<std::string, ProfileStat> profile_stats_;
    std::vector<cudaEvent_t> profile_events_;
    // read_async's copies: pinned landing buffers, each with the event that
    // marks its copy done; a slot is free again once its ticket is finished.
    struct AsyncRead {
        void* pinned = nullptr;
        size_t capacity = 0, bytes = 0;
        cudaEvent_t done = nullptr;
        uint64_t ticket = 0;  // 0: free
    };
    std::vector<AsyncRead> async_reads_;
    uint64_t next_read_ticket_ = 1;
    int* hold_flag_ = nullptr;  // host-mapped; see cuda::hold_until
    int* hold_flag_dev_ = nullptr;
    int hold_value_ = 0;
    void warm_up_cublas();
    bool try_ffn(size_t i);
    cuda::FfnJob ffn_job_;
    uint32_t last_op_code() const;      // the op whose signature was added last
    std::string profile_label() const;  // of that op
    // QINFER_CUDA_SKIP_OPS=name[:name...]: ops of these kinds are not run at all
    // (a what-if for timing: the outputs are wrong). "matmul:add" leaves a
    // decode step without its products, for instance.
    std::vector<uint32_t> skip_ops_;
    void print_profile() const;

public:
    // Steps replayed from graphs / run eagerly so far (for benchmarks and tests).
    uint64_t graph_launches() const { return graph_launches_; }
    uint64_t eager_flushes() const { return eager_flushes_; }
    // Producers (norms, swiglu, sigmoid_mul) issued fused with the activation
    // quantization after them, and norm pairs issued as one launch (counted when
    // issued, not per graph replay).
    uint64_t fused_producers() const { return fused_producers_; }
};

}  // namespace qinfer
