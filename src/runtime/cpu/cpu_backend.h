// CPU backend: host memory, weights used in place from the memory-mapped GGUF,
// ops run on a shared thread pool. Every op runs when it is issued except
// matmul: consecutive matmuls on the same input (q/k/v, the DeltaNet input
// projections, FFN gate/up) are held back and run as one group, one parallel
// region instead of one per matrix. Any other call, read() and synchronize()
// included, runs the held-back group first.
#pragma once
#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "common/thread_pool.h"
#include "runtime/cpu/cpu_profile.h"
#include "runtime/backend.h"

namespace qinfer {

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(std::shared_ptr<ThreadPool> pool);
    ~CpuBackend() override;

    std::string name() const override;
    bool host_memory() const override { return true; }
    bool supports_kv_type(GgmlType t) const override {
        return t == GgmlType::F16 || t == GgmlType::F32 || t == GgmlType::Q8_0;
    }
    ThreadPool& pool() { return *pool_; }

    Tensor alloc(GgmlType type, std::initializer_list<int64_t> ne, const char* name) override;
    void free(Tensor& t) override;
    Tensor upload_weight(const gguf::TensorInfo& ti) override;
    void write(const Tensor& dst, const void* src, size_t bytes, size_t offset) override;
    void read(const Tensor& src, void* dst, size_t bytes, size_t offset) override;
    void fill_zero(const Tensor& t) override;
    void synchronize() override { flush(); }
    void end_graph() override { flush(); }

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
    void argmax(const Tensor& logits, const Tensor& ids) override;
    void top_k(const Tensor& logits, const Tensor& values, const Tensor& ids) override;

    // Calls fn(first, last) over [0, n) items of about `work` multiply-adds
    // each, in chunks spread over the pool; small ops run on the calling thread,
    // where a parallel region would cost more than it saves. Items must be
    // independent, so results never depend on the thread count.
    template <class F> void parallel_rows(int64_t n, double work, F&& fn) {
        if (n <= 0) return;
        constexpr double kMinWork = 32768;  // per chunk: ~10 us, well above a region's overhead
        const int64_t nt = pool_->size();
        int64_t chunk = (n + nt * 4 - 1) / (nt * 4);
        const int64_t min_chunk = int64_t(kMinWork / std::max(work, 1.0)) + 1;
        if (chunk < min_chunk) chunk = min_chunk;
        if (nt == 1 || chunk >= n) {
            fn(int64_t(0), n);
            return;
        }
        const int64_t n_chunks = (n + chunk - 1) / chunk;
        pool_->parallel_for(n_chunks, [&](int64_t c, int) {
            const int64_t first = c * chunk;
            fn(first, first + chunk < n ? first + chunk : n);
        });
    }

    // Elementwise ops: calls fn(row, first, last) over column ranges of n_rows
    // rows of n elements, so a decode step's single long row (swiglu over ~9k
    // values) is spread over the pool too. `work` is the cost of one element
    // in multiply-adds (an exp counts ~16).
    template <class F> void parallel_cols(int64_t n_rows, int64_t n, double work, F&& fn) {
        constexpr int64_t kCols = 1024;
        const int64_t per_row = (n + kCols - 1) / kCols;
        parallel_rows(n_rows * per_row, work * double(std::min(n, kCols)), [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) {
                const int64_t c0 = (i % per_row) * kCols;
                fn(i / per_row, c0, std::min(n, c0 + kCols));
            }
        });
    }

private:
    // Runs the held-back matmuls (see the file comment).
    void flush() {
        if (!pending_.empty()) run_pending();
    }
    void run_pending();

    struct PendingMatmul {
        Tensor w, y, bias;
    };
    std::vector<PendingMatmul> pending_;
    Tensor pending_x_;

    // cos / sin of the last rope_neox call: every layer's q and k of a step
    // rotate by the same positions and frequencies.
    struct RopeTable {
        std::vector<int32_t> pos;
        int n_rot = 0;
        float base = 0, freq_scale = 0;
        std::vector<float> cs;  // per token and pair: cos, sin
    };
    RopeTable rope_;

    std::shared_ptr<ThreadPool> pool_;
    std::set<void*> owned_;
    std::unique_ptr<OpProfile> profile_;  // QINFER_CPU_PROFILE=1
};

// Row r of a tensor viewed as n_rows() rows of ne[0] elements.
inline float* row_at(const Tensor& t, int64_t r) {
    int64_t i1 = r % t.ne[1];
    int64_t rest = r / t.ne[1];
    return t.row<float>(i1, rest % t.ne[2], rest / t.ne[2]);
}

}  // namespace qinfer
