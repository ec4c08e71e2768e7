// The CUDA Gated DeltaNet kernels against the CPU backend: the token-parallel
// causal conv and the delta rule (token-serial kernel for short segments,
// chunked kernel for prompts) on batches of segments of mixed lengths with
// nonzero starting states, and the two delta-rule kernels side by side at
// Qwen3.5-4B shapes (timings printed). Skipped when there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "runtime/backend.h"
#include "cuda_testutil.h"
#if QINFER_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/kernels.h"
#endif

namespace qinfer {
namespace {

using test::randn;


// Rows of d floats scaled to unit length (q and k reach the delta rule L2-normed).
std::vector<float> unit_rows(size_t rows, size_t d, uint32_t seed) {
    std::vector<float> v = randn(rows * d, seed);
    for (size_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (size_t i = 0; i < d; ++i) ss += double(v[r * d + i]) * v[r * d + i];
        const float inv = float(1.0 / std::sqrt(ss));
        for (size_t i = 0; i < d; ++i) v[r * d + i] *= inv;
    }
    return v;
}

// Per value head: ssm_a from -0.018 (state kept for hundreds of tokens: drift
// shows) to -12 (forgets within a token or two), dt_bias around -1: with a ~ N(0,1)
// that gives g from about -0.001 to -30, as in trained checkpoints.
void gate_params(int64_t Hv, std::vector<float>& dtb, std::vector<float>& A) {
    dtb = randn(size_t(Hv), 7, 0.25f, -1.f);
    A.resize(size_t(Hv));
    for (int64_t j = 0; j < Hv; ++j) A[size_t(j)] = -std::exp(-4.f + 6.5f * float(j) / float(std::max<int64_t>(Hv - 1, 1)));
}

struct Pair {
    Tensor c, g;
};

struct Both {
    std::unique_ptr<Backend> cpu =
        make_cpu_backend(std::make_shared<ThreadPool>(int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u))));
    std::unique_ptr<Backend> gpu = make_cuda_backend(0);

    Pair f32(const std::vector<float>& v, std::initializer_list<int64_t> ne) {
        Pair p{cpu->alloc(GgmlType::F32, ne, "t"), gpu->alloc(GgmlType::F32, ne, "t")};
        EXPECT_EQ(p.c.nbytes(), v.size() * 4);
        cpu->write(p.c, v.data(), v.size() * 4);
        gpu->write(p.g, v.data(), v.size() * 4);
        return p;
    }
    // Output tensors: the GPU copy is NaN-filled, so unwritten elements fail.
    Pair poisoned(std::initializer_list<int64_t> ne) {
        Pair p{cpu->alloc(GgmlType::F32, ne, "o"), gpu->alloc(GgmlType::F32, ne, "o")};
        std::vector<uint8_t> poison(p.g.nbytes(), 0xFF);
        gpu->write(p.g, poison.data(), poison.size());
        return p;
    }
    // Max |cpu - gpu| (infinite if the GPU has a non-finite value) and max |cpu|.
    double max_diff(const Tensor& c, const Tensor& g, double* max_ref) {
        std::vector<float> a(c.nbytes() / 4), b(g.nbytes() / 4);
        cpu->read(c, a.data(), a.size() * 4);
        gpu->read(g, b.data(), b.size() * 4);
        double m = 0, r = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            if (!std::isfinite(b[i])) return INFINITY;
            m = std::max(m, double(std::fabs(a[i] - b[i])));
            r = std::max(r, double(std::fabs(a[i])));
        }
        *max_ref = r;
        return m;
    }
};

struct Steps {
    StepInfo c, g;
};

