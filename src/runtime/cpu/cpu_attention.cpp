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
//
// Prompt segments (kTileTokens+ tokens) take query tiles instead: a task is
// (kv head, a few consecutive tokens), whose tokens x group query rows share
// every key and value tile, so each cached row is read once per tile rather
// than once per token. Both kinds of task run the same block step
// (attend_block: kChunk positions from a multiple of kChunk, scores summed as
// dot() sums them, the softmax update over each row's own keys, the weighted
// values in key order), so a token's result is the same bits whichever task
// ran it: a prompt's cache rows and outputs do not depend on its chunking.
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

constexpr int64_t kTileTokens = 8;  // prompt segments at least this long take query tiles
constexpr int64_t kSubTile = 64;    // keys converted to f32 at a time

struct TileTask {
    int64_t t0, t1, g;  // tokens [t0, t1) of one segment, kv head
};

// The cache and the step's tensors as a task sees them.
struct AttnArgs {
    const Tensor &q, &K, &V, &out;
    const StepInfo& step;
    int64_t group, d;
    float scale;
    const cpu::VecOps& vo;
};

// The query rows of a task and their online-softmax state.
struct Rows {
    int64_t m = 0;
    std::vector<const float*> q;
    std::vector<float*> o, mx, sum;  // weighted value sums (d each), running max, running exp-sum
    std::vector<int64_t> n;          // keys of the current block this row sees
    void resize(int64_t rows) {
        m = rows;
        q.resize(size_t(rows));
        o.resize(size_t(rows));
        mx.resize(size_t(rows));
        sum.resize(size_t(rows));
        n.resize(size_t(rows));
    }
};

// Per-thread buffers.
struct Scratch {
    std::vector<float> kv;  // kSubTile key (or q8_0 value) rows as f32
    std::vector<float> s;   // scores, then weights: rows x kChunk
    Rows rows;
    std::vector<float> state;  // query tiles: o, mx, sum of their rows
};

// Asks for the cache rows [j0, j0 + n) of kv head g ahead of their use: a kv
// head's rows lie n_kv rows apart (2 KB for 8 heads of 128 halves), and
// decode's reads of them were latency-bound (Qwen3-0.6B, 2 threads, 2048
// positions: +5% tokens/s).
void prefetch_rows(const Tensor& t, int64_t g, int64_t j0, int64_t n, int32_t slot) {
    const size_t bytes = t.nb[1];
    for (int64_t j = 0; j < n; ++j) {
        const char* p = t.row<char>(g, j0 + j, slot);
        for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o);
    }
}

// Keys [b0, b0 + nb) of kv head g (b0 a multiple of kChunk, nb <= kChunk) for
// the rows r, row i seeing its first r.n[i] of them: scores, the softmax update,
// the weighted values.
void attend_block(const AttnArgs& a, int64_t g, int32_t slot, int64_t b0, int64_t nb, const Rows& r, Scratch& sc) {
    const int64_t d = a.d;
    const bool f16 = a.K.type == GgmlType::F16, q8 = a.K.type == GgmlType::Q8_0;
    sc.s.resize(size_t(r.m * kChunk));
    sc.kv.resize(size_t(kSubTile * d));
    for (int64_t j0 = 0; j0 < nb; j0 += kSubTile) {
        const int64_t nk = std::min(kSubTile, nb - j0);
        prefetch_rows(a.K, g, b0 + j0 + nk, std::min(kSubTile, nb - j0 - nk), slot);
        const float* kp = sc.kv.data();
        int64_t ks = d;
        if (f16)
            for (int64_t j = 0; j < nk; ++j) a.vo.to_f32(a.K.row<uint16_t>(g, b0 + j0 + j, slot), &sc.kv[size_t(j * d)], d);
        else if (q8)
            for (int64_t j = 0; j < nk; ++j)
                a.vo.q8_0_to_f32(a.K.row<void>(g, b0 + j0 + j, slot), &sc.kv[size_t(j * d)], d);
        else {
            kp = a.K.row<float>(g, b0 + j0, slot);
            ks = int64_t(a.K.nb[2] / sizeof(float));
        }
        a.vo.dot_tile(r.q.data(), r.m, kp, ks, nk, d, a.scale, &sc.s[size_t(j0)], kChunk);
    }
    for (int64_t i = 0; i < r.m; ++i) {
        float* si = &sc.s[size_t(i * kChunk)];
        const int64_t n = r.n[size_t(i)];
        if (n > 0) {
            float& mx = *r.mx[size_t(i)];
            float& sum = *r.sum[size_t(i)];
            const float m = std::max(mx, *std::max_element(si, si + n));
            if (m > mx && sum > 0.f) {  // rescale what was summed under the old max
                const float f = std::exp(mx - m);
                sum *= f;
                for (int64_t e = 0; e < d; ++e) r.o[size_t(i)][e] *= f;
            }
            mx = m;
            sum += a.vo.exp_sub_sum(si, n, m);
        }
        std::fill(si + n, si + nb, 0.f);  // keys past the row's position weigh nothing
    }
    // The weighted values in sub-tiles (their rows stay in L1 across the column
    // passes), each element's fma chain still in key order.
    prefetch_rows(a.V, g, b0, std::min(kSubTile, nb), slot);
    for (int64_t j0 = 0; j0 < nb; j0 += kSubTile) {
        const int64_t nk = std::min(kSubTile, nb - j0);
        prefetch_rows(a.V, g, b0 + j0 + nk, std::min(kSubTile, nb - j0 - nk), slot);
        const float* w = &sc.s[size_t(j0)];
        if (f16)
            a.vo.axpy_rows_heads_f16(w, kChunk, a.V.row<uint16_t>(g, b0 + j0, slot), int64_t(a.V.nb[2] / 2), nk,
                                     r.o.data(), r.m, d);
        else if (!q8)
            a.vo.axpy_rows_heads(w, kChunk, a.V.row<float>(g, b0 + j0, slot), int64_t(a.V.nb[2] / sizeof(float)), nk,
                                 r.o.data(), r.m, d);
        else
            a.vo.axpy_rows_heads_q8_0(w, kChunk, a.V.row<void>(g, b0 + j0, slot), int64_t(a.V.nb[2]), nk, r.o.data(),
                                      r.m, d);
    }
}

