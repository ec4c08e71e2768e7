// Every backend op against a plain host implementation of its definition
// (runtime/backend.h, spec/models.md), through the Backend interface only, so
// the same checks run on each backend of the build (CPU always, CUDA when a GPU
// is present). Shapes are small but include the awkward cases: strided views,
// partial RoPE, GQA, several slots and segments in one step, state carried
// across calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <tuple>

#include "common/error.h"
#include "common/fp16.h"
#include "common/thread_pool.h"
#include "gguf/gguf.h"
#include "quant/cpu_matmul.h"
#include "quant/quant.h"
#include "runtime/backend.h"
#include "testutil.h"

namespace qinfer {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

Tensor upload(Backend& be, const std::vector<float>& v, std::initializer_list<int64_t> ne, const char* name = "t") {
    Tensor t = be.alloc(GgmlType::F32, ne, name);
    EXPECT_EQ(size_t(t.n_elements()), v.size());
    be.write(t, v.data(), v.size() * 4);
    return t;
}

Tensor upload_i32(Backend& be, const std::vector<int32_t>& v) {
    Tensor t = be.alloc(GgmlType::I32, {int64_t(v.size())}, "i32");
    be.write(t, v.data(), v.size() * 4);
    return t;
}

std::vector<float> download(Backend& be, const Tensor& t) {
    std::vector<float> v(size_t(t.n_elements()));
    be.read(t, v.data(), v.size() * 4);
    return v;
}

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want, double tol, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs(double(got[i]) - want[i]) / std::max(1.0, std::fabs(want[i]));
        if (d > worst) worst = d, at = i;
    }
    EXPECT_LE(worst, tol) << what << ": element " << at << " got " << got[at] << " want " << want[at];
}

// Step metadata for a batch made of (slot, pos0, count) segments.
StepInfo make_step(Backend& be, const std::vector<StepInfo::Segment>& segs) {
    StepInfo st;
    for (const StepInfo::Segment& sg : segs) {
        StepInfo::Segment s = sg;
        s.first = st.n_tokens;
        st.segments.push_back(s);
        for (int i = 0; i < sg.count; ++i) {
            st.pos.push_back(sg.pos0 + i);
            st.slot.push_back(sg.slot);
        }
        st.n_tokens += sg.count;
    }
    st.pos_t = upload_i32(be, st.pos);
    st.slot_t = upload_i32(be, st.slot);
    std::vector<int32_t> seg;
    for (const StepInfo::Segment& s : st.segments) seg.insert(seg.end(), {s.first, s.count, s.slot, s.pos0});
    st.seg_t = be.alloc(GgmlType::I32, {4, int64_t(st.segments.size())}, "segments");
    be.write(st.seg_t, seg.data(), seg.size() * 4);
    return st;
}

std::vector<std::unique_ptr<Backend>> backends() {
    std::vector<std::unique_ptr<Backend>> out;
    out.push_back(make_cpu_backend(std::make_shared<ThreadPool>(2)));
    if (cuda_device_count() > 0) out.push_back(make_cuda_backend(0));
    return out;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sigmoid(x); }

TEST(RuntimeOps, NormsOnStridedViews) {
    const int64_t d = 16, H = 3, T = 2;
    for (auto& bp : backends()) {
        Backend& be = *bp;
        // x holds per head [a (d) | b (d)]: the norms read the a halves only.
        const std::vector<float> xs = random_vec(size_t(2 * d * H * T), 1);
        const std::vector<float> ws = random_vec(size_t(d), 2, 0.5f, 1.5f);
        const std::vector<float> zs = random_vec(size_t(d * H * T), 3);
        Tensor x = upload(be, xs, {2 * d, H, T});
        Tensor w = upload(be, ws, {d});
        Tensor z = upload(be, zs, {d, H, T});
        Tensor a = view(x, {d, H, T}, {x.nb[1], x.nb[2]}, 0);
        Tensor y1 = be.alloc(GgmlType::F32, {d, H, T}), y2 = be.alloc(GgmlType::F32, {d, H, T});
        Tensor y3 = be.alloc(GgmlType::F32, {d, H, T}), y4 = be.alloc(GgmlType::F32, {d, H, T});
        be.rms_norm(a, w, 1e-6f, y1);
        be.l2_norm(a, 1e-6f, y2);
        be.rms_norm_gated(a, w, z, 1e-6f, y3);
        be.sigmoid_mul(z, a, y4);
        std::vector<double> r1, r2, r3, r4;
        for (int64_t r = 0; r < H * T; ++r) {
            const float* row = &xs[size_t(r * 2 * d)];
            double ss = 0;
            for (int64_t i = 0; i < d; ++i) ss += double(row[i]) * row[i];
            const double rms = 1.0 / std::sqrt(ss / double(d) + 1e-6), l2 = 1.0 / std::max(std::sqrt(ss), 1e-6);
            for (int64_t i = 0; i < d; ++i) {
                const double zi = zs[size_t(r * d + i)];
                r1.push_back(row[i] * rms * ws[size_t(i)]);
                r2.push_back(row[i] * l2);
                r3.push_back(row[i] * rms * ws[size_t(i)] * silu(zi));
                r4.push_back(zi * sigmoid(row[i]));
            }
        }
        expect_near_all(download(be, y1), r1, 1e-5, "rms_norm");
        expect_near_all(download(be, y2), r2, 1e-5, "l2_norm");
        expect_near_all(download(be, y3), r3, 1e-5, "rms_norm_gated");
        expect_near_all(download(be, y4), r4, 1e-5, "sigmoid_mul");
        // In place on the strided view leaves the b halves alone.
        be.rms_norm(a, w, 1e-6f, a);
        const std::vector<float> after = download(be, x);
        for (int64_t r = 0; r < H * T; ++r)
            for (int64_t i = 0; i < d; ++i) {
                EXPECT_NEAR(after[size_t(r * 2 * d + i)], r1[size_t(r * d + i)], 1e-5);
                EXPECT_EQ(after[size_t(r * 2 * d + d + i)], xs[size_t(r * 2 * d + d + i)]);
            }
        // copy: strided -> contiguous
        Tensor c = be.alloc(GgmlType::F32, {d, H, T});
        be.copy(view(x, {d, H, T}, {x.nb[1], x.nb[2]}, size_t(d) * 4), c);
        std::vector<double> want;
        for (int64_t r = 0; r < H * T; ++r)
            for (int64_t i = 0; i < d; ++i) want.push_back(xs[size_t(r * 2 * d + d + i)]);
        expect_near_all(download(be, c), want, 0, "copy");
    }
}

