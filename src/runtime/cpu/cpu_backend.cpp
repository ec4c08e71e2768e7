#include "runtime/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "common/error.h"
#include "gguf/gguf.h"
#include "quant/cpu_matmul.h"
#include "quant/quant.h"

namespace qinfer {

namespace {
constexpr size_t kAlign = 64;

void* aligned_zeroed(size_t bytes) {
    size_t n = (bytes + kAlign - 1) / kAlign * kAlign;
    if (n == 0) n = kAlign;
#ifdef _WIN32
    void* p = _aligned_malloc(n, kAlign);
#else
    void* p = std::aligned_alloc(kAlign, n);
#endif
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, n);
    return p;
}

void aligned_release(void* p) {
#ifdef _WIN32
    _aligned_free(p);
#else
    std::free(p);
#endif
}
}  // namespace

std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<ThreadPool> pool) {
    return std::make_unique<CpuBackend>(std::move(pool));
}

CpuBackend::CpuBackend(std::shared_ptr<ThreadPool> pool) : pool_(std::move(pool)), profile_(OpProfile::from_env()) {
    if (!pool_) fail("CPU backend: no thread pool");
}

std::string CpuBackend::name() const { return strfmt("CPU (%d threads)", pool_->size()); }

CpuBackend::~CpuBackend() {
    for (void* p : owned_) aligned_release(p);
}

Tensor CpuBackend::alloc(GgmlType type, std::initializer_list<int64_t> ne, const char* name) {
    Tensor t;
    t.type = type;
    int i = 0;
    for (int64_t n : ne) t.ne[i++] = n;
    set_contiguous_strides(t);
    t.backend = this;
    t.name = name;
    t.data = aligned_zeroed(t.nbytes());
    owned_.insert(t.data);
    return t;
}

void CpuBackend::free(Tensor& t) {
    flush();
    auto it = owned_.find(t.data);
    if (it == owned_.end()) return;  // a weight view or a foreign pointer: nothing to free
    aligned_release(t.data);
    owned_.erase(it);
    t.data = nullptr;
}

Tensor CpuBackend::upload_weight(const gguf::TensorInfo& ti) {
    Tensor t;
    t.type = ti.type;
    for (int i = 0; i < 4; ++i) t.ne[i] = ti.ne[i];
    set_contiguous_strides(t);
    t.backend = this;
    t.name = ti.name.c_str();
    t.data = const_cast<uint8_t*>(ti.data);  // read-only mapping: ops never write weights
    return t;
}

void CpuBackend::write(const Tensor& dst, const void* src, size_t bytes, size_t offset) {
    flush();
    const OpTimer timer(profile_.get(), "write");
    std::memcpy(static_cast<uint8_t*>(dst.data) + offset, src, bytes);
}

void CpuBackend::read(const Tensor& src, void* dst, size_t bytes, size_t offset) {
    flush();
    const OpTimer timer(profile_.get(), "read");
    std::memcpy(dst, static_cast<const uint8_t*>(src.data) + offset, bytes);
}

void CpuBackend::fill_zero(const Tensor& t) {
    flush();
    const OpTimer timer(profile_.get(), "fill_zero");
    std::memset(t.data, 0, t.nbytes());
}

void CpuBackend::copy_bytes(const Tensor& t, size_t dst_offset, size_t src_offset, size_t bytes) {
    flush();
    const OpTimer timer(profile_.get(), "copy_bytes");
    std::memmove(static_cast<uint8_t*>(t.data) + dst_offset, static_cast<const uint8_t*>(t.data) + src_offset, bytes);
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
    flush();
    const OpTimer timer(profile_.get(), "copy");
    if (src.n_elements() != dst.n_elements() || src.type != dst.type)
        fail(strfmt("copy %s %s -> %s %s: shapes differ", src.name, shape_str(src).c_str(), dst.name,
                    shape_str(dst).c_str()));
    if (src.is_contiguous() && dst.is_contiguous()) {
        std::memcpy(dst.data, src.data, src.nbytes());
        return;
    }
    if (src.type != GgmlType::F32) fail("copy: strided copies are f32 only");
    const int64_t n = src.ne[0];
    parallel_rows(src.n_rows(), double(n), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) std::memcpy(row_at(dst, r), row_at(src, r), size_t(n) * 4);
    });
}