// One query tile (rows: token-major, then the group's heads) over all of its
// keys; writes the normalised outputs (1 / sum in double, as the merge does).
void attend_tile(const AttnArgs& a, const TileTask& tk, Scratch& sc) {
    const int64_t d = a.d, M = (tk.t1 - tk.t0) * a.group;
    Rows& r = sc.rows;
    r.resize(M);
    sc.state.assign(size_t(M * (d + 2)), 0.f);
    for (int64_t i = 0; i < M; ++i) {
        float* st = &sc.state[size_t(i * (d + 2))];
        st[0] = -INFINITY;
        r.q[size_t(i)] = a.q.row<float>(tk.g * a.group + i % a.group, tk.t0 + i / a.group);
        r.mx[size_t(i)] = st;
        r.sum[size_t(i)] = st + 1;
        r.o[size_t(i)] = st + 2;
    }
    const int32_t slot = a.step.slot[size_t(tk.t0)];
    const int64_t n_keys = int64_t(a.step.pos[size_t(tk.t1 - 1)]) + 1;  // the last token sees the most
    for (int64_t b0 = 0; b0 < n_keys; b0 += kChunk) {
        const int64_t nb = std::min(kChunk, n_keys - b0);
        for (int64_t i = 0; i < M; ++i)  // causal: a row's token sees positions up to its own
            r.n[size_t(i)] = std::clamp(int64_t(a.step.pos[size_t(tk.t0 + i / a.group)]) + 1 - b0, int64_t(0), nb);
        attend_block(a, tk.g, slot, b0, nb, r, sc);
    }
    for (int64_t i = 0; i < M; ++i) {
        float* o = a.out.row<float>(tk.g * a.group + i % a.group, tk.t0 + i / a.group);
        const float inv = float(1.0 / double(*r.sum[size_t(i)]));
        for (int64_t e = 0; e < d; ++e) o[e] = r.o[size_t(i)][e] * inv;
    }
}
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

    // 1. Append this step's keys and values to the cache (rows checked first:
    //    the copies run on the pool, where nothing may throw).
    for (int64_t t = 0; t < T; ++t) {
        const int32_t p = step.pos[size_t(t)], s = step.slot[size_t(t)];
        if (p < 0 || p >= K.ne[2] || s < 0 || s >= K.ne[3])
            fail(strfmt("attention: position %d / slot %d outside the cache %s", p, s, shape_str(K).c_str()));
    }
    parallel_rows(T * n_kv, 4.0 * double(d), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const int64_t t = r / n_kv, g = r % n_kv;
            const int32_t p = step.pos[size_t(t)], s = step.slot[size_t(t)];
            if (f16) {
                vo.to_f16(k.row<float>(g, t), K.row<uint16_t>(g, p, s), d);
                vo.to_f16(v.row<float>(g, t), V.row<uint16_t>(g, p, s), d);
            } else if (q8) {
                vo.to_q8_0(k.row<float>(g, t), K.row<void>(g, p, s), d);
                vo.to_q8_0(v.row<float>(g, t), V.row<void>(g, p, s), d);
            } else {
                std::copy_n(k.row<float>(g, t), d, K.row<float>(g, p, s));
                std::copy_n(v.row<float>(g, t), d, V.row<float>(g, p, s));
            }
        }
    });

    // 2. Tasks. With few (token, kv head) pairs (decode) their position ranges
    //    are cut into kChunk pieces so that all threads get work; with many, one
    //    task per pair keeps the partial results small. The rule depends on the
    //    batch only, never on the thread count.
    //    Tokens of long prompt segments go to query tiles (2b) instead.
    std::vector<char> tiled(size_t(T), 0);
    std::vector<TileTask> tiles;
    const int64_t tile_tokens = std::max<int64_t>(1, 16 / group);  // ~16 query rows per tile
    for (const StepInfo::Segment& sg : step.segments) {
        if (sg.count < kTileTokens) continue;
        std::fill_n(tiled.begin() + sg.first, sg.count, 1);
        // Last tiles first: they see the most keys, and the pool's ranges start with them.
        for (int64_t t1 = sg.first + sg.count; t1 > sg.first; t1 -= tile_tokens)
            for (int64_t g = 0; g < n_kv; ++g) tiles.push_back({std::max<int64_t>(sg.first, t1 - tile_tokens), t1, g});
    }
    const bool split = T * n_kv < 32;
    const size_t part_size = size_t(group * (d + 2));
    std::vector<Task> tasks;
    for (int64_t t = 0; t < T; ++t) {
        if (tiled[size_t(t)]) continue;
        const int64_t n = int64_t(step.pos[size_t(t)]) + 1;
        for (int64_t g = 0; g < n_kv; ++g) {
            if (!split) tasks.push_back({t, g, 0, n, 0});
            else
                for (int64_t j0 = 0; j0 < n; j0 += kChunk) tasks.push_back({t, g, j0, std::min(n, j0 + kChunk), 0});
        }
    }
    for (size_t i = 0; i < tasks.size(); ++i) tasks[i].part = i * part_size;
    std::vector<float> parts(tasks.size() * part_size);

    // Run order: by position range, then kv head, so that consecutive tasks
    // (one thread's range of the pool) read neighbouring pieces of the same
    // cache rows (a position's kv heads are adjacent).
    std::vector<size_t> order(tasks.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        return std::pair(tasks[x].t, tasks[x].j0) < std::pair(tasks[y].t, tasks[y].j0);
    });
    const AttnArgs args{q, K, V, out, step, group, d, scale, vo};
    double work = 0;
    for (const Task& tk : tasks) work += double(tk.j1 - tk.j0) * double(group * d) * 2;
    parallel_rows(int64_t(tasks.size()), work / double(std::max<size_t>(tasks.size(), 1)), [&](int64_t i0, int64_t i1) {
        thread_local Scratch scratch;  // kept: its buffers only grow, so no allocation per call
        Rows& r = scratch.rows;
        r.resize(group);
        for (int64_t i = i0; i < i1; ++i) {
            const Task& tk = tasks[order[size_t(i)]];
            float* part = &parts[tk.part];
            for (int64_t h = 0; h < group; ++h) {
                float* ph = part + h * (d + 2);
                ph[0] = -INFINITY;  // running max
                ph[1] = 0.f;        // running sum of exp(score - max)
                std::fill(ph + 2, ph + 2 + d, 0.f);
                r.q[size_t(h)] = q.row<float>(tk.g * group + h, tk.t);
                r.mx[size_t(h)] = ph;
                r.sum[size_t(h)] = ph + 1;
                r.o[size_t(h)] = ph + 2;
            }
            for (int64_t b0 = tk.j0; b0 < tk.j1; b0 += kChunk) {
                const int64_t nb = std::min(kChunk, tk.j1 - b0);
                std::fill(r.n.begin(), r.n.end(), nb);
                attend_block(args, tk.g, step.slot[size_t(tk.t)], b0, nb, r, scratch);
            }
        }
    });

    // 2b. Query tiles.
    if (!tiles.empty()) {
        const double tile_work = double(16 * d * 2) * double(step.pos[size_t(T - 1)] + 1) / 2;
        parallel_rows(int64_t(tiles.size()), tile_work, [&](int64_t i0, int64_t i1) {
            thread_local Scratch scratch;
            for (int64_t i = i0; i < i1; ++i) attend_tile(args, tiles[size_t(i)], scratch);
        });
    }

    // 3. Merge the chunks of every (token, query head), in chunk order.
    std::vector<size_t> first(size_t(T * n_kv) + 1, 0);
    for (size_t i = 0; i < tasks.size(); ++i) first[size_t(tasks[i].t * n_kv + tasks[i].g) + 1] = i + 1;
    for (size_t i = 1; i < first.size(); ++i) first[i] = std::max(first[i], first[i - 1]);
    parallel_rows(T * n_head, double(tasks.size()) / double(T * n_kv) * double(d), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const int64_t t = r / n_head, h = r % n_head, g = h / group, hh = h % group;
            if (tiled[size_t(t)]) continue;
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
