// CUDA backend ops against the CPU backend on the same random inputs: norms,
// elementwise gates, RoPE, attention over the KV cache (prefill, decode, long
// contexts that split the key range, several slots), the causal conv and the
// gated delta rule with state carried across calls, and graph replay.
// Skipped when there is no GPU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "runtime/backend.h"
#include "cuda_testutil.h"
#include "testutil.h"
#ifdef QINFER_HAVE_CUDA
#include "runtime/cuda/cuda_backend.h"
#endif

namespace qinfer {
namespace {

using test::randn;


// The same tensor on both backends.
struct Pair {
    Tensor c, g;
};

struct Both {
    std::unique_ptr<Backend> cpu = make_cpu_backend(std::make_shared<ThreadPool>(2));
    std::unique_ptr<Backend> gpu = make_cuda_backend(0);

    Pair f32(const std::vector<float>& v, std::initializer_list<int64_t> ne) {
        Pair p{cpu->alloc(GgmlType::F32, ne, "t"), gpu->alloc(GgmlType::F32, ne, "t")};
        cpu->write(p.c, v.data(), v.size() * 4);
        gpu->write(p.g, v.data(), v.size() * 4);
        return p;
    }
    Pair zeros(GgmlType t, std::initializer_list<int64_t> ne) {
        Pair p{cpu->alloc(t, ne, "z"), gpu->alloc(t, ne, "z")};
        // GPU buffers are poisoned so unwritten outputs show up as NaN
        std::vector<uint8_t> poison(p.g.nbytes(), 0xFF);
        if (t == GgmlType::F32) gpu->write(p.g, poison.data(), poison.size());
        return p;
    }
    // Max |cpu - gpu| over a (possibly strided) tensor, read whole.
    double max_diff(const Pair& p, double* max_ref = nullptr) {
        std::vector<float> a(p.c.nbytes() / 4), b(p.g.nbytes() / 4);
        cpu->read(p.c, a.data(), a.size() * 4);
        gpu->read(p.g, b.data(), b.size() * 4);
        double m = 0, r = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            if (!std::isfinite(b[i])) return INFINITY;
            m = std::max(m, double(std::fabs(a[i] - b[i])));
            r = std::max(r, double(std::fabs(a[i])));
        }
        if (max_ref) *max_ref = r;
        return m;
    }
};

Pair view2(const Pair& p, std::initializer_list<int64_t> ne, std::initializer_list<size_t> nb, size_t off = 0) {
    return Pair{view(p.c, ne, nb, off), view(p.g, ne, nb, off)};
}

struct Steps {
    StepInfo c, g;
};

Steps make_steps(Both& b, const std::vector<int32_t>& pos, const std::vector<int32_t>& slot, int capacity) {
    Steps s;
    for (StepInfo* st : {&s.c, &s.g}) {
        Backend& be = st == &s.c ? *b.cpu : *b.gpu;
        st->n_tokens = int(pos.size());
        st->pos = pos;
        st->slot = slot;
        for (size_t t = 0; t < pos.size(); ++t) {
            if (st->segments.empty() || st->segments.back().slot != slot[t])
                st->segments.push_back({int32_t(t), 0, slot[t], pos[t]});
            ++st->segments.back().count;
        }
        st->pos_t = be.alloc(GgmlType::I32, {capacity}, "pos");
        st->slot_t = be.alloc(GgmlType::I32, {capacity}, "slot");
        st->seg_t = be.alloc(GgmlType::I32, {4, capacity}, "seg");
        be.write(st->pos_t, pos.data(), pos.size() * 4);
        be.write(st->slot_t, slot.data(), slot.size() * 4);
        be.write(st->seg_t, st->segments.data(), st->segments.size() * sizeof(StepInfo::Segment));
    }
    return s;
}

TEST(CudaOps, NormsGatesAndCopiesMatchCpu) {
    REQUIRE_GPU();
    Both b;
    const int64_t d = 64, H = 3, T = 5;
    // rows of an interleaved [q | gate] buffer, as qwen35 uses them
    Pair qg = b.f32(randn(size_t(2 * d * H * T), 1, 3.f), {2 * d * H, T});
    const size_t row = size_t(2 * d) * 4, tok = size_t(2 * d * H) * 4;
    Pair q_in = view2(qg, {d, H, T}, {row, tok}, 0);
    Pair gate = view2(qg, {d, H, T}, {row, tok}, size_t(d) * 4);
    Pair w = b.f32(randn(size_t(d), 2), {d});
    Pair out = b.zeros(GgmlType::F32, {d, H, T});
    b.cpu->rms_norm(q_in.c, w.c, 1e-6f, out.c);
    b.gpu->rms_norm(q_in.g, w.g, 1e-6f, out.g);
    EXPECT_LT(b.max_diff(out), 1e-5);
    b.cpu->sigmoid_mul(out.c, gate.c, out.c);
    b.gpu->sigmoid_mul(out.g, gate.g, out.g);
    EXPECT_LT(b.max_diff(out), 1e-5);

    const int64_t E = 2560 + 3;  // block-per-row path, odd length
    Pair x = b.f32(randn(size_t(E * T), 3, 10.f), {E, T});
    Pair wE = b.f32(randn(size_t(E), 4), {E});
    Pair y = b.zeros(GgmlType::F32, {E, T});
    b.cpu->rms_norm(x.c, wE.c, 1e-6f, y.c);
    b.gpu->rms_norm(x.g, wE.g, 1e-6f, y.g);
    EXPECT_LT(b.max_diff(y), 1e-4);
    b.cpu->l2_norm(x.c, 1e-6f, y.c);
    b.gpu->l2_norm(x.g, 1e-6f, y.g);
    EXPECT_LT(b.max_diff(y), 1e-6);
    Pair z = b.f32(randn(size_t(E * T), 5, 2.f), {E, T});
    b.cpu->rms_norm_gated(x.c, wE.c, z.c, 1e-6f, y.c);
    b.gpu->rms_norm_gated(x.g, wE.g, z.g, 1e-6f, y.g);
    EXPECT_LT(b.max_diff(y), 1e-4);
    b.cpu->add(x.c, z.c, y.c);
    b.gpu->add(x.g, z.g, y.g);
    EXPECT_LT(b.max_diff(y), 1e-5);
    b.cpu->swiglu(x.c, z.c, x.c);  // in place
    b.gpu->swiglu(x.g, z.g, x.g);
    EXPECT_LT(b.max_diff(x), 1e-4);
    Pair c = b.zeros(GgmlType::F32, {d, H, T});
    b.cpu->copy(gate.c, c.c);
    b.gpu->copy(gate.g, c.g);
    EXPECT_EQ(b.max_diff(c), 0.0);
}

TEST(CudaOps, RopeMatchesCpuAtLargePositions) {
    REQUIRE_GPU();
    Both b;
    const int64_t d = 64, H = 4, T = 6;
    std::vector<int32_t> pos = {0, 1, 7, 4095, 100000, 262143};
    Steps st = make_steps(b, pos, std::vector<int32_t>(size_t(T), 0), 8);
    for (int n_rot : {16, 64}) {
        Pair x = b.f32(randn(size_t(d * H * T), uint32_t(10 + n_rot)), {d, H, T});
        b.cpu->rope_neox(x.c, st.c, n_rot, 1e7f, 1.f);
        b.gpu->rope_neox(x.g, st.g, n_rot, 1e7f, 1.f);
        EXPECT_LT(b.max_diff(x), 2e-6) << "n_rot " << n_rot;
    }
}

struct AttnCase {
    int64_t d, n_head, n_kv;
    GgmlType kv;
};

class CudaAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, PrefillDecodeAndLongContextMatchCpu) {
    REQUIRE_GPU();
    const AttnCase ac = GetParam();
    Both b;
    const int64_t d = ac.d, H = ac.n_head, G = ac.n_kv, n_ctx = 2048, n_slots = 2;
    KvCache kc{b.cpu->alloc(ac.kv, {d, G, n_ctx, n_slots}, "k"), b.cpu->alloc(ac.kv, {d, G, n_ctx, n_slots}, "v")};
    KvCache kg{b.gpu->alloc(ac.kv, {d, G, n_ctx, n_slots}, "k"), b.gpu->alloc(ac.kv, {d, G, n_ctx, n_slots}, "v")};
    int len[2] = {0, 0};
    uint32_t seed = 100;
    // (tokens of slot 0, tokens of slot 1) per call: prompts of two slots in one
    // batch, then decode steps, then a long prompt and decode far into the cache.
    const std::vector<std::pair<int, int>> calls = {{37, 5}, {1, 1}, {0, 1}, {1, 0}, {1400, 0}, {1, 1}, {3, 2}};
    for (auto [n0, n1] : calls) {
        std::vector<int32_t> pos, slot;
        for (int i = 0; i < n0; ++i) { pos.push_back(len[0] + i); slot.push_back(0); }
        for (int i = 0; i < n1; ++i) { pos.push_back(len[1] + i); slot.push_back(1); }
        const int64_t T = int64_t(pos.size());
        Steps st = make_steps(b, pos, slot, int(T));
        Pair q = b.f32(randn(size_t(d * H * T), seed++), {d, H, T});
        Pair k = b.f32(randn(size_t(d * G * T), seed++), {d, G, T});
        Pair v = b.f32(randn(size_t(d * G * T), seed++), {d, G, T});
        Pair out = b.zeros(GgmlType::F32, {d, H, T});
        const float scale = 1.f / std::sqrt(float(d));
        b.cpu->attention(q.c, k.c, v.c, kc, st.c, scale, out.c);
        b.gpu->attention(q.g, k.g, v.g, kg, st.g, scale, out.g);
        double ref = 0;
        const double diff = b.max_diff(out, &ref);
        // Prompt chunks of 128+ tokens over an f16 or q8_0 cache take the
        // tensor-core kernel: f16 q and probabilities (1.1e-4 x (1 + max)
        // measured on an H200 at d = 64; up to 2.6e-4 with q8_0 values rounded to f16
        // in its tiles); everything else f32 scores as the CPU.
        const bool tensor_cores = ac.kv != GgmlType::F32 && std::max(n0, n1) >= 128;
        EXPECT_LT(diff, (tensor_cores ? 1e-3 : 2e-5) * (ref + 1)) << "call (" << n0 << "," << n1 << ") d=" << d;
        len[0] += n0;
        len[1] += n1;
    }
    // Both caches hold the same bytes (q8_0: the same quantization), past the
    // filled rows the zeros of alloc().
    for (const Tensor* t : {&kc.k, &kc.v}) {
        const Tensor& g = t == &kc.k ? kg.k : kg.v;
        std::vector<uint8_t> host(t->nbytes()), dev(g.nbytes());
        ASSERT_EQ(host.size(), dev.size());
        b.cpu->read(*t, host.data(), host.size());
        b.gpu->read(g, dev.data(), dev.size());
        size_t differ = 0;
        for (size_t i = 0; i < host.size(); ++i) differ += host[i] != dev[i];
        EXPECT_EQ(differ, 0u) << (t == &kc.k ? "K" : "V") << " cache bytes differ";
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(AttnCase{64, 4, 2, GgmlType::F16}, AttnCase{128, 8, 2, GgmlType::F16},
                                           AttnCase{256, 8, 2, GgmlType::F16}, AttnCase{128, 4, 4, GgmlType::F32},
                                           AttnCase{64, 7, 1, GgmlType::F32}, AttnCase{64, 4, 2, GgmlType::Q8_0},
                                           AttnCase{128, 8, 2, GgmlType::Q8_0}, AttnCase{256, 16, 4, GgmlType::Q8_0}),
                         [](const ::testing::TestParamInfo<AttnCase>& i) {
                             return "d" + std::to_string(i.param.d) + "_h" + std::to_string(i.param.n_head) + "_kv" +
                                    std::to_string(i.param.n_kv) + "_" + type_name(i.param.kv);
                         });

class CudaDeltaNet : public ::testing::TestWithParam<int64_t> {};

TEST_P(CudaDeltaNet, ConvAndDeltaRuleMatchCpuAcrossCalls) {
    REQUIRE_GPU();
    Both b;
    const int64_t dk = GetParam(), Hk = 2, Hv = 4, Kc = 4, n_slots = 2;
    const int64_t C = 2 * Hk * dk + Hv * dk;
    RecurrentState rc{b.cpu->alloc(GgmlType::F32, {C, Kc - 1, n_slots}, "conv"),
                      b.cpu->alloc(GgmlType::F32, {dk, dk, Hv, n_slots}, "S")};
    RecurrentState rg{b.gpu->alloc(GgmlType::F32, {C, Kc - 1, n_slots}, "conv"),
                      b.gpu->alloc(GgmlType::F32, {dk, dk, Hv, n_slots}, "S")};
    Pair w = b.f32(randn(size_t(Kc * C), 50, 0.3f), {Kc, C});
    std::vector<float> dtb = randn(size_t(Hv), 51, 0.25f), A(static_cast<size_t>(Hv));
    for (float& x : dtb) x -= 1.f;
    for (int64_t j = 0; j < Hv; ++j) A[size_t(j)] = -std::exp(0.4f * float(j));
    Pair dt = b.f32(dtb, {Hv}), sa = b.f32(A, {Hv});
    int len[2] = {0, 0};
    uint32_t seed = 60;
    for (auto [n0, n1] : std::vector<std::pair<int, int>>{{9, 3}, {1, 1}, {0, 2}, {70, 0}, {1, 1}}) {
        std::vector<int32_t> pos, slot;
        for (int i = 0; i < n0; ++i) { pos.push_back(len[0] + i); slot.push_back(0); }
        for (int i = 0; i < n1; ++i) { pos.push_back(len[1] + i); slot.push_back(1); }
        const int64_t T = int64_t(pos.size());
        Steps st = make_steps(b, pos, slot, int(T));
        Pair m = b.f32(randn(size_t(C * T), seed++), {C, T});
        Pair u = b.zeros(GgmlType::F32, {C, T});
        b.cpu->conv1d_silu(m.c, w.c, rc, st.c, u.c);
        b.gpu->conv1d_silu(m.g, w.g, rg, st.g, u.g);
        EXPECT_LT(b.max_diff(u), 1e-5);
        const size_t tok = size_t(C) * 4;
        Pair q = view2(u, {dk, Hk, T}, {size_t(dk) * 4, tok}, 0);
        Pair k = view2(u, {dk, Hk, T}, {size_t(dk) * 4, tok}, size_t(Hk * dk) * 4);
        Pair v = view2(u, {dk, Hv, T}, {size_t(dk) * 4, tok}, size_t(2 * Hk * dk) * 4);
        b.cpu->l2_norm(q.c, 1e-6f, q.c);
        b.gpu->l2_norm(q.g, 1e-6f, q.g);
        b.cpu->l2_norm(k.c, 1e-6f, k.c);
        b.gpu->l2_norm(k.g, 1e-6f, k.g);
        Pair a = b.f32(randn(size_t(Hv * T), seed++), {Hv, T});
        Pair bb = b.f32(randn(size_t(Hv * T), seed++), {Hv, T});
        Pair o = b.zeros(GgmlType::F32, {dk, Hv, T});
        b.cpu->gated_delta_rule(q.c, k.c, v.c, a.c, bb.c, dt.c, sa.c, rc, st.c, o.c);
        b.gpu->gated_delta_rule(q.g, k.g, v.g, a.g, bb.g, dt.g, sa.g, rg, st.g, o.g);
        double ref = 0;
        EXPECT_LT(b.max_diff(o, &ref), 1e-5 * (ref + 1)) << "call (" << n0 << "," << n1 << ")";
        EXPECT_LT(b.max_diff(Pair{rc.S, rg.S}), 1e-5) << "state after (" << n0 << "," << n1 << ")";
        EXPECT_LT(b.max_diff(Pair{rc.conv, rg.conv}), 0.0 + 1e-7);
        len[0] += n0;
        len[1] += n1;
    }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, CudaDeltaNet, ::testing::Values(32, 64, 128));

// Quantized weight uploaded to both backends.
Pair qweight(Both& b, GgmlType t, int64_t K, int64_t N, uint32_t seed, std::vector<uint8_t>& keep) {
    const std::vector<float> wf = randn(size_t(K * N), seed, 0.3f);
    const size_t rb = row_bytes(t, K);
    keep.resize(rb * size_t(N));
    for (int64_t n = 0; n < N; ++n) quantize_row(t, &wf[size_t(n * K)], &keep[rb * size_t(n)], K);
    gguf::TensorInfo ti;
    ti.name = "w";
    ti.type = t;
    ti.n_dims = 2;
    ti.ne[0] = K;
    ti.ne[1] = N;
    ti.nbytes = keep.size();
    ti.data = keep.data();
    Pair p{b.cpu->upload_weight(ti), b.gpu->upload_weight(ti)};
    b.gpu->synchronize();
    return p;
}

// Projections sharing an input run as one launch and the residual add after the
// last one becomes its epilogue; the results are those of the ops one by one.
TEST(CudaOps, FusedProjectionsAndResidualMatchCpu) {
    REQUIRE_GPU();
    Both b;
    const int64_t E = 512, N1 = 384, N2 = 256, N3 = 32;
    std::vector<uint8_t> k1, k2, k3, k4;
    Pair w1 = qweight(b, GgmlType::Q4_K, E, N1, 1, k1), w2 = qweight(b, GgmlType::Q6_K, E, N2, 2, k2);
    Pair w3 = qweight(b, GgmlType::Q4_K, E, N3, 3, k3), wo = qweight(b, GgmlType::Q8_0, N1, E, 4, k4);
    for (int64_t T : {1, 3, 8}) {
        Pair x = b.f32(randn(size_t(E * T), uint32_t(10 + T)), {E, T});
        Pair r = b.f32(randn(size_t(E * T), uint32_t(20 + T)), {E, T});
        Pair y1 = b.zeros(GgmlType::F32, {N1, T}), y2 = b.zeros(GgmlType::F32, {N2, T}), y3 = b.zeros(GgmlType::F32, {N3, T});
        Pair o = b.zeros(GgmlType::F32, {E, T});
        for (Backend* be : {b.cpu.get(), b.gpu.get()}) {
            const bool g = be == b.gpu.get();
            auto pick = [&](const Pair& p) { return g ? p.g : p.c; };
            be->matmul(pick(w1), pick(x), pick(y1), nullptr);
            be->matmul(pick(w2), pick(x), pick(y2), nullptr);
            be->matmul(pick(w3), pick(x), pick(y3), nullptr);
            be->matmul(pick(wo), pick(y1), pick(o), nullptr);
            be->add(pick(r), pick(o), pick(r));
        }
        double ref = 0;
        EXPECT_LT(b.max_diff(y1, &ref), 1e-4 * (ref + 1)) << "T=" << T;
        EXPECT_LT(b.max_diff(y2, &ref), 1e-4 * (ref + 1)) << "T=" << T;
        EXPECT_LT(b.max_diff(y3, &ref), 1e-4 * (ref + 1)) << "T=" << T;
        EXPECT_LT(b.max_diff(o, &ref), 1e-4 * (ref + 1)) << "T=" << T;
        EXPECT_LT(b.max_diff(r, &ref), 1e-4 * (ref + 1)) << "T=" << T;
    }
}

// A recorded step replays with new inputs and gives what eager execution gives.
TEST(CudaGraphs, ReplayEqualsEagerWithNewInputs) {
    REQUIRE_GPU();
    Both b;
    const int64_t E = 256, N = 320, T = 1;
    std::vector<float> wf = randn(size_t(N * E), 70);
    Pair w = b.f32(wf, {E, N});
    Pair nw = b.f32(randn(size_t(E), 71), {E});
    Pair x = b.f32(randn(size_t(E * T), 72), {E, T});
    Pair h = b.zeros(GgmlType::F32, {E, T});
    Pair y = b.zeros(GgmlType::F32, {N, T});
    Tensor ids = b.gpu->alloc(GgmlType::I32, {T}, "ids");
    for (int step = 0; step < 5; ++step) {
        std::vector<float> xv = randn(size_t(E * T), uint32_t(80 + step));
        b.cpu->write(x.c, xv.data(), xv.size() * 4);
        b.gpu->write(x.g, xv.data(), xv.size() * 4);
        b.cpu->rms_norm(x.c, nw.c, 1e-6f, h.c);
        b.cpu->matmul(w.c, h.c, y.c, nullptr);
        if (b.gpu->begin_graph(7)) {
            b.gpu->rms_norm(x.g, nw.g, 1e-6f, h.g);
            b.gpu->matmul(w.g, h.g, y.g, nullptr);
            b.gpu->argmax(y.g, ids);
        }
        b.gpu->end_graph();
        double ref = 0;
        EXPECT_LT(b.max_diff(y, &ref), 1e-5 * (ref + 1)) << "step " << step;
        std::vector<float> yc(static_cast<size_t>(N));
        b.cpu->read(y.c, yc.data(), yc.size() * 4);
        int32_t id = -1;
        b.gpu->read(ids, &id, 4);
        EXPECT_EQ(id, int32_t(std::max_element(yc.begin(), yc.end()) - yc.begin())) << "step " << step;
    }
}

// A step begun with record = false (long prompt chunks) is never recorded: the
// ops are issued every time, results equal the CPU's, and no graph launches.
// Its 90 ops also go out in several runs while it is still being issued (cut
// after an add).
TEST(CudaGraphs, UnrecordedStepsRunAsIssued) {
    REQUIRE_GPU();
    Both b;
    auto* cuda = dynamic_cast<CudaBackend*>(b.gpu.get());
    ASSERT_NE(cuda, nullptr);
    const int64_t E = 256, T = 3;
    Pair w = b.f32(randn(size_t(E * E), 90, 0.05f), {E, E});
    Pair nw = b.f32(randn(size_t(E), 91), {E});
    Pair x = b.f32(randn(size_t(E * T), 92), {E, T});
    Pair h = b.zeros(GgmlType::F32, {E, T});
    Pair y = b.zeros(GgmlType::F32, {E, T});
    const uint64_t launches0 = cuda->graph_launches();
    for (int step = 0; step < 4; ++step) {
        std::vector<float> xv = randn(size_t(E * T), uint32_t(93 + step));
        b.cpu->write(x.c, xv.data(), xv.size() * 4);
        b.gpu->write(x.g, xv.data(), xv.size() * 4);
        for (int l = 0; l < 30; ++l) {
            b.cpu->rms_norm(x.c, nw.c, 1e-6f, h.c);
            b.cpu->matmul(w.c, h.c, y.c, nullptr);
            b.cpu->add(x.c, y.c, x.c);
        }
        ASSERT_TRUE(b.gpu->begin_graph(11, /*record=*/false)) << "step " << step;
        for (int l = 0; l < 30; ++l) {
            b.gpu->rms_norm(x.g, nw.g, 1e-6f, h.g);
            b.gpu->matmul(w.g, h.g, y.g, nullptr);
            b.gpu->add(x.g, y.g, x.g);
        }
        b.gpu->end_graph();
        double ref = 0;
        EXPECT_LT(b.max_diff(x, &ref), 1e-4 * (ref + 1)) << "step " << step;
    }
    EXPECT_EQ(cuda->graph_launches(), launches0) << "an unrecorded step was recorded or replayed";
}

// QINFER_CUDA_SKIP_OPS names ops; a name that is none is an error, not a no-op.
TEST(CudaBackendEnv, SkipOpsRejectsUnknownNames) {
    REQUIRE_GPU();
    test::set_env("QINFER_CUDA_SKIP_OPS", "matmul:no_such_op");
    try {
        auto be = make_cuda_backend(0);
        ADD_FAILURE() << "no error for an unknown op name";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("no_such_op"), std::string::npos) << e.what();
    }
    test::unset_env("QINFER_CUDA_SKIP_OPS");
}