// One segment per entry of `lens`, on slot slots[i]; token positions continue `len`.
Steps make_steps(Both& b, const std::vector<int>& lens, const std::vector<int>& slots, std::vector<int>& len) {
    std::vector<int32_t> pos, slot;
    for (size_t i = 0; i < lens.size(); ++i)
        for (int t = 0; t < lens[i]; ++t) {
            pos.push_back(len[size_t(slots[i])] + t);
            slot.push_back(slots[i]);
        }
    for (size_t i = 0; i < lens.size(); ++i) len[size_t(slots[i])] += lens[i];
    Steps s;
    const int T = int(pos.size());
    for (StepInfo* st : {&s.c, &s.g}) {
        Backend& be = st == &s.c ? *b.cpu : *b.gpu;
        st->n_tokens = T;
        st->pos = pos;
        st->slot = slot;
        for (size_t i = 0, t = 0; i < lens.size(); t += size_t(lens[i]), ++i)
            st->segments.push_back({int32_t(t), int32_t(lens[i]), int32_t(slots[i]), pos[t]});
        st->pos_t = be.alloc(GgmlType::I32, {T}, "pos");
        st->slot_t = be.alloc(GgmlType::I32, {T}, "slot");
        st->seg_t = be.alloc(GgmlType::I32, {4, int64_t(lens.size())}, "seg");
        be.write(st->pos_t, pos.data(), pos.size() * 4);
        be.write(st->slot_t, slot.data(), slot.size() * 4);
        be.write(st->seg_t, st->segments.data(), st->segments.size() * sizeof(StepInfo::Segment));
    }
    return s;
}

// Batches of one call each: a prompt batch with every segment length that
// matters to the kernels (1, under K-1, around a chunk, several chunks, long),
// then decode-like and short-segment steps on the states it left.
const std::vector<std::pair<std::vector<int>, std::vector<int>>> kCalls = {
    {{1, 3, 63, 64, 65, 200, 1024, 2}, {0, 1, 2, 3, 4, 5, 6, 7}},
    {{1, 1, 2, 1}, {6, 0, 7, 3}},
    {{40, 1, 17}, {1, 5, 2}},
};

class CudaDeltaNetConv : public ::testing::TestWithParam<int> {};

TEST_P(CudaDeltaNetConv, MatchesCpuOnMixedSegments) {
    REQUIRE_GPU();
    Both b;
    const int64_t K = GetParam(), C = 1000, n_slots = 8;  // C: not a multiple of the block width
    Pair w = b.f32(randn(size_t(K * C), 1, 0.3f), {K, C});
    Pair conv = b.f32(randn(size_t(C * (K - 1) * n_slots), 2), {C, K - 1, n_slots});
    RecurrentState rc{conv.c, Tensor{}}, rg{conv.g, Tensor{}};
    std::vector<int> len(size_t(n_slots), 0);
    uint32_t seed = 10;
    for (const auto& [lens, slots] : kCalls) {
        Steps st = make_steps(b, lens, slots, len);
        const int64_t T = st.c.n_tokens;
        Pair x = b.f32(randn(size_t(C * T), seed++, 2.f), {C, T});
        Pair out = b.poisoned({C, T});
        b.cpu->conv1d_silu(x.c, w.c, rc, st.c, out.c);
        b.gpu->conv1d_silu(x.g, w.g, rg, st.g, out.g);
        double ref = 0;
        // same products and sums in the same order; only exp may differ by an ulp
        EXPECT_LT(b.max_diff(out.c, out.g, &ref), 2e-6 * (ref + 1)) << "T=" << T;
        EXPECT_EQ(b.max_diff(conv.c, conv.g, &ref), 0.0) << "conv state after T=" << T;
    }
}

INSTANTIATE_TEST_SUITE_P(KernelSizes, CudaDeltaNetConv, ::testing::Values(2, 4, 6));

struct RuleCase {
    int64_t dk, Hk, Hv;
};

class CudaDeltaNetRule : public ::testing::TestWithParam<RuleCase> {};