TEST(RuntimeOps, ElementwiseAndMatmul) {
    const int64_t K = 64, N = 24;
    for (auto& bp : backends()) {
        Backend& be = *bp;
        for (int64_t T : {1, 5}) {
            const std::vector<float> ws = random_vec(size_t(K * N), 4), xs = random_vec(size_t(K * T), 5),
                                     bs = random_vec(size_t(N), 6);
            Tensor w = upload(be, ws, {K, N}), x = upload(be, xs, {K, T}), b = upload(be, bs, {N});
            Tensor y = be.alloc(GgmlType::F32, {N, T});
            be.matmul(w, x, y, &b);
            std::vector<double> want;
            for (int64_t t = 0; t < T; ++t)
                for (int64_t o = 0; o < N; ++o) {
                    double s = bs[size_t(o)];
                    for (int64_t k = 0; k < K; ++k) s += double(ws[size_t(o * K + k)]) * xs[size_t(t * K + k)];
                    want.push_back(s);
                }
            expect_near_all(download(be, y), want, 1e-5, "matmul+bias");

            Tensor s = be.alloc(GgmlType::F32, {K, T}), g = be.alloc(GgmlType::F32, {K, T});
            const std::vector<float> us = random_vec(size_t(K * T), 7);
            Tensor u = upload(be, us, {K, T});
            be.add(x, u, s);
            be.swiglu(x, u, g);
            std::vector<double> ws_, wg;
            for (size_t i = 0; i < us.size(); ++i) {
                ws_.push_back(double(xs[i]) + us[i]);
                wg.push_back(silu(xs[i]) * us[i]);
            }
            expect_near_all(download(be, s), ws_, 1e-6, "add");
            expect_near_all(download(be, g), wg, 1e-5, "swiglu");
        }
    }
}

TEST(RuntimeOps, GetRowsDequantizes) {
    const int64_t E = 64, V = 5;
    const std::vector<float> src = random_vec(size_t(E * V), 8);
    std::vector<uint8_t> q(row_bytes(GgmlType::Q8_0, E) * size_t(V));
    for (int64_t r = 0; r < V; ++r)
        quantize_row(GgmlType::Q8_0, &src[size_t(r * E)], &q[size_t(r) * row_bytes(GgmlType::Q8_0, E)], E);
    gguf::TensorInfo ti;
    ti.name = "token_embd.weight";
    ti.type = GgmlType::Q8_0;
    ti.n_dims = 2;
    ti.ne[0] = E;
    ti.ne[1] = V;
    ti.nbytes = q.size();
    ti.data = q.data();
    for (auto& bp : backends()) {
        Backend& be = *bp;
        Tensor w = be.upload_weight(ti);
        const std::vector<int32_t> ids = {3, 0, 3, 4};
        Tensor out = be.alloc(GgmlType::F32, {E, int64_t(ids.size())});
        be.get_rows(w, upload_i32(be, ids), out);
        std::vector<double> want;
        std::vector<float> row(static_cast<size_t>(E));
        for (int32_t id : ids) {
            dequantize_row(GgmlType::Q8_0, &q[size_t(id) * row_bytes(GgmlType::Q8_0, E)], row.data(), E);
            want.insert(want.end(), row.begin(), row.end());
        }
        expect_near_all(download(be, out), want, 0, "get_rows q8_0");
    }
}