// A skipped op leaves the queue before the fusions look at it: an add that
// would have become a product's epilogue is gone with it (its output keeps
// its poison) while the product itself still runs.
TEST(CudaBackendEnv, SkippedOpIsNotFusedIntoAProduct) {
    REQUIRE_GPU();
    test::set_env("QINFER_CUDA_SKIP_OPS", "add");
    struct Unset {
        ~Unset() { test::unset_env("QINFER_CUDA_SKIP_OPS"); }
    } unset;
    Both b;
    const int64_t E = 256, N = 256;
    std::vector<uint8_t> keep;
    Pair w = qweight(b, GgmlType::Q4_K, E, N, 5, keep);
    Pair x = b.f32(randn(size_t(E), 6), {E, 1});
    Pair r = b.f32(randn(size_t(N), 7), {N, 1});
    Pair o = b.zeros(GgmlType::F32, {N, 1}), sum = b.zeros(GgmlType::F32, {N, 1});
    b.cpu->matmul(w.c, x.c, o.c, nullptr);
    b.gpu->matmul(w.g, x.g, o.g, nullptr);
    b.gpu->add(r.g, o.g, sum.g);
    double ref = 0;
    EXPECT_LT(b.max_diff(o, &ref), 1e-4 * (ref + 1)) << "the product still runs";
    EXPECT_GT(ref, 0.0);
    // b.zeros poisons GPU outputs with all-ones bytes: unwritten, they stay so
    std::vector<uint32_t> got(size_t(N), 0u);
    b.gpu->read(sum.g, got.data(), got.size() * 4);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 0xFFFFFFFFu) << "the skipped add ran, at " << i;
}