// In the first and third calls the segments of 16+ tokens go to the chunked
// kernel and the others to the serial one (both launches), the second call is
// serial only; each starts from the states the others left. Output and state
// within 1e-4 of their largest element.
TEST_P(CudaDeltaNetRule, MatchesCpuOnMixedSegments) {
    REQUIRE_GPU();
    const RuleCase rcase = GetParam();
    Both b;
    const int64_t dk = rcase.dk, dv = rcase.dk, Hk = rcase.Hk, Hv = rcase.Hv, n_slots = 8;
    Pair S = b.f32(randn(size_t(dk * dv * Hv * n_slots), 3, 0.3f), {dk, dv, Hv, n_slots});
    RecurrentState rc{Tensor{}, S.c}, rg{Tensor{}, S.g};
    std::vector<float> dtb, A;
    gate_params(Hv, dtb, A);
    Pair dt = b.f32(dtb, {Hv}), sa = b.f32(A, {Hv});
    std::vector<int> len(size_t(n_slots), 0);
    uint32_t seed = 20;
    for (const auto& [lens, slots] : kCalls) {
        Steps st = make_steps(b, lens, slots, len);
        const int64_t T = st.c.n_tokens;
        Pair q = b.f32(unit_rows(size_t(Hk * T), size_t(dk), seed++), {dk, Hk, T});
        Pair k = b.f32(unit_rows(size_t(Hk * T), size_t(dk), seed++), {dk, Hk, T});
        Pair v = b.f32(randn(size_t(dv * Hv * T), seed++), {dv, Hv, T});
        Pair a = b.f32(randn(size_t(Hv * T), seed++), {Hv, T});
        Pair bb = b.f32(randn(size_t(Hv * T), seed++), {Hv, T});
        Pair o = b.poisoned({dv, Hv, T});
        b.cpu->gated_delta_rule(q.c, k.c, v.c, a.c, bb.c, dt.c, sa.c, rc, st.c, o.c);
        b.gpu->gated_delta_rule(q.g, k.g, v.g, a.g, bb.g, dt.g, sa.g, rg, st.g, o.g);
        double ref = 0, sref = 0;
        const double d_out = b.max_diff(o.c, o.g, &ref), d_s = b.max_diff(S.c, S.g, &sref);
        std::printf("[ gdr ] dk=%lld T=%lld: out err %.2e (max %.3g), state err %.2e (max %.3g)\n", (long long)dk,
                    (long long)T, d_out, ref, d_s, sref);
        EXPECT_LT(d_out, 1e-4 * ref) << "T=" << T;
        EXPECT_LT(d_s, 1e-4 * sref) << "state after T=" << T;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDeltaNetRule,
                         ::testing::Values(RuleCase{64, 2, 4}, RuleCase{128, 2, 4}, RuleCase{128, 4, 4}),
                         [](const ::testing::TestParamInfo<RuleCase>& i) {
                             return "dk" + std::to_string(i.param.dk) + "_hk" + std::to_string(i.param.Hk) + "_hv" +
                                    std::to_string(i.param.Hv);
                         });

#if QINFER_HAVE_CUDA
#define CU(call) ASSERT_EQ((call), cudaSuccess) << #call

// Device copy of a host vector, freed with the object.
struct DevBuf {
    float* p = nullptr;
    explicit DevBuf(const std::vector<float>& v) {
        if (cudaMalloc(&p, std::max<size_t>(v.size(), 1) * 4) == cudaSuccess)
            cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
    }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
};

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, double(std::fabs(x)));
    return m;
}
double max_err(const std::vector<float>& ref, const std::vector<float>& got) {
    double m = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        m = std::max(m, double(std::fabs(ref[i] - got[i])));
    }
    return m;
}

