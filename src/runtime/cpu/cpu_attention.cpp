// Causal GQA attention over the KV cache (spec/models.md §2.4). f32 scores and
// softmax whatever the cache type (spec pitfall 10).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_kernels.h"

namespace qinfer {

namespace {
void store_row(GgmlType type, const float* src, void* dst, int64_t n) {
    if (type == GgmlType::F32) {
        std::copy(src, src + n, static_cast<float*>(dst));
    } else {
        uint16_t* d = static_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
    }
}

void load_row(GgmlType type, const void* src, float* dst, int64_t n) {
    if (type == GgmlType::F32) {
        const float* s = static_cast<const float*>(src);
        std::copy(s, s + n, dst);
    } else {
        const uint16_t* s = static_cast<const uint16_t*>(src);
        for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
    }
}
}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const KvCache& cache,
                           const StepInfo& step, float scale, const Tensor& out) {
    const int64_t d = q.ne[0], n_head = q.ne[1], T = q.ne[2];
    const int64_t n_kv = k.ne[1];
    const Tensor& K = cache.k;
    const Tensor& V = cache.v;
    if (T != step.n_tokens || k.ne[0] != d || v.ne[0] != d || v.ne[1] != n_kv || k.ne[2] != T || v.ne[2] != T ||
        K.ne[0] != d || K.ne[1] != n_kv || n_head % n_kv != 0 || out.ne[0] != d || out.ne[1] != n_head ||
        out.ne[2] != T)
        fail(strfmt("attention: q %s, k %s, v %s, cache %s, out %s do not fit", shape_str(q).c_str(),
                    shape_str(k).c_str(), shape_str(v).c_str(), shape_str(K).c_str(), shape_str(out).c_str()));
    const int64_t group = n_head / n_kv;

    // 1. Append this step's keys and values to the cache.
    for (int64_t t = 0; t < T; ++t) {
        const int32_t p = step.pos[size_t(t)], s = step.slot[size_t(t)];
        if (p < 0 || p >= K.ne[2] || s < 0 || s >= K.ne[3])
            fail(strfmt("attention: position %d / slot %d outside the cache %s", p, s, shape_str(K).c_str()));
        for (int64_t g = 0; g < n_kv; ++g) {
            store_row(K.type, k.row<float>(g, t), K.row<void>(g, p, s), d);
            store_row(V.type, v.row<float>(g, t), V.row<void>(g, p, s), d);
        }
    }

    // 2. One task per (token, kv head): each cached K/V row is converted once
    //    and used by all `group` query heads that share it.
    parallel_rows(T * n_kv, 1, [&](int64_t i0, int64_t i1) {
        std::vector<float> krow(static_cast<size_t>(d)), vrow(static_cast<size_t>(d)), acc(static_cast<size_t>(group * d));
        std::vector<float> scores;
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t t = i / n_kv, g = i % n_kv;
            const int32_t s = step.slot[size_t(t)];
            const int64_t n = int64_t(step.pos[size_t(t)]) + 1;
            scores.resize(size_t(group * n));
            for (int64_t j = 0; j < n; ++j) {
                load_row(K.type, K.row<void>(g, j, s), krow.data(), d);
                for (int64_t h = 0; h < group; ++h)
                    scores[size_t(h * n + j)] = scale * cpu::dot(q.row<float>(g * group + h, t), krow.data(), d);
            }
            for (int64_t h = 0; h < group; ++h) {
                float* sc = &scores[size_t(h * n)];
                const float mx = *std::max_element(sc, sc + n);
                double sum = 0;
                for (int64_t j = 0; j < n; ++j) {
                    sc[j] = std::exp(sc[j] - mx);
                    sum += sc[j];
                }
                const float inv = float(1.0 / sum);
                for (int64_t j = 0; j < n; ++j) sc[j] *= inv;
            }
            std::fill(acc.begin(), acc.end(), 0.f);
            for (int64_t j = 0; j < n; ++j) {
                load_row(V.type, V.row<void>(g, j, s), vrow.data(), d);
                for (int64_t h = 0; h < group; ++h) {
                    const float w = scores[size_t(h * n + j)];
                    float* a = &acc[size_t(h * d)];
                    for (int64_t e = 0; e < d; ++e) a[e] += w * vrow[size_t(e)];
                }
            }
            for (int64_t h = 0; h < group; ++h)
                std::copy(&acc[size_t(h * d)], &acc[size_t(h * d)] + d, out.row<float>(g * group + h, t));
        }
    });
}

}  // namespace qinfer