// The register-resident norm kernel (rows of up to 8192 floats; longer rows take
// the block-per-row kernel) against the CPU backend: lengths that leave lanes
// idle, rows spanning several warps, several rows per block, unaligned and
// in-place rows (scalar loads), and the three norm kinds.
TEST(CudaOps, RowNormsOfManyLengthsMatchCpu) {
    REQUIRE_GPU();
    Both b;
    for (int64_t n : {1, 7, 64, 100, 128, 260, 1000, 2560, 2563, 4096, 8192, 8200}) {
        for (int64_t T : {1, 3, 17}) {
            const std::string at = "n=" + std::to_string(n) + " T=" + std::to_string(T);
            Pair x = b.f32(randn(size_t(n * T), uint32_t(n + T), 4.f), {n, T});
            Pair w = b.f32(randn(size_t(n), uint32_t(n + 1)), {n});
            Pair z = b.f32(randn(size_t(n * T), uint32_t(n + 2)), {n, T});
            double ref = 0;
            Pair y = b.zeros(GgmlType::F32, {n, T});
            b.cpu->rms_norm(x.c, w.c, 1e-6f, y.c);
            b.gpu->rms_norm(x.g, w.g, 1e-6f, y.g);
            EXPECT_LT(b.max_diff(y, &ref), 1e-5 * (ref + 1)) << "rms_norm " << at;
            y = b.zeros(GgmlType::F32, {n, T});
            b.cpu->l2_norm(x.c, 1e-6f, y.c);
            b.gpu->l2_norm(x.g, 1e-6f, y.g);
            EXPECT_LT(b.max_diff(y, &ref), 1e-6) << "l2_norm " << at;
            y = b.zeros(GgmlType::F32, {n, T});
            b.cpu->rms_norm_gated(x.c, w.c, z.c, 1e-6f, y.c);
            b.gpu->rms_norm_gated(x.g, w.g, z.g, 1e-6f, y.g);
            EXPECT_LT(b.max_diff(y, &ref), 1e-5 * (ref + 1)) << "rms_norm_gated " << at;
            // rows starting one float into a wider buffer (unaligned), normed in place
            Pair wide = b.f32(randn(size_t((n + 1) * T), uint32_t(n + 3), 2.f), {n + 1, T});
            Pair xs = view2(wide, {n, T}, {size_t(n + 1) * 4}, 4);
            b.cpu->rms_norm(xs.c, w.c, 1e-6f, xs.c);
            b.gpu->rms_norm(xs.g, w.g, 1e-6f, xs.g);
            EXPECT_LT(b.max_diff(wide, &ref), 1e-5 * (ref + 1)) << "strided in-place rms_norm " << at;
        }
    }
}