void CpuBackend::get_rows(const Tensor& w, const Tensor& ids, const Tensor& out) {
    flush();
    const OpTimer timer(profile_.get(), "get_rows");
    const int64_t T = ids.ne[0];
    const int32_t* id = static_cast<const int32_t*>(ids.data);
    for (int64_t t = 0; t < T; ++t)
        if (id[t] < 0 || id[t] >= w.ne[1])
            fail(strfmt("get_rows %s: row %d out of range (0..%lld)", w.name, id[t], (long long)w.ne[1] - 1));
    parallel_rows(T, 2.0 * double(w.ne[0]), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
            dequantize_row(w.type, w.row<uint8_t>(id[t]), out.row<float>(t), w.ne[0]);
    });
}

namespace {
bool overlaps(const Tensor& a, const Tensor& b) {
    const uint8_t* a0 = static_cast<const uint8_t*>(a.data);
    const uint8_t* b0 = static_cast<const uint8_t*>(b.data);
    return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}
}  // namespace

void CpuBackend::matmul(const Tensor& w, const Tensor& x, const Tensor& y, const Tensor* bias) {
    const int64_t K = w.ne[0], N = w.ne[1], T = x.ne[1];
    if (x.ne[0] != K || y.ne[0] != N || y.ne[1] != T || x.nb[1] != size_t(K) * 4 || y.nb[1] % 4 != 0 ||
        (bias && *bias && (bias->ne[0] != N || bias->type != GgmlType::F32)))
        fail(strfmt("matmul %s %s: x %s, y %s do not fit", w.name, shape_str(w).c_str(), shape_str(x).c_str(),
                    shape_str(y).c_str()));
    cpu_matmul_check(w.type, K, N, int64_t(y.nb[1] / 4));  // errors at the call, not at the deferred run
    // Join the held-back group when this product reads the same input and its
    // output collides with nothing the group reads or writes.
    bool join = !pending_.empty() && pending_x_.data == x.data && pending_x_.ne[0] == K && pending_x_.ne[1] == T &&
                !overlaps(y, x);
    for (size_t i = 0; join && i < pending_.size(); ++i) join = !overlaps(y, pending_[i].y);
    if (!join) flush();
    pending_x_ = x;
    pending_.push_back({w, y, bias && *bias ? *bias : Tensor{}});
}

void CpuBackend::run_pending() {
    std::vector<PendingMatmul> group;
    group.swap(pending_);  // empty even if a product throws
    const Tensor x = pending_x_;
    const int64_t K = x.ne[0], T = x.ne[1];
    std::vector<MatmulJob> jobs;
    for (const PendingMatmul& m : group)
        jobs.push_back({m.w.type, m.w.data, m.w.ne[1], static_cast<float*>(m.y.data), int64_t(m.y.nb[1] / 4)});
    std::string label;
    double weight_bytes = 0;
    if (profile_) {  // "matmul T=1 Q4_K x2": the group's types and sizes
        label = strfmt("matmul %s %s", T == 1 ? "T=1" : "T>1", type_name(group[0].w.type));
        for (const PendingMatmul& m : group) weight_bytes += double(m.w.nbytes());
        if (group.size() > 1) label += strfmt(" x%zu", group.size());
        label += strfmt(" %lldx%lld", (long long)K, (long long)group[0].w.ne[1]);
    }
    const OpTimer timer(profile_.get(), label.c_str(), weight_bytes);
    cpu_matmul_group(jobs.data(), jobs.size(), K, static_cast<const float*>(x.data), T, *pool_);
    for (const PendingMatmul& m : group) {
        if (!m.bias) continue;
        const float* bv = static_cast<const float*>(m.bias.data);
        for (int64_t t = 0; t < T; ++t) {
            float* yr = m.y.row<float>(t);
            for (int64_t i = 0; i < m.w.ne[1]; ++i) yr[i] += bv[i];
        }
    }
}