TEST(RuntimeOps, PartialRopeNeox) {
    const int64_t d = 32, H = 2;
    const int n_rot = 8;
    const float base = 1e7f;
    for (auto& bp : backends()) {
        Backend& be = *bp;
        StepInfo st = make_step(be, {{0, 1, 0, 0}, {0, 2, 1, 99998}});  // positions 0, 99998, 99999
        const int64_t T = st.n_tokens;
        const std::vector<float> xs = random_vec(size_t(d * H * T), 9);
        Tensor x = upload(be, xs, {d, H, T});
        be.rope_neox(x, st, n_rot, base, 1.f);
        std::vector<double> want(xs.begin(), xs.end());
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h) {
                double* v = &want[size_t((t * H + h) * d)];
                for (int i = 0; i < n_rot / 2; ++i) {
                    const double th = st.pos[size_t(t)] * std::pow(double(base), -2.0 * i / n_rot);
                    const double a = v[i], b = v[i + n_rot / 2];
                    v[i] = a * std::cos(th) - b * std::sin(th);
                    v[i + n_rot / 2] = a * std::sin(th) + b * std::cos(th);
                }
            }
        expect_near_all(download(be, x), want, 2e-5, "rope");
    }
}

// Host attention over a host copy of the cache, for any sequence of steps.
struct HostAttention {
    int64_t d, n_head, n_kv;
    GgmlType kv;  // the cache type: rows as the cache holds them
    std::map<std::pair<int, int>, std::vector<double>> K, V;  // (slot, pos) -> n_kv * d

    std::vector<double> step(const StepInfo& st, const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, double scale) {
        // one kv head's row of d values as the cache stores it
        auto round_row = [&](const float* x, std::vector<double>& out) {
            std::vector<float> r(x, x + d);
            if (kv == GgmlType::F16)
                for (float& e : r) e = fp16_to_fp32(fp32_to_fp16(e));
            if (kv == GgmlType::Q8_0) {
                std::vector<uint8_t> blocks(row_bytes(kv, d));
                quantize_row(kv, x, blocks.data(), d);
                dequantize_row(kv, blocks.data(), r.data(), d);
            }
            out.insert(out.end(), r.begin(), r.end());
        };
        for (int t = 0; t < st.n_tokens; ++t) {
            auto& kr = K[{st.slot[size_t(t)], st.pos[size_t(t)]}];
            auto& vr = V[{st.slot[size_t(t)], st.pos[size_t(t)]}];
            kr.clear();
            vr.clear();
            for (int64_t g = 0; g < n_kv; ++g) {
                round_row(&k[size_t((t * n_kv + g) * d)], kr);
                round_row(&v[size_t((t * n_kv + g) * d)], vr);
            }
        }
        std::vector<double> out;
        for (int t = 0; t < st.n_tokens; ++t)
            for (int64_t h = 0; h < n_head; ++h) {
                const int64_t g = h / (n_head / n_kv);
                const float* qh = &q[size_t((t * n_head + h) * d)];
                std::vector<double> s;
                for (int j = 0; j <= st.pos[size_t(t)]; ++j) {
                    const auto& kr = K.at({st.slot[size_t(t)], j});
                    double dot = 0;
                    for (int64_t e = 0; e < d; ++e) dot += qh[e] * kr[size_t(g * d + e)];
                    s.push_back(dot * scale);
                }
                const double mx = *std::max_element(s.begin(), s.end());
                double sum = 0;
                for (double& x : s) sum += (x = std::exp(x - mx));
                for (int64_t e = 0; e < d; ++e) {
                    double acc = 0;
                    for (size_t j = 0; j < s.size(); ++j) acc += s[j] / sum * V.at({st.slot[size_t(t)], int(j)})[size_t(g * d + e)];
                    out.push_back(acc);
                }
            }
        return out;
    }
};

TEST(RuntimeOps, AttentionGqaSlotsAndSteps) {
    const int64_t d = 32, n_head = 4, n_kv = 2, n_ctx = 8, n_slots = 2;
    for (GgmlType kv : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0}) {
        for (auto& bp : backends()) {
            Backend& be = *bp;
            if (!be.supports_kv_type(kv)) continue;
            KvCache cache{be.alloc(kv, {d, n_kv, n_ctx, n_slots}), be.alloc(kv, {d, n_kv, n_ctx, n_slots})};
            HostAttention ref{d, n_head, n_kv, kv, {}, {}};
            // step 1: slot 1 prompt of 3, slot 0 prompt of 2; step 2: one token each; step 3: slot 0 chunk of 4.
            const std::vector<std::vector<StepInfo::Segment>> steps = {
                {{0, 3, 1, 0}, {0, 2, 0, 0}}, {{0, 1, 0, 2}, {0, 1, 1, 3}}, {{0, 4, 0, 3}}};
            uint32_t seed = 20;
            for (const auto& segs : steps) {
                StepInfo st = make_step(be, segs);
                const int64_t T = st.n_tokens;
                const std::vector<float> q = random_vec(size_t(d * n_head * T), seed++, -2, 2),
                                         k = random_vec(size_t(d * n_kv * T), seed++, -2, 2),
                                         v = random_vec(size_t(d * n_kv * T), seed++);
                Tensor out = be.alloc(GgmlType::F32, {d, n_head, T});
                be.attention(upload(be, q, {d, n_head, T}), upload(be, k, {d, n_kv, T}), upload(be, v, {d, n_kv, T}),
                             cache, st, 0.25f, out);
                // the reference holds the cache's rounded rows: what is left is f32 arithmetic
                // (and the f16 kernels' own conversions)
                expect_near_all(download(be, out), ref.step(st, q, k, v, 0.25), kv == GgmlType::F16 ? 2e-3 : 1e-5,
                                (std::string("attention ") + type_name(kv) + " cache").c_str());
            }
        }
    }
}