using test::set_env;
using test::unset_env;

// The first of `vars` set to 0 in the environment (a fusion test needs them
// on), or nullptr.
const char* switched_off(std::initializer_list<const char*> vars) {
    for (const char* var : vars)
        if (const char* v = std::getenv(var); v && std::string(v) == "0") return var;
    return nullptr;
}

// The CPU backend, a CUDA backend with a fusion off (`var`=0) and one with it
// on (`var` unset, or `on`).
struct Trio {
    std::unique_ptr<Backend> be[3];
    using T3 = std::array<Tensor, 3>;
    // Weight blocks and their descriptions (the CPU backend uses them in place).
    std::list<std::pair<std::vector<uint8_t>, gguf::TensorInfo>> keep;
    explicit Trio(const char* var = "QINFER_CUDA_FUSE_NORM", const char* on = nullptr) {
        const char* v = std::getenv(var);
        const std::string saved = v ? v : "";
        be[0] = make_cpu_backend(std::make_shared<ThreadPool>(2));
        set_env(var, "0");
        be[1] = make_cuda_backend(0);
        if (on) set_env(var, on);
        else unset_env(var);
        be[2] = make_cuda_backend(0);
        if (v) set_env(var, saved.c_str());
        else unset_env(var);
    }
    T3 f32(std::initializer_list<int64_t> ne, const char* name) {
        T3 t;
        for (int i = 0; i < 3; ++i) t[i] = be[i]->alloc(GgmlType::F32, ne, name);
        return t;
    }
    void put(const T3& t, const std::vector<float>& v) {
        for (int i = 0; i < 3; ++i) be[i]->write(t[i], v.data(), v.size() * 4);
    }
    // New random attention inputs for a step (each seeded from ++seed).
    void put_qkv(const T3& q, const T3& k, const T3& v, uint32_t& seed) {
        for (const T3* t : {&q, &k, &v}) put(*t, randn(size_t((*t)[0].nbytes() / 4), ++seed, 2.f));
    }
    T3 out(std::initializer_list<int64_t> ne, const char* name) {  // GPU copies poisoned (NaN)
        T3 t = f32(ne, name);
        std::vector<uint8_t> poison(t[0].nbytes(), 0xFF);
        for (int i = 1; i < 3; ++i) be[i]->write(t[i], poison.data(), poison.size());
        return t;
    }
    T3 weight(GgmlType type, int64_t K, int64_t N, uint32_t seed) {
        const std::vector<float> wf = randn(size_t(K * N), seed, 0.3f);
        const size_t rb = row_bytes(type, K);
        keep.emplace_back();
        std::vector<uint8_t>& q = keep.back().first;
        q.resize(rb * size_t(N));
        for (int64_t n = 0; n < N; ++n) quantize_row(type, &wf[size_t(n * K)], &q[rb * size_t(n)], K);
        gguf::TensorInfo& ti = keep.back().second;
        ti.name = "w";
        ti.type = type;
        ti.n_dims = 2;
        ti.ne[0] = K;
        ti.ne[1] = N;
        ti.nbytes = q.size();
        ti.data = q.data();
        T3 t;
        for (int i = 0; i < 3; ++i) t[i] = be[i]->upload_weight(ti);
        return t;
    }
    std::vector<float> get(int i, const Tensor& t) {
        std::vector<float> v(t.nbytes() / 4);
        be[i]->read(t, v.data(), v.size() * 4);
        return v;
    }
    // The two CUDA results bit for bit, the fused one near the CPU's.
    void expect_same_and_near_cpu(const T3& t, const char* fused, const std::string& at) {
        const std::vector<float> ref = get(0, t[0]), off = get(1, t[1]), on = get(2, t[2]);
        EXPECT_EQ(0, std::memcmp(off.data(), on.data(), off.size() * 4)) << t[0].name << " differs " << fused << ", " << at;
        double m = 0, r = 0;
        for (size_t k = 0; k < ref.size(); ++k) {
            m = std::isfinite(on[k]) ? std::max(m, double(std::fabs(on[k] - ref[k]))) : INFINITY;
            r = std::max(r, double(std::fabs(ref[k])));
        }
        EXPECT_LT(m, 5e-3 * (r + 1)) << t[0].name << " vs CPU, " << at;
    }
};

