// Test helpers shared by the CUDA attention tests (decode and prompt kernels):
// a device buffer, a KV cache on the device with the host copy of what it
// holds, and the attention those kernels must compute, in double precision.
// Include only where QINFER_HAVE_CUDA is defined.
#pragma once
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "common/fp16.h"
#include "quant/quant.h"
#include "cuda_testutil.h"
#include "runtime/cuda/kernels.h"

namespace qinfer::test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Device buffer of `bytes` (at least 16), freed with the object; p is null
// when the allocation failed.
struct Dev {
    void* p = nullptr;
    size_t bytes = 0;
    explicit Dev(size_t b) : bytes(std::max<size_t>(b, 16)) {
        if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
    }
    ~Dev() { cudaFree(p); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    template <typename T> T* as() const { return static_cast<T*>(p); }
};

// A KV cache {d, n_kv, n_ctx, n_slots} on the device, f16, f32 or q8_0, with
// a host copy (f32: the values the device holds, dequantized for q8_0) of the
// first `rows` positions of each slot (all by default; long caches keep only
// what the test fills). Everything not filled is NaN on both sides (0xFF
// bytes: a NaN f16 scale for q8_0), so a key read past what a step may see
// poisons the output.
struct KvTestCache {
    int64_t d, n_kv, n_ctx, n_slots, rows;
    GgmlType type;
    std::vector<float> k, v;
    Dev dk, dv;
    KvTestCache(int64_t d_, int64_t n_kv_, int64_t n_ctx_, int64_t n_slots_, GgmlType type_ = GgmlType::F16,
                int64_t rows_ = -1)
        : d(d_), n_kv(n_kv_), n_ctx(n_ctx_), n_slots(n_slots_), rows(rows_ < 0 ? n_ctx_ : std::min(rows_, n_ctx_)),
          type(type_), dk(bytes()), dv(bytes()) {
        if (dk.p) cudaMemset(dk.p, 0xFF, bytes());
        if (dv.p) cudaMemset(dv.p, 0xFF, bytes());
        k.assign(size_t(d * n_kv * rows * n_slots), kNaN);
        v.assign(k.size(), kNaN);
    }
    // Bytes of one kv head's row of d values.
    size_t head_row_bytes() const { return row_bytes(type, d); }
    size_t bytes() const { return size_t(n_kv * n_ctx * n_slots) * head_row_bytes(); }
    // Position p of slot s: its byte on the device, its first element in the host copy.
    size_t off_bytes(int64_t s, int64_t p) const { return size_t((s * n_ctx + p) * n_kv) * head_row_bytes(); }
    size_t hoff(int64_t s, int64_t p) const { return size_t((s * rows + p) * n_kv * d); }
    // Random rows [0, n) of slot s (rounded to what the cache holds); the rest
    // of the slot back to NaN.
    void fill(int64_t s, int64_t n, uint32_t seed) {
        ASSERT_LE(n, rows);
        const size_t row = size_t(n_kv * d);
        for (int which = 0; which < 2; ++which) {
            std::vector<float> x = randn(size_t(n) * row, seed + uint32_t(which));
            std::vector<float>& h = which ? v : k;
            char* base = static_cast<char*>((which ? dv : dk).p);
            std::vector<uint8_t> stored(size_t(n * n_kv) * head_row_bytes());
            for (size_t r = 0; r < size_t(n * n_kv); ++r) {  // one kv head's row at a time
                float* xr = x.data() + r * size_t(d);
                uint8_t* sr = stored.data() + r * head_row_bytes();
                quantize_row(type, xr, sr, d);
                dequantize_row(type, sr, xr, d);
            }
            ASSERT_EQ(cudaMemcpy(base + off_bytes(s, 0), stored.data(), stored.size(), cudaMemcpyHostToDevice),
                      cudaSuccess);
            ASSERT_EQ(cudaMemset(base + off_bytes(s, n), 0xFF, size_t(n_ctx - n) * size_t(n_kv) * head_row_bytes()),
                      cudaSuccess);
            std::copy(x.begin(), x.end(), h.begin() + std::ptrdiff_t(hoff(s, 0)));
            std::fill(h.begin() + std::ptrdiff_t(hoff(s, n)), h.begin() + std::ptrdiff_t(hoff(s + 1, 0)), kNaN);
        }
    }
    cuda::KvView view() const {
        cuda::KvView kv;
        kv.k = dk.p;
        kv.v = dv.p;
        kv.type = type;
        kv.d = d;
        kv.n_kv = n_kv;
        kv.n_ctx = n_ctx;
        kv.n_slots = n_slots;
        return kv;
    }
};

// softmax(scale q.K[j]) V[j] over j <= pos[t] of slot[t], in double, for the
// tokens listed (all when empty; the others NaN); q and out [T][n_head][d].
// Threads over tokens.
inline std::vector<float> ref_attention(const KvTestCache& c, const std::vector<float>& q, int64_t n_head,
                                        const std::vector<int32_t>& pos, const std::vector<int32_t>& slot, float scale,
                                        std::vector<int64_t> tokens = {}) {
    const int64_t d = c.d, group = n_head / c.n_kv, T = int64_t(pos.size());
    if (tokens.empty())
        for (int64_t t = 0; t < T; ++t) tokens.push_back(t);
    std::vector<float> out(size_t(T * n_head * d), kNaN);
    auto one = [&](int64_t t) {
        std::vector<double> sc, acc(static_cast<size_t>(d));
        for (int64_t h = 0; h < n_head; ++h) {
            const int64_t g = h / group, n = pos[size_t(t)] + 1, s = slot[size_t(t)];
            const float* qh = &q[size_t((t * n_head + h) * d)];
            sc.assign(size_t(n), 0.0);
            double mx = -INFINITY;
            for (int64_t j = 0; j < n; ++j) {
                const float* kr = &c.k[c.hoff(s, j) + size_t(g * d)];
                double dot = 0;
                for (int64_t e = 0; e < d; ++e) dot += double(qh[e]) * kr[e];
                sc[size_t(j)] = dot * scale;
                mx = std::max(mx, sc[size_t(j)]);
            }
            double sum = 0;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t j = 0; j < n; ++j) {
                const double p = std::exp(sc[size_t(j)] - mx);
                sum += p;
                const float* vr = &c.v[c.hoff(s, j) + size_t(g * d)];
                for (int64_t e = 0; e < d; ++e) acc[size_t(e)] += p * vr[e];
            }
            for (int64_t e = 0; e < d; ++e) out[size_t((t * n_head + h) * d + e)] = float(acc[size_t(e)] / sum);
        }
    };
    const size_t nt = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
    std::vector<std::thread> pool;
    for (size_t w = 0; w < nt; ++w)
        pool.emplace_back([&, w] {
            for (size_t i = w; i < tokens.size(); i += nt) one(tokens[i]);
        });
    for (auto& th : pool) th.join();
    return out;
}

}  // namespace qinfer::test