// Qwen3.5-4B shapes (H_v 32, H_k 16, d 128), one segment: both delta-rule kernels
// against the CPU, with their times; the conv at the same prompt length.
TEST(CudaDeltaNetPrefill, SerialAndChunkedKernelsAtModelShapes) {
    REQUIRE_GPU();
    Both b;
    const int64_t dk = 128, dv = 128, Hk = 16, Hv = 32;
    std::vector<float> dtb, A;
    gate_params(Hv, dtb, A);
    const std::vector<float> S0 = randn(size_t(dk * dv * Hv), 4, 0.3f);
    for (int T : {1, 3, 8, 16, 32, 64, 512, 4096}) {  // short ones: the chunked kernel on a padded chunk
        const std::vector<float> q = unit_rows(size_t(Hk * T), size_t(dk), 30), k = unit_rows(size_t(Hk * T), size_t(dk), 31);
        const std::vector<float> v = randn(size_t(dv * Hv * T), 32), a = randn(size_t(Hv * T), 33),
                                 bv = randn(size_t(Hv * T), 34);
        // reference: the CPU backend's op
        std::vector<float> out_ref(size_t(dv * Hv * T)), S_ref(S0.size());
        {
            std::vector<int> len(1, 0);
            Steps st = make_steps(b, {T}, {0}, len);
            Backend& c = *b.cpu;
            auto t = [&](const std::vector<float>& x, std::initializer_list<int64_t> ne) {
                Tensor r = c.alloc(GgmlType::F32, ne, "t");
                c.write(r, x.data(), x.size() * 4);
                return r;
            };
            Tensor S = t(S0, {dk, dv, Hv, 1}), o = c.alloc(GgmlType::F32, {dv, Hv, T}, "o");
            c.gated_delta_rule(t(q, {dk, Hk, T}), t(k, {dk, Hk, T}), t(v, {dv, Hv, T}), t(a, {Hv, T}), t(bv, {Hv, T}),
                               t(dtb, {Hv}), t(A, {Hv}), RecurrentState{Tensor{}, S}, st.c, o);
            c.read(o, out_ref.data(), out_ref.size() * 4);
            c.read(S, S_ref.data(), S_ref.size() * 4);
        }
        DevBuf dq(q), dk_(k), dv_(v), da(a), db(bv), ddt(dtb), dA(A), dS(S0), dout(std::vector<float>(out_ref.size()));
        const cuda::Segment sg{0, T, 0, 0};
        cuda::Segment* dseg = nullptr;
        CU(cudaMalloc(&dseg, sizeof sg));
        CU(cudaMemcpy(dseg, &sg, sizeof sg, cudaMemcpyHostToDevice));
        cuda::DeltaArgs p{};
        p.q = dq.p;
        p.k = dk_.p;
        p.v = dv_.p;
        p.q_t = p.k_t = Hk * dk;
        p.q_h = p.k_h = dk;
        p.v_t = Hv * dv;
        p.v_h = dv;
        p.a = da.p;
        p.b = db.p;
        p.a_t = p.b_t = Hv;
        p.dt_bias = ddt.p;
        p.ssm_a = dA.p;
        p.S = dS.p;
        p.out = dout.p;
        p.dk = int(dk);
        p.dv = int(dv);
        p.Hk = int(Hk);
        p.Hv = int(Hv);
        cudaEvent_t e0, e1;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        const double oref = max_abs(out_ref), sref = max_abs(S_ref);
        double us[2] = {0, 0};
        const cuda::GdrPath paths[2] = {cuda::GdrPath::Serial, cuda::GdrPath::Chunked};
        // one run from S0 into a NaN-filled output: the output and the final state
        auto run_from_s0 = [&](const cuda::DeltaArgs& args, cuda::GdrPath path, std::vector<float>& out,
                               std::vector<float>& S) {
            out.assign(out_ref.size(), 0.f);
            S.assign(S0.size(), 0.f);
            CU(cudaMemcpy(dS.p, S0.data(), S0.size() * 4, cudaMemcpyHostToDevice));
            CU(cudaMemset(dout.p, 0xFF, out_ref.size() * 4));
            cuda::gated_delta_rule(args, dseg, 1, T, nullptr, path);
            CU(cudaDeviceSynchronize());
            CU(cudaMemcpy(out.data(), dout.p, out.size() * 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(S.data(), dS.p, S.size() * 4, cudaMemcpyDeviceToHost));
        };
        for (int pi = 0; pi < 2; ++pi) {
            std::vector<float> out, S;
            run_from_s0(p, paths[pi], out, S);
            const double eo = max_err(out_ref, out), es = max_err(S_ref, S);
            if (pi == 0) {  // the state loaded before the kernel's wait: the same bits
                cuda::DeltaArgs pe = p;
                pe.state_early = true;
                std::vector<float> out_e, S_e;
                run_from_s0(pe, paths[pi], out_e, S_e);
                EXPECT_EQ(std::memcmp(out_e.data(), out.data(), out.size() * 4), 0) << "early state, T=" << T;
                EXPECT_EQ(std::memcmp(S_e.data(), S.data(), S.size() * 4), 0) << "early state, T=" << T;
            }
            // timing: the state is reset before each run, outside the timed range
            const int reps = T >= 4096 ? 3 : 10;
            float total = 0;
            for (int r = 0; r < reps; ++r) {
                CU(cudaMemcpy(dS.p, S0.data(), S0.size() * 4, cudaMemcpyHostToDevice));
                CU(cudaEventRecord(e0, nullptr));
                cuda::gated_delta_rule(p, dseg, 1, T, nullptr, paths[pi]);
                CU(cudaEventRecord(e1, nullptr));
                CU(cudaEventSynchronize(e1));
                float ms = 0;
                CU(cudaEventElapsedTime(&ms, e0, e1));
                total += ms;
            }
            us[pi] = 1000.0 * total / reps;
            std::printf("[ gdr ] T=%-5d %-8s %9.1f us   out err %.2e (max %.3g, rel %.1e)   state err %.2e (max %.3g)\n",
                        T, pi ? "chunked" : "serial", us[pi], eo, oref, eo / oref, es, sref);
            EXPECT_LT(eo, 1e-4 * oref) << (pi ? "chunked" : "serial") << " T=" << T;
            EXPECT_LT(es, 1e-4 * sref) << (pi ? "chunked" : "serial") << " state, T=" << T;
        }
        std::printf("[ gdr ] T=%-5d chunked / serial time: %.2f\n", T, us[1] / us[0]);
        if (T <= 8) {  // the serial kernel normalizing q and k itself: rows scaled by 0.5 .. 3.5
            ASSERT_TRUE(cuda::gdr_all_serial(p, T));
            std::vector<float> qs = q, ks = k;
            for (size_t i = 0; i < qs.size(); ++i) {
                qs[i] *= 0.5f + float((i / size_t(dk)) % 7) * 0.5f;
                ks[i] *= 3.5f - float((i / size_t(dk)) % 5) * 0.5f;
            }
            DevBuf dqs(qs), dks(ks);
            cuda::DeltaArgs p2 = p;
            p2.q = dqs.p;
            p2.k = dks.p;
            p2.l2_qk = true;
            p2.l2_eps = 1e-6f;
            std::vector<float> out, S;
            run_from_s0(p2, cuda::GdrPath::Auto, out, S);
            EXPECT_LT(max_err(out_ref, out), 1e-4 * oref) << "l2 in the kernel, T=" << T;
            EXPECT_LT(max_err(S_ref, S), 1e-4 * sref) << "l2 in the kernel, state, T=" << T;
            EXPECT_FALSE(cuda::gdr_all_serial(p, 4096)) << "a long prompt takes the chunked kernel";
        }

        if (T == 512 || T == 4096) {  // the conv of the same step: C = 2 Hk dk + Hv dv = 8192, K = 4
            const int64_t C = 2 * Hk * dk + Hv * dv, K = 4;
            DevBuf x(randn(size_t(C * T), 40)), w(randn(size_t(C * K), 41, 0.3f)),
                cs(randn(size_t(C * (K - 1)), 42)), y(std::vector<float>(size_t(C * T)));
            float total = 0;
            const int reps = 10;
            for (int r = 0; r <= reps; ++r) {
                CU(cudaEventRecord(e0, nullptr));
                cuda::conv1d_silu(x.p, C, w.p, int(K), C, cs.p, 1, dseg, 1, T, y.p, C, nullptr);
                CU(cudaEventRecord(e1, nullptr));
                CU(cudaEventSynchronize(e1));
                float ms = 0;
                CU(cudaEventElapsedTime(&ms, e0, e1));
                if (r > 0) total += ms;  // the first run warms up
            }
            std::printf("[ conv ] T=%-5d C=%lld: %.1f us\n", T, (long long)C, 1000.0 * total / reps);
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaFree(dseg);
    }
}
#endif

}  // namespace
}  // namespace qinfer