uint64_t fused_producers(Backend& be) {
#ifdef QINFER_HAVE_CUDA
    return static_cast<CudaBackend&>(be).fused_producers();
#else
    (void)be;
    return 0;
#endif
}

// A KV cache per backend over n_slots sequences of n_ctx positions, every one
// filled with the same random rows in the cache's type (earlier steps' rows).
struct TrioCache {
    Trio& tr;
    Tensor K[3], V[3];
    size_t bytes = 0;
    TrioCache(Trio& t, GgmlType kt, int64_t d, int64_t Hk, int64_t n_ctx, int64_t n_slots, uint32_t seed) : tr(t) {
        const int64_t rows = Hk * n_ctx * n_slots;
        bytes = row_bytes(kt, d) * size_t(rows);
        const std::vector<float> f = randn(size_t(d * rows), seed);
        std::vector<uint8_t> q(bytes);
        for (size_t r = 0; r < size_t(rows); ++r) quantize_row(kt, &f[r * size_t(d)], &q[r * row_bytes(kt, d)], d);
        for (int i = 0; i < 3; ++i) {
            K[i] = tr.be[i]->alloc(kt, {d, Hk, n_ctx, n_slots}, "cache k");
            V[i] = tr.be[i]->alloc(kt, {d, Hk, n_ctx, n_slots}, "cache v");
            tr.be[i]->write(K[i], q.data(), q.size());
            tr.be[i]->write(V[i], q.data(), q.size());
        }
    }
    ~TrioCache() {
        for (int i = 0; i < 3; ++i) {
            tr.be[i]->free(K[i]);
            tr.be[i]->free(V[i]);
        }
    }
    KvCache kv(int i) const { return KvCache{K[i], V[i]}; }
};

// A decode step of T tokens for every backend: token t is the next token of
// sequence n_slots - 1 - t, at position p0 + 5 t (a segment of its own).
struct TrioSteps {
    Trio& tr;
    StepInfo st[3];
    TrioSteps(Trio& t, int64_t T) : tr(t) {
        for (int i = 0; i < 3; ++i) {
            st[i].n_tokens = int(T);
            st[i].pos_t = tr.be[i]->alloc(GgmlType::I32, {T}, "pos");
            st[i].slot_t = tr.be[i]->alloc(GgmlType::I32, {T}, "slot");
            st[i].seg_t = tr.be[i]->alloc(GgmlType::I32, {4, T}, "seg");
        }
    }
    void at(int32_t p0, int64_t n_slots) {
        for (int i = 0; i < 3; ++i) {
            StepInfo& s = st[i];
            const int64_t T = s.n_tokens;
            s.pos.clear();
            s.slot.clear();
            s.segments.clear();
            std::vector<int32_t> seg;
            for (int64_t t = 0; t < T; ++t) {
                const int32_t p = p0 + int32_t(5 * t), sl = int32_t(n_slots - 1 - t);
                s.pos.push_back(p);
                s.slot.push_back(sl);
                s.segments.push_back({int32_t(t), 1, sl, p});
                seg.insert(seg.end(), {int32_t(t), 1, sl, p});
            }
            tr.be[i]->write(s.pos_t, s.pos.data(), size_t(T) * 4);
            tr.be[i]->write(s.slot_t, s.slot.data(), size_t(T) * 4);
            tr.be[i]->write(s.seg_t, seg.data(), seg.size() * 4);
        }
    }
};