// The CPU backend's prompt path (query tiles for segments of 8+ tokens) must
// give the per-token tasks' results bit for bit, so that cache rows and
// outputs do not depend on how a prompt is cut into steps (prompt-cache
// snapshots rely on it). Chunks of 7 tokens x 8 kv heads run the unsplit
// per-token tasks; the prompt crosses the 256-position softmax blocks, the
// head sizes take dot's 16-, 8-column and tail steps, odd groups make odd tiles.
TEST(RuntimeOps, CpuPromptAttentionEqualsShortChunks) {
    auto be = make_cpu_backend(std::make_shared<ThreadPool>(2));
    const int64_t n_kv = 8, n_ctx = 320, P = 300, extra = 14;
    for (GgmlType kv : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0})
        for (int64_t d : {64, 40, 36})
            for (int64_t group : {1, 3}) {
                if (kv == GgmlType::Q8_0 && d % 32) continue;
                const int64_t n_head = n_kv * group;
                KvCache cache{be->alloc(kv, {d, n_kv, n_ctx, 2}), be->alloc(kv, {d, n_kv, n_ctx, 2})};
                const std::vector<float> q = random_vec(size_t(d * n_head * (P + extra)), 1, -2, 2),
                                         k = random_vec(size_t(d * n_kv * (P + extra)), 2, -2, 2),
                                         v = random_vec(size_t(d * n_kv * (P + extra)), 3);
                // tokens [first, first + n) of the sequence as one step in `slot`
                auto step = [&](int64_t first, int64_t n, int slot) {
                    StepInfo st = make_step(*be, {{0, int32_t(n), slot, int32_t(first)}});
                    auto part = [&](const std::vector<float>& x, int64_t heads) {
                        return std::vector<float>(x.begin() + first * d * heads, x.begin() + (first + n) * d * heads);
                    };
                    Tensor out = be->alloc(GgmlType::F32, {d, n_head, n});
                    be->attention(upload(*be, part(q, n_head), {d, n_head, n}), upload(*be, part(k, n_kv), {d, n_kv, n}),
                                  upload(*be, part(v, n_kv), {d, n_kv, n}), cache, st, 0.125f, out);
                    return download(*be, out);
                };
                std::vector<float> whole = step(0, P, 0), more = step(P, extra, 0);
                whole.insert(whole.end(), more.begin(), more.end());
                std::vector<float> chunks;
                for (int64_t t = 0; t < P + extra; t += 7) {
                    const std::vector<float> c = step(t, std::min<int64_t>(7, P + extra - t), 1);
                    chunks.insert(chunks.end(), c.begin(), c.end());
                }
                ASSERT_EQ(whole.size(), chunks.size());
                size_t differ = 0;
                for (size_t i = 0; i < whole.size(); ++i) differ += whole[i] != chunks[i];
                EXPECT_EQ(differ, 0u) << type_name(kv) << " cache, d " << d << ", group " << group;
            }
}

// A step whose position or slot lies outside the cache is an Error naming
// both, raised before any row is written (the rows are written on the pool,
// where nothing may throw).
TEST(RuntimeOps, CpuAttentionOutsideTheCacheIsAnError) {
    auto be = make_cpu_backend(std::make_shared<ThreadPool>(2));
    const int64_t d = 32, n_kv = 2, n_ctx = 8;
    KvCache cache{be->alloc(GgmlType::F16, {d, n_kv, n_ctx, 1}), be->alloc(GgmlType::F16, {d, n_kv, n_ctx, 1})};
    const std::vector<uint16_t> zero(size_t(n_ctx * d * n_kv), 0);  // f16 zeros
    be->write(cache.k, zero.data(), zero.size() * 2);
    for (auto [first, n, slot] : {std::tuple<int, int, int>{6, 4, 0}, {0, 2, 1}}) {
        StepInfo st = make_step(*be, {{0, n, slot, first}});
        const std::vector<float> x = random_vec(size_t(d * n_kv * n), 7);
        Tensor out = be->alloc(GgmlType::F32, {d, n_kv, n});
        try {
            be->attention(upload(*be, x, {d, n_kv, n}), upload(*be, x, {d, n_kv, n}), upload(*be, x, {d, n_kv, n}), cache,
                          st, 0.125f, out);
            ADD_FAILURE() << "no error for positions " << first << "+" << n << ", slot " << slot;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("outside the cache"), std::string::npos) << e.what();
        }
        std::vector<uint16_t> k(size_t(n_ctx * d * n_kv));
        be->read(cache.k, k.data(), k.size() * 2);
        for (uint16_t h : k) ASSERT_EQ(h, 0u) << "a row was written before the error";
    }
}

// Host Gated DeltaNet: conv + SiLU with state, then the delta rule of spec §5.6
// literally (decay, S k, delta, rank-1 update, read-out), in double.
struct HostDeltaNet {
    int64_t C, K, dk, Hk, Hv;
    std::map<int, std::vector<double>> conv, S;  // per slot

