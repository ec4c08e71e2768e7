// Causal GQA attention over the KV cache (spec/models.md §2.4). f32 scores and
// softmax whatever the cache type (spec pitfall 10).
//
// Work split: a task takes one (token, kv head) pair and a range of cached
// positions and computes, for the `group` query heads sharing that kv head, an
// online softmax (running max, exp-sum, weighted V sum) block by block; a
// second pass merges the ranges of a pair (as flash-decoding does). Decode cuts
// the positions into fixed chunks so one token still spreads over all threads;
// every cached K/V row is converted from f16 (or dequantized from q8_0) once
// per group; and since the split depends only on the batch, the result does not
// depend on the thread count. A q8_0 cache stores each row of a kv head as
// head_dim / 32 blocks (the GGUF Q8_0 block: an f16 scale, 32 int8 values).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "quant/quant.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_vec.h"

namespace qinfer {

namespace {
constexpr int64_t kChunk = 256;  // cached positions per task

struct Task {
    int64_t t, g, j0, j1;  // token, kv head, position range
    size_t part;           // offset of its partial results
};
}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const KvCache& cache,
                           const StepInfo& step, float scale, const Tensor& out) {
    flush();
    const OpTimer timer(profile_.get(), "attention");
    const int64_t d = q.ne[0], n_head = q.ne[1], T = q.ne[2];
    const int64_t n_kv = k.ne[1];
    const Tensor& K = cache.k;
    const Tensor& V = cache.v;
    if (T != step.n_tokens || k.ne[0] != d || v.ne[0] != d || v.ne[1] != n_kv || k.ne[2] != T || v.ne[2] != T ||
        K.ne[0] != d || K.ne[1] != n_kv || n_head % n_kv != 0 || out.ne[0] != d || out.ne[1] != n_head ||
        out.ne[2] != T || K.type != V.type || !supports_kv_type(K.type) || d % traits(K.type).block_size != 0)
        fail(strfmt("attention: q %s, k %s, v %s, cache %s %s, out %s do not fit", shape_str(q).c_str(),
                    shape_str(k).c_str(), shape_str(v).c_str(), type_name(K.type), shape_str(K).c_str(),
                    shape_str(out).c_str()));
    const int64_t group = n_head / n_kv;
    const bool f16 = K.type == GgmlType::F16, q8 = K.type == GgmlType::Q8_0;
    const cpu::VecOps& vo = cpu::vec();

    // 1. Append this step's keys and values to the cache.
    for (int64_t t = 0; t < T; ++t) {
        const int32_t p = step.pos[size_t(t)], s = step.slot[size_t(t)];
        if (p < 0 || p >= K.ne[2] || s < 0 || s >= K.ne[3])
            fail(strfmt("attention: position %d / slot %d outside the cache %s", p, s, shape_str(K).c_str()));
        for (int64_t g = 0; g < n_kv; ++g) {
            if (f16) {
                vo.to_f16(k.row<float>(g, t), K.row<uint16_t>(g, p, s), d);
                vo.to_f16(v.row<float>(g, t), V.row<uint16_t>(g, p, s), d);
            } else if (q8) {
                quantize_row(GgmlType::Q8_0, k.row<float>(g, t), K.row<void>(g, p, s), d);
                quantize_row(GgmlType::Q8_0, v.row<float>(g, t), V.row<void>(g, p, s), d);
            } else {
                std::copy_n(k.row<float>(g, t), d, K.row<float>(g, p, s));
                std::copy_n(v.row<float>(g, t), d, V.row<float>(g, p, s));
            }
        }
    }

    // 2. Tasks. With few (token, kv head) pairs (decode) their position ranges
    //    are cut into kChunk pieces so that all threads get work; with many, one
    //    task per pair keeps the partial results small. The rule depends on the
    //    batch only, never on the thread count.
    const bool split = T * n_kv < 32;
    const size_t part_size = size_t(group * (d + 2));
    std::vector<Task> tasks;
    for (int64_t t = 0; t < T; ++t) {
        const int64_t n = int64_t(step.pos[size_t(t)]) + 1;
        for (int64_t g = 0; g < n_kv; ++g) {
            if (!split) tasks.push_back({t, g, 0, n, 0});
            else
                for (int64_t j0 = 0; j0 < n; j0 += kChunk) tasks.push_back({t, g, j0, std::min(n, j0 + kChunk), 0});
        }
    }
    for (size_t i = 0; i < tasks.size(); ++i) tasks[i].part = i * part_size;
    std::vector<float> parts(tasks.size() * part_size);

    double work = 0;
    for (const Task& tk : tasks) work += double(tk.j1 - tk.j0) * double(group * d) * 2;
    parallel_rows(int64_t(tasks.size()), work / double(tasks.size()), [&](int64_t i0, int64_t i1) {
        std::vector<float> sc(size_t(group * kChunk));
        std::vector<float> row(q8 ? size_t(d) : 0);  // a dequantized q8_0 K or V row
        const auto heads = static_cast<size_t>(group);
        std::vector<const float*> qs(heads);  // the group's query heads
        std::vector<float*> accs(heads);      // and their output accumulators
        std::vector<float> dots(heads);
        for (int64_t i = i0; i < i1; ++i) {
            const Task& tk = tasks[size_t(i)];
            const int32_t s = step.slot[size_t(tk.t)];
            float* part = &parts[tk.part];
            for (int64_t h = 0; h < group; ++h) {
                qs[size_t(h)] = q.row<float>(tk.g * group + h, tk.t);
                accs[size_t(h)] = part + h * (d + 2) + 2;
            }
            for (int64_t h = 0; h < group; ++h) {
                float* ph = part + h * (d + 2);
                ph[0] = -INFINITY;  // running max
                ph[1] = 0.f;        // running sum of exp(score - max)
                std::fill(ph + 2, ph + 2 + d, 0.f);
            }
            // Online softmax over blocks of kChunk positions.
            for (int64_t b0 = tk.j0; b0 < tk.j1; b0 += kChunk) {
                const int64_t n = std::min(kChunk, tk.j1 - b0);
                for (int64_t j = 0; j < n; ++j) {
                    const void* kr = K.row<void>(tk.g, b0 + j, s);
                    if (q8) {
                        dequantize_row(GgmlType::Q8_0, kr, row.data(), d);
                        kr = row.data();
                    }
                    if (f16) vo.dot_heads_f16(static_cast<const uint16_t*>(kr), qs.data(), group, d, dots.data());
                    else vo.dot_heads(static_cast<const float*>(kr), qs.data(), group, d, dots.data());
                    for (int64_t h = 0; h < group; ++h) sc[size_t(h * kChunk + j)] = scale * dots[size_t(h)];
                }
                for (int64_t h = 0; h < group; ++h) {
                    float* sh = &sc[size_t(h * kChunk)];
                    float* ph = part + h * (d + 2);
                    const float mx = std::max(ph[0], *std::max_element(sh, sh + n));
                    if (mx > ph[0] && ph[1] > 0.f) {  // rescale what was accumulated under the old max
                        const float r = std::exp(ph[0] - mx);
                        ph[1] *= r;
                        for (int64_t e = 0; e < d; ++e) ph[2 + e] *= r;
                    }
                    ph[0] = mx;
                    ph[1] += vo.exp_sub_sum(sh, n, mx);
                }
                const void* v0 = V.row<void>(tk.g, b0, s);
                if (f16)  // the block's value rows in one pass, the accumulators in registers
                    vo.axpy_rows_heads_f16(sc.data(), kChunk, static_cast<const uint16_t*>(v0),
                                           int64_t(V.nb[2] / 2), n, accs.data(), group, d);
                else if (!q8)
                    vo.axpy_rows_heads(sc.data(), kChunk, static_cast<const float*>(v0), int64_t(V.nb[2] / 4), n,
                                       accs.data(), group, d);
                else
                    for (int64_t j = 0; j < n; ++j) {
                        dequantize_row(GgmlType::Q8_0, V.row<void>(tk.g, b0 + j, s), row.data(), d);
                        vo.axpy_rows_heads(sc.data() + j, kChunk, row.data(), 0, 1, accs.data(), group, d);
                    }
            }
        }
    });

    // 3. Merge the chunks of every (token, query head), in chunk order.
    std::vector<size_t> first(size_t(T * n_kv) + 1, 0);
    for (size_t i = 0; i < tasks.size(); ++i) first[size_t(tasks[i].t * n_kv + tasks[i].g) + 1] = i + 1;
    for (size_t i = 1; i < first.size(); ++i) first[i] = std::max(first[i], first[i - 1]);
    parallel_rows(T * n_head, double(tasks.size()) / double(T * n_kv) * double(d), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const int64_t t = r / n_head, h = r % n_head, g = h / group, hh = h % group;
            const size_t c0 = first[size_t(t * n_kv + g)], c1 = first[size_t(t * n_kv + g) + 1];
            float mx = -INFINITY;
            for (size_t c = c0; c < c1; ++c) mx = std::max(mx, parts[tasks[c].part + size_t(hh * (d + 2))]);
            float* o = out.row<float>(h, t);
            std::fill(o, o + d, 0.f);
            double sum = 0;
            for (size_t c = c0; c < c1; ++c) {
                const float* ph = &parts[tasks[c].part + size_t(hh * (d + 2))];
                const float w = std::exp(ph[0] - mx);
                sum += double(ph[1]) * w;
                vo.axpy(w, ph + 2, o, d);
            }
            const float inv = float(1.0 / sum);
            for (int64_t e = 0; e < d; ++e) o[e] *= inv;
        }
    });
}

}  // namespace qinfer