// rms_norm -> quantized matmuls, swiglu -> matmul, sigmoid gate -> matmul, an
// in-place norm -> matmul, a per-head gated norm -> matmul, norm pairs (one
// independent, one not) and the q / k head norms with their rope, as a decode
// step issues them, with the producer fused into the activation quantization
// (pairs and ropes in one launch) and without: outputs and products must be
// bit-identical (same quants, same kernels after them) and match the CPU, in
// eager runs, a graph recording and graph replays.
TEST(CudaFusion, NormAndGateInsideQuantizationEqualUnfused) {
    REQUIRE_GPU();
    // no queue, no fusion at all, or plain norms by another kernel (not bit-identical)
    if (const char* off =
            switched_off({"QINFER_CUDA_FUSE", "QINFER_CUDA_GRAPHS", "QINFER_CUDA_REG_NORM"}))
        GTEST_SKIP() << off << "=0";
    Trio tr;
    struct Case {
        GgmlType type;
        int64_t K, F, d, H;  // hidden, FFN width, gated / normed rows d x H per token
    };
    const Case cases[] = {
        {GgmlType::Q4_K, 2560, 512, 64, 8},  {GgmlType::Q6_K, 2560, 512, 64, 8},
        {GgmlType::Q4_K, 768, 256, 32, 8},   {GgmlType::Q6_K, 768, 768, 128, 2},
        {GgmlType::Q8_0, 2080, 544, 40, 4},  // Q8_0 activations, rows not a multiple of 256
        {GgmlType::Q4_1, 2080, 544, 40, 4},  // Q8_1 activations
        {GgmlType::Q8_0, 2080, 544, 16, 16},  // 16-float heads: 2 lanes per head
        {GgmlType::Q4_0, 2080, 544, 64, 4},   // Q8_0 activations whose 16-sums the product uses
    };
    uint32_t seed = 500;
    for (const Case& c : cases) {
        const int64_t K = c.K, F = c.F, dH = c.d * c.H;
        const Trio::T3 w1 = tr.weight(c.type, K, F, ++seed), w2 = tr.weight(c.type, K, F, ++seed);
        const Trio::T3 wd = tr.weight(c.type, F, K, ++seed), wo = tr.weight(c.type, dH, K, ++seed);
        const Trio::T3 nw = tr.f32({K}, "norm"), hw = tr.f32({c.d}, "head norm");
        tr.put(nw, randn(size_t(K), ++seed));
        tr.put(hw, randn(size_t(c.d), ++seed));
        // The gated norm goes into the quantization when a head is 8 * 2^k floats
        // (whole lanes) and the heads in a warp's 256 floats share a token.
        const bool gated_fuses = (c.d & (c.d - 1)) == 0 && c.d >= 8 && (c.d >= 256 || c.H % (256 / c.d) == 0);
        for (int64_t T : {1, 4}) {
            const Trio::T3 x = tr.f32({K, T}, "x"), qg = tr.f32({2 * dH, T}, "qg"), att = tr.f32({dH, T}, "att");
            const Trio::T3 h = tr.out({K, T}, "h"), g = tr.out({F, T}, "g"), u = tr.out({F, T}, "u");
            const Trio::T3 o = tr.out({K, T}, "o"), o2 = tr.out({K, T}, "o2"), y3 = tr.out({F, T}, "y3");
            const Trio::T3 yg = tr.out({dH, T}, "yg"), o3 = tr.out({K, T}, "o3"), la = tr.out({dH, T}, "la"),
                           lb = tr.out({dH, T}, "lb"), ra = tr.out({dH, T}, "ra"), rb = tr.out({dH, T}, "rb");
            const int64_t Hk = std::max<int64_t>(1, c.H / 2);
            const int n_rot = int(std::min<int64_t>(c.d, 64) / 16 * 16);
            const Trio::T3 qn = tr.out({dH, T}, "qn"), kk = tr.f32({c.d * Hk, T}, "kk");
            StepInfo st[3];
            for (int i = 0; i < 3; ++i) {
                st[i].n_tokens = int(T);
                st[i].pos_t = tr.be[i]->alloc(GgmlType::I32, {T}, "pos");
            }
            uint64_t fused0 = 0;
            // Step 0 sizes the scratch buffers (which may split its queue); then
            // eager or recorded, recorded or replayed, replayed.
            for (int step = 0; step < 4; ++step) {
                if (step == 1) fused0 = fused_producers(*tr.be[2]);
                tr.put(x, randn(size_t(K * T), ++seed, 3.f));
                tr.put(qg, randn(size_t(2 * dH * T), ++seed, 2.f));
                tr.put(att, randn(size_t(dH * T), ++seed));
                tr.put(kk, randn(size_t(c.d * Hk * T), ++seed, 2.f));
                for (int i = 0; i < 3; ++i) {
                    st[i].pos.clear();
                    for (int64_t t = 0; t < T; ++t) st[i].pos.push_back(int32_t(1000 * step + 37 * t + 3));
                    tr.be[i]->write(st[i].pos_t, st[i].pos.data(), size_t(T) * 4);
                }
                for (int i = 0; i < 3; ++i) {
                    Backend& be = *tr.be[i];
                    const size_t row = size_t(2 * c.d) * 4, tok = size_t(2 * dH) * 4;
                    const Tensor gate = view(qg[i], {c.d, c.H, T}, {row, tok}, size_t(c.d) * 4);
                    const Tensor att3 = reshape(att[i], {c.d, c.H, T});
                    be.rms_norm(x[i], nw[i], 1e-6f, h[i]);
                    be.matmul(w1[i], h[i], g[i], nullptr);
                    be.matmul(w2[i], h[i], u[i], nullptr);
                    be.swiglu(g[i], u[i], g[i]);
                    be.matmul(wd[i], g[i], o[i], nullptr);
                    be.sigmoid_mul(att3, gate, att3);
                    be.matmul(wo[i], att[i], o2[i], nullptr);
                    be.rms_norm(o2[i], nw[i], 1e-6f, o2[i]);
                    be.matmul(w1[i], o2[i], y3[i], nullptr);
                    auto heads = [&](const Trio::T3& t) { return reshape(t[i], {c.d, c.H, T}); };
                    be.rms_norm_gated(att3, hw[i], gate, 1e-6f, heads(yg));
                    be.matmul(wo[i], yg[i], o3[i], nullptr);
                    be.l2_norm(att3, 1e-6f, heads(la));  // independent: one launch
                    be.l2_norm(gate, 1e-6f, heads(lb));
                    be.rms_norm(att3, hw[i], 1e-6f, heads(ra));  // the second reads the first's output
                    be.rms_norm(heads(ra), hw[i], 1e-6f, heads(rb));
                    // attention heads: q from the [q | gate] rows, k in place, then rope
                    const Tensor q_in = view(qg[i], {c.d, c.H, T}, {row, tok}, 0);
                    const Tensor k3 = reshape(kk[i], {c.d, Hk, T});
                    be.rms_norm(q_in, hw[i], 1e-6f, heads(qn));
                    be.rms_norm(k3, hw[i], 1e-6f, k3);
                    be.rope_neox(heads(qn), st[i], n_rot, 10000.f, 1.f);
                    be.rope_neox(k3, st[i], n_rot, 10000.f, 1.f);
                }
                const std::string at = std::string(type_name(c.type)) + " K=" + std::to_string(K) +
                                       " T=" + std::to_string(T) + " step " + std::to_string(step);
                for (const Trio::T3* t : {&h, &g, &att, &o, &o2, &y3, &yg, &o3, &la, &lb, &ra, &rb, &qn, &kk})
                    tr.expect_same_and_near_cpu(*t, "with fusion", at);
            }
            // Per issued step: the two norms, swiglu, the sigmoid gate, the l2 pair,
            // the q / k norms with rope and the gated norm where it fits; steps 1-3
            // issue them once or twice (the others replay a graph; thrice under
            // QINFER_CUDA_PROFILE).
            const uint64_t per = 6 + (gated_fuses ? 1 : 0), fused = fused_producers(*tr.be[2]) - fused0;
            EXPECT_TRUE(fused > 0 && fused % per == 0) << fused << " fused, " << type_name(c.type) << " T=" << T;
            EXPECT_EQ(fused_producers(*tr.be[1]), 0u);
        }
    }
}

// The q / k head norms, their rope and the attention, as an attention layer
// issues them for decode steps of one and three sequences: with the fusion the
// norm + rope launch also writes the step's K / V cache rows (no kv_store
// launch). Cache bytes and outputs bit for bit, the output near the CPU's, for
// each cache type and head size; eager steps, a recording and replays.
TEST(CudaFusion, KvStoreInsideNormRopeEqualsKvStore) {
    REQUIRE_GPU();
    if (const char* off =
            switched_off({"QINFER_CUDA_FUSE", "QINFER_CUDA_GRAPHS", "QINFER_CUDA_FUSE_NORM"}))
        GTEST_SKIP() << off << "=0";
    Trio tr("QINFER_CUDA_FUSE_KV_STORE");
    uint32_t seed = 900;
    for (GgmlType kt : {GgmlType::F16, GgmlType::Q8_0, GgmlType::F32})
        for (int64_t d : {int64_t(128), int64_t(256)})
            for (int64_t T : {1, 3}) {
                const int64_t Hk = 2, H = 8, n_ctx = 96, n_slots = 3;
                const int n_rot = d == 256 ? 64 : 128;
                const std::string at0 = std::string(type_name(kt)) + " d=" + std::to_string(d) + " T=" +
                                        std::to_string(T);
                const TrioCache cache(tr, kt, d, Hk, n_ctx, n_slots, ++seed);
                const size_t cache_bytes = cache.bytes;
                const Trio::T3 qw = tr.f32({d}, "q norm"), kw = tr.f32({d}, "k norm");
                tr.put(qw, randn(size_t(d), ++seed));
                tr.put(kw, randn(size_t(d), ++seed));
                const Trio::T3 q = tr.f32({d * H, T}, "q"), k = tr.f32({d * Hk, T}, "k"), v = tr.f32({d * Hk, T}, "v");
                const Trio::T3 att = tr.out({d * H, T}, "att");
                TrioSteps steps(tr, T);
                StepInfo* st = steps.st;
                uint64_t f1 = 0, f2 = 0;
                // Step 0 sizes the attention's scratch (which may split its queue); then
                // eager or recorded, recorded or replayed, replayed.
                for (int step = 0; step < 4; ++step) {
                    if (step == 1) {
                        f1 = fused_producers(*tr.be[1]);
                        f2 = fused_producers(*tr.be[2]);
                    }
                    tr.put_qkv(q, k, v, seed);
                    steps.at(int32_t(20 * step + 3), n_slots);
                    for (int i = 0; i < 3; ++i) {
                        Backend& be = *tr.be[i];
                        const Tensor q3 = reshape(q[i], {d, H, T}), k3 = reshape(k[i], {d, Hk, T});
                        const Tensor v3 = reshape(v[i], {d, Hk, T}), a3 = reshape(att[i], {d, H, T});
                        be.rms_norm(q3, qw[i], 1e-6f, q3);
                        be.rms_norm(k3, kw[i], 1e-6f, k3);
                        be.rope_neox(q3, st[i], n_rot, 10000.f, 1.f);
                        be.rope_neox(k3, st[i], n_rot, 10000.f, 1.f);
                        be.attention(q3, k3, v3, cache.kv(i), st[i], 1.f / std::sqrt(float(d)), a3);
                    }
                    const std::string at = at0 + " step " + std::to_string(step);
                    for (const Trio::T3* t : {&q, &k, &att}) tr.expect_same_and_near_cpu(*t, "with the store fused", at);
                    for (const Tensor* c : {cache.K, cache.V}) {
                        std::vector<uint8_t> off(cache_bytes), on(cache_bytes);
                        tr.be[1]->read(c[1], off.data(), cache_bytes);
                        tr.be[2]->read(c[2], on.data(), cache_bytes);
                        EXPECT_EQ(0, std::memcmp(off.data(), on.data(), cache_bytes)) << c[0].name << ", " << at;
                    }
                }
                // each issued step: norm pair + ropes in one launch, and with the fusion the store there too
                const uint64_t d1 = fused_producers(*tr.be[1]) - f1, d2 = fused_producers(*tr.be[2]) - f2;
                EXPECT_TRUE(d1 > 0 && d2 == 2 * d1) << d1 << " / " << d2 << " fused, " << at0;
            }
}