    void conv_step(const StepInfo& st, const std::vector<float>& x, const std::vector<float>& w, std::vector<double>& out) {
        out.assign(x.size(), 0);
        for (const StepInfo::Segment& sg : st.segments) {
            auto& cs = conv[sg.slot];
            cs.resize(size_t((K - 1) * C), 0.0);
            std::vector<double> win(cs);  // rows of C, oldest first
            for (int t = 0; t < sg.count; ++t)
                for (int64_t c = 0; c < C; ++c) win.push_back(x[size_t((sg.first + t) * C + c)]);
            for (int t = 0; t < sg.count; ++t)
                for (int64_t c = 0; c < C; ++c) {
                    double acc = 0;
                    for (int64_t r = 0; r < K; ++r) acc += w[size_t(c * K + r)] * win[size_t((t + r) * C + c)];
                    out[size_t((sg.first + t) * C + c)] = silu(acc);
                }
            cs.assign(win.end() - (K - 1) * C, win.end());
        }
    }

    std::vector<double> rule(const StepInfo& st, const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, const std::vector<float>& a, const std::vector<float>& b,
                             const std::vector<float>& dtb, const std::vector<float>& A) {
        const int64_t dv = dk;
        std::vector<double> out(size_t(st.n_tokens * Hv * dv));
        for (const StepInfo::Segment& sg : st.segments) {
            auto& s = S[sg.slot];
            s.resize(size_t(Hv * dv * dk), 0.0);
            for (int t = sg.first; t < sg.first + sg.count; ++t)
                for (int64_t j = 0; j < Hv; ++j) {
                    const int64_t kh = j % Hk;
                    const double x = a[size_t(t * Hv + j)] + dtb[size_t(j)];
                    const double g = (x > 20 ? x : std::log1p(std::exp(x))) * A[size_t(j)];
                    const double alpha = std::exp(g), beta = sigmoid(b[size_t(t * Hv + j)]);
                    const float* kt = &k[size_t((t * Hk + kh) * dk)];
                    const float* qt = &q[size_t((t * Hk + kh) * dk)];
                    double* Sj = &s[size_t(j * dv * dk)];
                    for (int64_t i = 0; i < dv * dk; ++i) Sj[i] *= alpha;
                    for (int64_t r = 0; r < dv; ++r) {
                        double sk = 0;
                        for (int64_t c = 0; c < dk; ++c) sk += Sj[r * dk + c] * kt[c];
                        const double delta = beta * (v[size_t((t * Hv + j) * dv + r)] - sk);
                        for (int64_t c = 0; c < dk; ++c) Sj[r * dk + c] += delta * kt[c];
                        double o = 0;
                        for (int64_t c = 0; c < dk; ++c) o += Sj[r * dk + c] * qt[c] / std::sqrt(double(dk));
                        out[size_t((t * Hv + j) * dv + r)] = o;
                    }
                }
        }
        return out;
    }
};

std::vector<float> l2_normalized(std::vector<float> v, int64_t n) {
    for (size_t r = 0; r < v.size() / size_t(n); ++r) {
        double ss = 0;
        for (int64_t i = 0; i < n; ++i) ss += double(v[r * size_t(n) + size_t(i)]) * v[r * size_t(n) + size_t(i)];
        for (int64_t i = 0; i < n; ++i) v[r * size_t(n) + size_t(i)] = float(v[r * size_t(n) + size_t(i)] / std::sqrt(ss));
    }
    return v;
}

TEST(RuntimeOps, GatedDeltaNetSegmentsAndCarriedState) {
    const int64_t dk = 16, Hk = 2, Hv = 4, K = 4, n_slots = 3;
    const int64_t C = 2 * Hk * dk + Hv * dk;
    for (auto& bp : backends()) {
        Backend& be = *bp;
        RecurrentState rs{be.alloc(GgmlType::F32, {C, K - 1, n_slots}), be.alloc(GgmlType::F32, {dk, dk, Hv, n_slots})};
        HostDeltaNet ref{C, K, dk, Hk, Hv, {}, {}};
        const std::vector<float> w = random_vec(size_t(K * C), 30), dtb = random_vec(size_t(Hv), 31, -1.5f, -0.5f),
                                 A = random_vec(size_t(Hv), 32, -8.f, -0.5f);
        Tensor wt = upload(be, w, {K, C}), dtbt = upload(be, dtb, {Hv}), At = upload(be, A, {Hv});
        // Segments shorter and longer than the conv window, two slots per step, carried over.
        const std::vector<std::vector<StepInfo::Segment>> steps = {
            {{0, 2, 2, 0}, {0, 5, 0, 0}}, {{0, 1, 0, 5}, {0, 1, 2, 2}}, {{0, 6, 2, 3}}};
        uint32_t seed = 40;
        for (const auto& segs : steps) {
            StepInfo st = make_step(be, segs);
            const int64_t T = st.n_tokens;
            const std::vector<float> x = random_vec(size_t(C * T), seed++);
            Tensor xt = upload(be, x, {C, T}), u = be.alloc(GgmlType::F32, {C, T});
            be.conv1d_silu(xt, wt, rs, st, u);
            std::vector<double> want_u;
            ref.conv_step(st, x, w, want_u);
            expect_near_all(download(be, u), want_u, 1e-5, "conv1d_silu");

            const std::vector<float> q = l2_normalized(random_vec(size_t(dk * Hk * T), seed++), dk),
                                     k = l2_normalized(random_vec(size_t(dk * Hk * T), seed++), dk),
                                     v = random_vec(size_t(dk * Hv * T), seed++),
                                     a = random_vec(size_t(Hv * T), seed++, -3, 3),
                                     b = random_vec(size_t(Hv * T), seed++, -3, 3);
            Tensor o = be.alloc(GgmlType::F32, {dk, Hv, T});
            be.gated_delta_rule(upload(be, q, {dk, Hk, T}), upload(be, k, {dk, Hk, T}), upload(be, v, {dk, Hv, T}),
                                upload(be, a, {Hv, T}), upload(be, b, {Hv, T}), dtbt, At, rs, st, o);
            expect_near_all(download(be, o), ref.rule(st, q, k, v, a, b, dtb, A), 1e-5, "gated_delta_rule");
        }
        // Slot 1 was never touched: its state is still zero.
        std::vector<float> S(size_t(dk * dk * Hv * n_slots));
        be.read(rs.S, S.data(), S.size() * 4);
        for (int64_t i = 0; i < dk * dk * Hv; ++i) ASSERT_EQ(S[size_t(dk * dk * Hv + i)], 0.f);
    }
}