void CpuBackend::argmax(const Tensor& logits, const Tensor& ids) {
    flush();
    const OpTimer timer(profile_.get(), "argmax");
    const int64_t V = logits.ne[0], T = logits.ne[1];
    if (ids.type != GgmlType::I32 || ids.ne[0] < T || logits.type != GgmlType::F32)
        fail(strfmt("argmax: logits %s / ids %s do not fit", shape_str(logits).c_str(), shape_str(ids).c_str()));
    int32_t* out = static_cast<int32_t*>(ids.data);
    // Each row in slices, so a decode step's one row of ~250k logits is read by
    // the whole pool; the slices' maxima are combined in order, so the first
    // maximum wins (lowest index on ties) as in one pass over the row.
    constexpr int64_t kSlice = 16384;
    const int64_t n_slices = (V + kSlice - 1) / kSlice;
    std::vector<int64_t> best(size_t(T * n_slices));
    parallel_rows(T * n_slices, 4.0 * double(std::min(V, kSlice)), [&](int64_t first, int64_t last) {
        for (int64_t i = first; i < last; ++i) {
            const float* row = logits.row<float>(i / n_slices);
            const int64_t s0 = (i % n_slices) * kSlice, s1 = std::min(V, s0 + kSlice);
            best[size_t(i)] = std::max_element(row + s0, row + s1) - row;
        }
    });
    for (int64_t t = 0; t < T; ++t) {
        const float* row = logits.row<float>(t);
        int64_t b = best[size_t(t * n_slices)];
        for (int64_t s = 1; s < n_slices; ++s)
            if (row[b] < row[best[size_t(t * n_slices + s)]]) b = best[size_t(t * n_slices + s)];
        out[t] = int32_t(b);
    }
}

void CpuBackend::top_k(const Tensor& logits, const Tensor& values, const Tensor& ids) {
    flush();
    const OpTimer timer(profile_.get(), "top_k");
    check_top_k_shapes(logits, values, ids);
    const int64_t V = logits.ne[0], T = logits.ne[1], k = values.ne[0];
    // Slices of each row on the pool (as argmax), then the slices' bests merged.
    constexpr int64_t kSlice = 16384;
    const int64_t n_slices = (V + kSlice - 1) / kSlice;
    std::vector<std::vector<uint64_t>> best(size_t(T * n_slices));
    parallel_rows(T * n_slices, 4.0 * double(std::min(V, kSlice)), [&](int64_t first, int64_t last) {
        for (int64_t i = first; i < last; ++i) {
            const int64_t s0 = (i % n_slices) * kSlice;
            top_k_slice(logits.row<float>(i / n_slices), s0, std::min(V, s0 + kSlice), k, best[size_t(i)]);
        }
    });
    std::vector<uint64_t> all;
    for (int64_t t = 0; t < T; ++t) {
        all.clear();
        for (int64_t s = 0; s < n_slices; ++s)
            all.insert(all.end(), best[size_t(t * n_slices + s)].begin(), best[size_t(t * n_slices + s)].end());
        std::partial_sort(all.begin(), all.begin() + k, all.end(), std::greater<uint64_t>());
        const float* row = logits.row<float>(t);
        float* v = values.row<float>(t);
        int32_t* id = ids.row<int32_t>(t);
        for (int64_t j = 0; j < k; ++j) {
            id[j] = int32_t(top_k_index(all[size_t(j)]));
            v[j] = row[id[j]];
        }
    }
}

}  // namespace qinfer