// The attention of a decode step and the product over its output, with the
// sigmoid gate between them (qwen35) or without (qwen3): with the fusion the
// launch that merges the key-range splits also quantizes the output for the
// product (no quantization or gate launch). Contexts short enough for one split
// (the split kernel writes the output) and long enough for several; head sizes
// 64 / 128 / 256, Q8_K and Q8_0 activations (a row of 1.5 spans among them),
// f16 and q8_0 caches, one and three tokens. Outputs and products bit for bit,
// near the CPU's; eager steps, a recording and replays.
TEST(CudaFusion, QuantizeInsideAttentionMergeEqualsSeparate) {
    REQUIRE_GPU();
    if (const char* off = switched_off({"QINFER_CUDA_FUSE", "QINFER_CUDA_GRAPHS"})) GTEST_SKIP() << off << "=0";
    Trio tr("QINFER_CUDA_FUSE_ATTN_QUANT");
    struct Case {
        GgmlType kt, wt;
        int64_t d, H;
    };
    const Case cases[] = {
        {GgmlType::F16, GgmlType::Q4_K, 128, 8}, {GgmlType::Q8_0, GgmlType::Q4_K, 256, 4},
        {GgmlType::F16, GgmlType::Q6_K, 256, 8}, {GgmlType::Q8_0, GgmlType::Q8_0, 64, 6},
        {GgmlType::F16, GgmlType::Q4_0, 128, 4},
    };
    uint32_t seed = 1300;
    for (const Case& c : cases)
        for (bool gated : {true, false})
            for (int64_t T : {1, 3}) {
                const int64_t d = c.d, H = c.H, Hk = 2, n_ctx = 1024, n_slots = 3, dH = d * H, E = 96;
                const std::string at0 = std::string(type_name(c.kt)) + " cache, " + type_name(c.wt) +
                                        " d=" + std::to_string(d) + " H=" + std::to_string(H) +
                                        (gated ? " gated" : "") + " T=" + std::to_string(T);
                const TrioCache cache(tr, c.kt, d, Hk, n_ctx, n_slots, ++seed);
                const Trio::T3 wo = tr.weight(c.wt, dH, E, ++seed);
                const Trio::T3 q = tr.f32({d * H, T}, "q"), k = tr.f32({d * Hk, T}, "k"), v = tr.f32({d * Hk, T}, "v");
                const Trio::T3 qg = tr.f32({2 * dH, T}, "qg");
                const Trio::T3 att = tr.out({dH, T}, "att"), o = tr.out({E, T}, "o");
                TrioSteps steps(tr, T);
                uint64_t f1 = 0, f2 = 0;
                // Step 0 sizes the attention's scratch; then eager or recorded,
                // recorded or replayed, replayed: one split, then several.
                const int32_t first_pos[4] = {700, 3, 300, 1000};
                for (int step = 0; step < 4; ++step) {
                    if (step == 1) {
                        f1 = fused_producers(*tr.be[1]);
                        f2 = fused_producers(*tr.be[2]);
                    }
                    tr.put_qkv(q, k, v, seed);
                    tr.put(qg, randn(size_t(2 * dH * T), ++seed, 2.f));
                    steps.at(first_pos[step], n_slots);
                    for (int i = 0; i < 3; ++i) {
                        Backend& be = *tr.be[i];
                        const Tensor q3 = reshape(q[i], {d, H, T}), k3 = reshape(k[i], {d, Hk, T});
                        const Tensor v3 = reshape(v[i], {d, Hk, T}), a3 = reshape(att[i], {d, H, T});
                        const size_t row = size_t(2 * d) * 4, tok = size_t(2 * dH) * 4;
                        const Tensor gate = view(qg[i], {d, H, T}, {row, tok}, size_t(d) * 4);
                        be.attention(q3, k3, v3, cache.kv(i), steps.st[i], 1.f / std::sqrt(float(d)), a3);
                        if (gated) be.sigmoid_mul(a3, gate, a3);
                        be.matmul(wo[i], att[i], o[i], nullptr);
                    }
                    const std::string at = at0 + " step " + std::to_string(step);
                    for (const Trio::T3* t : {&att, &o}) tr.expect_same_and_near_cpu(*t, "with the merge fused", at);
                }
                // each issued step: the gate in the quantization (both), and with the
                // fusion that (or the quantization alone) in the merge's launch
                const uint64_t d1 = fused_producers(*tr.be[1]) - f1, d2 = fused_producers(*tr.be[2]) - f2;
                if (gated) EXPECT_TRUE(d1 > 0 && d2 == 2 * d1) << d1 << " / " << d2 << " fused, " << at0;
                else EXPECT_TRUE(d1 == 0 && d2 > 0) << d1 << " / " << d2 << " fused, " << at0;
            }
}