// Larger shapes take the parallel paths; the CPU result must not depend on the
// thread count (fixed chunking, independent work items).
TEST(RuntimeOps, CpuResultsIndependentOfThreadCount) {
    const int64_t d = 64, n_head = 4, n_kv = 2, n_ctx = 320, T = 300;
    const int64_t dk = 64, Hk = 2, Hv = 8, K = 4, C = 2 * Hk * dk + Hv * dk, Tr = 40;
    std::vector<std::vector<float>> results[2];
    for (int which = 0; which < 2; ++which) {
        auto be = make_cpu_backend(std::make_shared<ThreadPool>(which == 0 ? 1 : 3));
        StepInfo st = make_step(*be, {{0, int32_t(T), 0, 0}});
        KvCache cache{be->alloc(GgmlType::F16, {d, n_kv, n_ctx, 1}), be->alloc(GgmlType::F16, {d, n_kv, n_ctx, 1})};
        Tensor out = be->alloc(GgmlType::F32, {d, n_head, T});
        const std::vector<float> q = random_vec(size_t(d * n_head * T), 60, -3, 3),
                                 k = random_vec(size_t(d * n_kv * T), 61, -3, 3), v = random_vec(size_t(d * n_kv * T), 62);
        be->attention(upload(*be, q, {d, n_head, T}), upload(*be, k, {d, n_kv, T}), upload(*be, v, {d, n_kv, T}), cache,
                      st, 0.125f, out);
        results[which].push_back(download(*be, out));
        if (which == 0) {  // more than one block of positions per task: the online-softmax rescaling
            HostAttention ref{d, n_head, n_kv, GgmlType::F16, {}, {}};
            expect_near_all(results[0].back(), ref.step(st, q, k, v, 0.125), 2e-3, "attention, 300 tokens");
        }

        StepInfo sr = make_step(*be, {{0, int32_t(Tr), 0, 0}});
        RecurrentState rs{be->alloc(GgmlType::F32, {C, K - 1, 1}), be->alloc(GgmlType::F32, {dk, dk, Hv, 1})};
        Tensor u = be->alloc(GgmlType::F32, {C, Tr}), o = be->alloc(GgmlType::F32, {dk, Hv, Tr});
        be->conv1d_silu(upload(*be, random_vec(size_t(C * Tr), 63), {C, Tr}), upload(*be, random_vec(size_t(K * C), 64), {K, C}),
                        rs, sr, u);
        be->gated_delta_rule(upload(*be, l2_normalized(random_vec(size_t(dk * Hk * Tr), 65), dk), {dk, Hk, Tr}),
                             upload(*be, l2_normalized(random_vec(size_t(dk * Hk * Tr), 66), dk), {dk, Hk, Tr}),
                             upload(*be, random_vec(size_t(dk * Hv * Tr), 67), {dk, Hv, Tr}),
                             upload(*be, random_vec(size_t(Hv * Tr), 68), {Hv, Tr}),
                             upload(*be, random_vec(size_t(Hv * Tr), 69), {Hv, Tr}),
                             upload(*be, random_vec(size_t(Hv), 70), {Hv}), upload(*be, random_vec(size_t(Hv), 71, -4, -1), {Hv}),
                             rs, sr, o);
        results[which].push_back(download(*be, u));
        results[which].push_back(download(*be, o));
    }
    for (size_t i = 0; i < results[0].size(); ++i) EXPECT_EQ(results[0][i], results[1][i]) << "output " << i;
}