// A decode step's delta rule (after the l2 norms of q and k, or without them),
// the gated norm of its output heads and the product over them, as a DeltaNet
// layer issues them: with QINFER_CUDA_FUSE_GDR_NORM the norm and its
// quantization run inside the delta rule's launch (sm_90 code: elsewhere the
// fusion does not apply and both runs take the same launches). Output, state,
// norm and product bit for bit, the CPU within rounding; eager steps, a
// recording and replays; one and three sequences.
TEST(CudaFusion, GatedNormInsideDecodeDeltaRuleEqualsUnfused) {
    REQUIRE_GPU();
    if (const char* off =
            switched_off({"QINFER_CUDA_FUSE", "QINFER_CUDA_GRAPHS", "QINFER_CUDA_REG_NORM", "QINFER_CUDA_FUSE_NORM"}))
        GTEST_SKIP() << off << "=0";
    Trio tr("QINFER_CUDA_FUSE_GDR_NORM");
    const int64_t dk = 128, dv = 128, Hk = 4, Hv = 8, n_slots = 4, N = 64;
    uint32_t seed = 1300;
    const Trio::T3 wo = tr.weight(GgmlType::Q4_K, dv * Hv, N, ++seed);
    const Trio::T3 hw = tr.f32({dv}, "norm"), dt = tr.f32({Hv}, "dt_bias"), sa = tr.f32({Hv}, "ssm_a");
    tr.put(hw, randn(size_t(dv), ++seed, 0.5f, 1.f));
    tr.put(dt, randn(size_t(Hv), ++seed, 0.25f, -1.f));
    std::vector<float> A(static_cast<size_t>(Hv));
    for (int64_t j = 0; j < Hv; ++j) A[size_t(j)] = -std::exp(-4.f + 6.5f * float(j) / float(Hv - 1));
    tr.put(sa, A);
    const Trio::T3 S = tr.f32({dk, dv, Hv, n_slots}, "S");
    tr.put(S, randn(size_t(dk * dv * Hv * n_slots), ++seed, 0.3f));
    for (const bool l2 : {true, false}) {
        for (const int64_t T : {int64_t(1), int64_t(3)}) {
            std::array<StepInfo, 3> st;
            for (int i = 0; i < 3; ++i) {
                st[i].n_tokens = int(T);
                for (int64_t t = 0; t < T; ++t) {
                    st[i].pos.push_back(int32_t(5 + t));
                    st[i].slot.push_back(int32_t(t));
                    st[i].segments.push_back({int32_t(t), 1, int32_t(t), int32_t(5 + t)});
                }
                Backend& be = *tr.be[i];
                st[i].pos_t = be.alloc(GgmlType::I32, {T}, "pos");
                st[i].slot_t = be.alloc(GgmlType::I32, {T}, "slot");
                st[i].seg_t = be.alloc(GgmlType::I32, {4, T}, "seg");
                be.write(st[i].pos_t, st[i].pos.data(), size_t(T) * 4);
                be.write(st[i].slot_t, st[i].slot.data(), size_t(T) * 4);
                be.write(st[i].seg_t, st[i].segments.data(), st[i].segments.size() * sizeof(StepInfo::Segment));
            }
            const Trio::T3 q = tr.f32({dk, Hk, T}, "q"), k = tr.f32({dk, Hk, T}, "k"), v = tr.f32({dv, Hv, T}, "v");
            const Trio::T3 a = tr.f32({Hv, T}, "a"), b = tr.f32({Hv, T}, "b"), z = tr.f32({dv * Hv, T}, "z");
            const Trio::T3 o = tr.out({dv, Hv, T}, "o"), y = tr.out({dv * Hv, T}, "y"), p = tr.out({N, T}, "p");
            const uint64_t fused0 = fused_producers(*tr.be[2]);
            for (int step = 0; step < 4; ++step) {
                tr.put(q, randn(size_t(dk * Hk * T), ++seed, l2 ? 2.f : 0.09f));
                tr.put(k, randn(size_t(dk * Hk * T), ++seed, l2 ? 2.f : 0.09f));
                tr.put(v, randn(size_t(dv * Hv * T), ++seed));
                tr.put(a, randn(size_t(Hv * T), ++seed));
                tr.put(b, randn(size_t(Hv * T), ++seed));
                tr.put(z, randn(size_t(dv * Hv * T), ++seed, 2.f));
                for (int i = 0; i < 3; ++i) {
                    Backend& be = *tr.be[i];
                    if (l2) {
                        be.l2_norm(q[i], 1e-6f, q[i]);
                        be.l2_norm(k[i], 1e-6f, k[i]);
                    }
                    be.gated_delta_rule(q[i], k[i], v[i], a[i], b[i], dt[i], sa[i], RecurrentState{Tensor{}, S[i]},
                                        st[i], o[i]);
                    be.rms_norm_gated(o[i], hw[i], reshape(z[i], {dv, Hv, T}), 1e-6f, reshape(y[i], {dv, Hv, T}));
                    be.matmul(wo[i], y[i], p[i], nullptr);
                }
                const std::string at = std::string(l2 ? "l2, " : "") + "T=" + std::to_string(T) + " step " +
                                       std::to_string(step);
                for (const Trio::T3* t : {&o, &y, &p, &S}) tr.expect_same_and_near_cpu(*t, "with the fusion", at);
            }
            // where it applies, two producers (norm, quantization) per issued step
            const uint64_t fused = fused_producers(*tr.be[2]) - fused0;
            EXPECT_EQ(fused % 2, 0u) << fused;
            std::printf("[ fusion ] delta rule + gated norm%s, T=%lld: %llu producers fused\n", l2 ? " (l2)" : "",
                        (long long)T, (unsigned long long)fused);
        }
    }
}

// A one-token FFN block (ffn_block: rms_norm, gate and up, swiglu, down, the
// residual add) as one launch (cuda::ffn_decode) against the same ops launched
// one at a time: every output bit for bit, the CPU within rounding; the 4B
// model's shape (Q4_K gate / up, Q6_K down) and small ones of the other
// K-quant types; eager steps, a recording and replays (the grid barrier's
// words carry over from launch to launch).
TEST(CudaFusion, FfnBlockInOneLaunchEqualsOpsOneByOne) {
    REQUIRE_GPU();
    if (const char* off =
            switched_off({"QINFER_CUDA_FUSE", "QINFER_CUDA_GRAPHS", "QINFER_CUDA_FUSE_NORM"}))
        GTEST_SKIP() << off << "=0";
    Trio tr("QINFER_CUDA_FUSE_FFN", "1");
    struct Case {
        GgmlType gate, down;
        int64_t E, F;
    };
    const Case cases[] = {{GgmlType::Q4_K, GgmlType::Q6_K, 2560, 9216},
                          {GgmlType::Q5_K, GgmlType::Q4_K, 512, 768},
                          {GgmlType::Q6_K, GgmlType::Q5_K, 256, 512}};
    uint32_t seed = 900;
    for (const Case& c : cases) {
        const int64_t E = c.E, F = c.F;
        const Trio::T3 wg = tr.weight(c.gate, E, F, ++seed), wu = tr.weight(c.gate, E, F, ++seed);
        const Trio::T3 wd = tr.weight(c.down, F, E, ++seed);
        const Trio::T3 nw = tr.f32({E}, "norm");
        tr.put(nw, randn(size_t(E), ++seed));
        const Trio::T3 x = tr.f32({E, 1}, "x"), h = tr.out({E, 1}, "h"), g = tr.out({F, 1}, "g"),
                       u = tr.out({F, 1}, "u"), o = tr.out({E, 1}, "o");
        const uint64_t fused0 = fused_producers(*tr.be[2]);
        for (int step = 0; step < 4; ++step) {
            tr.put(x, randn(size_t(E), ++seed, 3.f));
            for (int i = 0; i < 3; ++i) {
                Backend& be = *tr.be[i];
                be.rms_norm(x[i], nw[i], 1e-6f, h[i]);
                be.matmul(wg[i], h[i], g[i], nullptr);
                be.matmul(wu[i], h[i], u[i], nullptr);
                be.swiglu(g[i], u[i], g[i]);
                be.matmul(wd[i], g[i], o[i], nullptr);
                be.add(x[i], o[i], x[i]);
            }
            const std::string at = std::string(type_name(c.gate)) + "/" + type_name(c.down) +
                                   " E=" + std::to_string(E) + " step " + std::to_string(step);
            for (const Trio::T3* t : {&h, &g, &u, &o, &x}) tr.expect_same_and_near_cpu(*t, "in one launch", at);
        }
        // 7 ops fused per step that ran its queue (eager or recorded; replays do not)
        const uint64_t fused = fused_producers(*tr.be[2]) - fused0;
        EXPECT_TRUE(fused > 0 && fused % 7 == 0) << fused << " fused, " << type_name(c.gate);
    }
}

}  // namespace
}  // namespace qinfer