// Every index exactly once, for task counts below, at and above the thread
// count, with the pool oversubscribed (8 threads on this machine's cores), and
// with gaps and slow tasks long enough that both the workers and the caller
// fall asleep between and within regions (the wake-up paths).
TEST(RuntimeOps, ThreadPoolRunsEveryTaskOnce) {
    for (int nt : {2, 3, 8}) {
        ThreadPool pool(nt);
        for (int64_t n : {int64_t(0), int64_t(1), int64_t(2), int64_t(7), int64_t(64), int64_t(1000)}) {
            for (int rep = 0; rep < 3; ++rep) {
                std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
                const uint64_t before = pool.regions();
                pool.parallel_for(n, [&](int64_t i, int tid) {
                    ASSERT_GE(tid, 0);
                    ASSERT_LT(tid, nt);
                    if (rep == 2 && i == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
                    hits[size_t(i)].fetch_add(1);
                });
                for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
                EXPECT_EQ(pool.regions() - before, n > 1 ? 1u : 0u) << "n=" << n;
                if (rep == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
        }
        // Many short regions back to back: latecomers must skip closed regions
        // without touching the next one's tasks twice or missing any.
        std::atomic<int64_t> total{0};
        for (int rep = 0; rep < 3000; ++rep)
            pool.parallel_for(5, [&](int64_t i, int) { total.fetch_add(i + 1, std::memory_order_relaxed); });
        EXPECT_EQ(total.load(), 3000 * 15);
        std::vector<int> seen(size_t(nt), 0);
        pool.run_on_all([&](int part, int n) {
            EXPECT_EQ(n, nt);
            seen[size_t(part)]++;  // parts, not threads: a part may run on another thread
        });
        for (int v : seen) EXPECT_EQ(v, 1);
    }
}

// Consecutive matmuls on one input run as one parallel region, with the same
// results as separate products; a different input or any other op ends the
// group, and later ops see the products.
TEST(RuntimeOps, CpuMatmulsOnOneInputShareARegion) {
    auto pool = std::make_shared<ThreadPool>(2);
    auto be = make_cpu_backend(pool);
    const int64_t K = 512, T = 1;
    const int64_t Ns[3] = {160, 192, 256};  // each alone is worth a region
    std::vector<std::vector<uint8_t>> wq(3);
    std::vector<Tensor> w(3), y(3);
    const std::vector<float> xs = random_vec(size_t(K * T), 90);
    Tensor x = upload(*be, xs, {K, T});
    for (int i = 0; i < 3; ++i) {
        const std::vector<float> wf = random_vec(size_t(K * Ns[i]), 91 + uint32_t(i));
        wq[size_t(i)].resize(row_bytes(GgmlType::Q4_K, K) * size_t(Ns[i]));
        for (int64_t r = 0; r < Ns[i]; ++r)
            quantize_row(GgmlType::Q4_K, wf.data() + r * K, wq[size_t(i)].data() + size_t(r) * row_bytes(GgmlType::Q4_K, K), K);
        w[size_t(i)].type = GgmlType::Q4_K;
        w[size_t(i)].ne[0] = K;
        w[size_t(i)].ne[1] = Ns[i];
        set_contiguous_strides(w[size_t(i)]);
        w[size_t(i)].data = wq[size_t(i)].data();
        w[size_t(i)].name = "w";
        y[size_t(i)] = be->alloc(GgmlType::F32, {Ns[i], T});
    }
    const uint64_t r0 = pool->regions();
    for (int i = 0; i < 3; ++i) be->matmul(w[size_t(i)], x, y[size_t(i)]);
    Tensor sum = be->alloc(GgmlType::F32, {Ns[0], T});
    be->add(y[0], y[0], sum);  // ends the group; must see y[0]
    EXPECT_EQ(pool->regions() - r0, 1u) << "three products on one input: one fork/join";
    ThreadPool one(1);
    for (int i = 0; i < 3; ++i) {
        std::vector<float> want(size_t(Ns[i] * T));
        cpu_matmul(GgmlType::Q4_K, wq[size_t(i)].data(), K, Ns[i], xs.data(), T, want.data(), Ns[i], one);
        const std::vector<float> got = download(*be, y[size_t(i)]);
        for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], want[k]) << "matrix " << i << " row " << k;
        if (i == 0) {
            const std::vector<float> s = download(*be, sum);
            for (size_t k = 0; k < s.size(); ++k) ASSERT_EQ(s[k], 2 * want[k]) << "add after the group, row " << k;
        }
    }
    // A different input starts a new group: two regions (each product is
    // large enough to be worth one).
    Tensor x2 = upload(*be, random_vec(size_t(K * T), 95), {K, T});
    Tensor y2 = be->alloc(GgmlType::F32, {Ns[2], T});
    const uint64_t r1 = pool->regions();
    be->matmul(w[2], x, y[2]);
    be->matmul(w[2], x2, y2);
    be->synchronize();
    EXPECT_EQ(pool->regions() - r1, 2u);
}

// Decode-sized single rows are split over the pool (columns of elementwise
// ops, channel blocks of the conv, slices of the argmax row): the results must
// not depend on the split, and the argmax must keep the first maximum when
// equal values sit in different slices.
TEST(RuntimeOps, CpuDecodeRowsSplitOverThePool) {
    const int64_t n = 9000, C = 8192, K = 4, V = 250000;
    std::vector<std::vector<float>> results[2];
    std::vector<int32_t> picks[2];
    for (int which = 0; which < 2; ++which) {
        auto pool = std::make_shared<ThreadPool>(which == 0 ? 1 : 4);
        auto be = make_cpu_backend(pool);
        const uint64_t regions = pool->regions();
        const std::vector<float> gs = random_vec(size_t(n), 80, -6, 6), us = random_vec(size_t(n), 81);
        Tensor g = upload(*be, gs, {n, 1}), u = upload(*be, us, {n, 1}), y = be->alloc(GgmlType::F32, {n, 1});
        be->swiglu(g, u, y);
        results[which].push_back(download(*be, y));
        be->sigmoid_mul(u, g, y);
        results[which].push_back(download(*be, y));
        Tensor x = upload(*be, random_vec(size_t(128 * 32), 82), {128, 32}), z = upload(*be, random_vec(size_t(128 * 32), 83), {128, 32});
        Tensor yn = be->alloc(GgmlType::F32, {128, 32});
        be->rms_norm_gated(x, upload(*be, random_vec(128, 84), {128}), z, 1e-6f, yn);
        results[which].push_back(download(*be, yn));
        // conv: a prompt of 3 tokens, then two decode steps carrying the state
        RecurrentState rs{be->alloc(GgmlType::F32, {C, K - 1, 1}), Tensor{}};
        const Tensor w = upload(*be, random_vec(size_t(K * C), 85), {K, C});
        for (int32_t pos : {0, 3, 4}) {
            const int32_t len = pos == 0 ? 3 : 1;
            StepInfo st = make_step(*be, {{0, len, 0, pos}});
            Tensor out = be->alloc(GgmlType::F32, {C, len});
            be->conv1d_silu(upload(*be, random_vec(size_t(C * len), 86 + uint32_t(pos)), {C, len}), w, rs, st, out);
            results[which].push_back(download(*be, out));
        }
        results[which].push_back(download(*be, rs.conv));
        if (which == 1) {
            EXPECT_GT(pool->regions() - regions, 4u) << "decode-sized rows ran on one thread";
        }

        // argmax: row 0 has its maximum twice, in different slices; row 1 in the last slice
        std::vector<float> lg = random_vec(size_t(V * 2), 87);
        lg[70001] = 5.f;
        lg[200000] = 5.f;
        lg[size_t(V) + 249999] = 7.f;
        Tensor ids = be->alloc(GgmlType::I32, {2});
        be->argmax(upload(*be, lg, {V, 2}), ids);
        picks[which].resize(2);
        be->read(ids, picks[which].data(), 8);
    }
    for (size_t i = 0; i < results[0].size(); ++i) EXPECT_EQ(results[0][i], results[1][i]) << "output " << i;
    for (int which = 0; which < 2; ++which) {
        EXPECT_EQ(picks[which][0], 70001) << which;
        EXPECT_EQ(picks[which][1], 249999) << which;
    }
    // and the values themselves against the definitions
    const std::vector<float> gs = random_vec(size_t(n), 80, -6, 6), us = random_vec(size_t(n), 81);
    for (int64_t i = 0; i < n; i += 997)
        EXPECT_NEAR(results[1][0][size_t(i)], silu(gs[size_t(i)]) * us[size_t(i)], 1e-5) << i;
}

// top_k: the k best of each row as the sampler orders them (larger logit
// first, -0 equal to +0, NaN last, the lower id first among equals), with
// the values as they are in the row; the pool's slices must not change it.
TEST(RuntimeOps, TopKOrdersAsTheSampler) {
    const int64_t V = 40000, T = 3;
    std::vector<float> lg = random_vec(size_t(V * T), 91, -4, 4);
    for (size_t i = 0; i < lg.size(); i += 3) lg[i] = std::round(lg[i]);  // many ties, across slices
    lg[5] = -0.0f;
    lg[6] = 0.0f;
    lg[size_t(V) + 7] = NAN;
    lg[size_t(V) + 8] = -INFINITY;
    for (int64_t i = 0; i < V; ++i) lg[size_t(2 * V + i)] = i % 2 ? -0.0f : 0.0f;  // a row of zeros
    auto reference = [&](int64_t t, int64_t k, std::vector<int32_t>& ids) {
        const std::vector<int32_t> order = test::logit_order(&lg[size_t(t * V)], V);
        ids.assign(order.begin(), order.begin() + k);
    };
    for (int threads : {1, 4}) {
        auto be = make_cpu_backend(std::make_shared<ThreadPool>(threads));
        const Tensor logits = upload(*be, lg, {V, T});
        for (int64_t k : {1, 7, 40, 256}) {
            for (bool base : {false, true}) {
                Tensor values = be->alloc(GgmlType::F32, {k, T}), ids = be->alloc(GgmlType::I32, {k, T});
                if (base) be->Backend::top_k(logits, values, ids);
                else be->top_k(logits, values, ids);
                std::vector<float> v(size_t(k * T));
                std::vector<int32_t> id(size_t(k * T)), want;
                be->read(values, v.data(), v.size() * 4);
                be->read(ids, id.data(), id.size() * 4);
                for (int64_t t = 0; t < T; ++t) {
                    reference(t, k, want);
                    for (int64_t j = 0; j < k; ++j) {
                        ASSERT_EQ(id[size_t(t * k + j)], want[size_t(j)])
                            << "threads " << threads << " k " << k << " base " << base << " row " << t << " rank " << j;
                        const float a = v[size_t(t * k + j)], b = lg[size_t(t * V + want[size_t(j)])];
                        ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << "value of rank " << j;
                    }
                }
            }
        }
        Tensor bad = be->alloc(GgmlType::F32, {V + 1, T}), bad_ids = be->alloc(GgmlType::I32, {V + 1, T});
        EXPECT_THROW(be->top_k(logits, bad, bad_ids), Error);  // k > V
    }
}

}  // namespace
}  // namespace qinfer
