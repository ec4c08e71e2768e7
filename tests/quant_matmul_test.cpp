// cpu_matmul against a double-precision matmul over the dequantized weights,
// and every SIMD level against the portable kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/thread_pool.h"
#include "quant/cpu_kernels.h"
#include "quant/cpu_matmul.h"
#include "quant/quant.h"
#include "quant/quant_ref.h"
#include "testutil.h"

#if defined(__linux__)
#include <unistd.h>
#endif

using namespace qinfer;
using kernels::Isa;

namespace {

const GgmlType kWeightTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                                 GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,
                                 GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

struct Problem {
    GgmlType wt;
    int64_t K, N, T;
    std::vector<uint8_t> W;   // N rows, quantized
    std::vector<float> Wd;    // dequantized
    std::vector<float> x;     // T x K
    std::vector<double> ref;  // T x N
    double rms = 0;
};

// Weights with block-to-block magnitude changes and a few outliers, so that a
// scale applied to the wrong block or group shows up in the result.
Problem make_problem(GgmlType wt, int64_t K, int64_t N, int64_t T, uint32_t seed) {
    Problem p{wt, K, N, T, {}, {}, {}, {}};
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> ud(0.2f, 2.0f);
    std::vector<float> w(size_t(N * K));
    for (int64_t i = 0; i < N * K; i += 16) {
        const float s = ud(rng);
        for (int64_t j = i; j < i + 16 && j < N * K; ++j) w[j] = nd(rng) * s * 0.05f;
    }
    for (int i = 0; i < 8; ++i) w[rng() % w.size()] *= 6.f;
    p.x.resize(size_t(T * K));
    for (float& v : p.x) v = nd(rng) + 0.3f;  // nonzero mean: exercises the min/offset terms
    const size_t rb = row_bytes(wt, K);
    p.W.resize(rb * N);
    p.Wd.resize(size_t(N * K));
    for (int64_t o = 0; o < N; ++o) {
        quantize_row(wt, w.data() + o * K, p.W.data() + o * rb, K);
        dequantize_row(wt, p.W.data() + o * rb, p.Wd.data() + o * K, K);
    }
    p.ref.resize(size_t(T * N));
    double ss = 0;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < N; ++o) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k) s += double(p.Wd[o * K + k]) * p.x[t * K + k];
            p.ref[t * N + o] = s;
            ss += s * s;
        }
    p.rms = std::sqrt(ss / double(T * N));
    return p;
}

std::vector<float> run(const Problem& p, Isa isa, ThreadPool& pool, int64_t pad = 3) {
    const int64_t ldy = p.N + pad;
    std::vector<float> y(size_t(p.T * ldy), -12345.f);
    kernels::matmul_isa(isa, p.wt, p.W.data(), p.K, p.N, p.x.data(), p.T, y.data(), ldy, pool);
    for (int64_t t = 0; t < p.T; ++t)
        for (int64_t o = p.N; o < ldy; ++o) EXPECT_EQ(y[t * ldy + o], -12345.f) << "wrote past N";
    std::vector<float> out(size_t(p.T * p.N));
    for (int64_t t = 0; t < p.T; ++t)
        for (int64_t o = 0; o < p.N; ++o) out[t * p.N + o] = y[t * ldy + o];
    return out;
}

}  // namespace

TEST(QuantMatmul, MatchesDequantizedReferenceOnEveryLevel) {
    ThreadPool pool(2);
    uint32_t seed = 1;
    for (GgmlType wt : kWeightTypes) {
        const bool is_float = !is_quantized(wt);
        // Activation quantization (8 bits per block) bounds the error: ~0.7% RMS of |y|.
        const double tol_max = is_float ? 1e-5 : 4e-2, tol_rms = is_float ? 1e-6 : 1.2e-2;
        for (int64_t K : {256, 512, 2560})
            for (int64_t N : {7, 33})
                for (int64_t T : {1, 3, 17}) {
                    const Problem p = make_problem(wt, K, N, T, seed++);
                    std::vector<float> scalar, avx2;
                    for (Isa isa : kernels::supported_isas()) {
                        SCOPED_TRACE(std::string(type_name(wt)) + " " + kernels::isa_name(isa) + " K=" +
                                     std::to_string(K) + " N=" + std::to_string(N) + " T=" + std::to_string(T));
                        const std::vector<float> y = run(p, isa, pool);
                        double max_err = 0, se = 0;
                        for (size_t i = 0; i < y.size(); ++i) {
                            const double e = std::fabs(y[i] - p.ref[i]);
                            max_err = std::max(max_err, e);
                            se += e * e;
                        }
                        EXPECT_LE(max_err, tol_max * p.rms);
                        EXPECT_LE(std::sqrt(se / double(y.size())), tol_rms * p.rms);
                        if (isa == Isa::Avx2) avx2 = y;
                        if (isa == Isa::Avx512) {
                            // VNNI only fuses exact integer steps: bit-identical to AVX2.
                            for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], avx2[i]) << "element " << i;
                        }
                        if (isa == Isa::Scalar) {
                            scalar = y;
                        } else {
                            // Same integer arithmetic; only the float summation order differs.
                            for (size_t i = 0; i < y.size(); ++i)
                                ASSERT_NEAR(y[i], scalar[i], 2e-5 * p.rms) << "element " << i;
                        }
                    }
                }
    }
}

TEST(QuantMatmul, ResultDoesNotDependOnThreadCountOrTiling) {
    ThreadPool one(1), three(3);
    for (GgmlType wt : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16, GgmlType::Q6_K}) {
        const Problem p = make_problem(wt, 512, 37, 9, 99);
        const Isa isa = kernels::detected_isa();
        const std::vector<float> a = run(p, isa, one), b = run(p, isa, three);
        for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << type_name(wt) << " element " << i;
        // Row t of a batched call equals a T=1 call on that row alone (the tile
        // kernels must not mix rows).
        for (int64_t t = 0; t < p.T; ++t) {
            std::vector<float> y1(size_t(p.N));
            kernels::matmul_isa(isa, wt, p.W.data(), p.K, p.N, p.x.data() + t * p.K, 1, y1.data(), p.N, one);
            for (int64_t o = 0; o < p.N; ++o) ASSERT_EQ(y1[o], a[t * p.N + o]) << type_name(wt) << " t=" << t;
        }
    }
}

TEST(QuantMatmul, LargeBatchSplitsAcrossThreads) {
    // Small N with many rows: the driver splits the activation rows into blocks.
    ThreadPool pool(4);
    const Problem p = make_problem(GgmlType::Q4_K, 256, 3, 130, 7);
    const std::vector<float> y = run(p, kernels::detected_isa(), pool);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], p.ref[i], 4e-2 * p.rms) << i;
}

// A group of products on one input (different weight types, so different
// activation formats, in one region) equals the products one by one, for decode
// and for a batch; a bad member is reported before anything runs.
TEST(QuantMatmul, GroupEqualsSeparateProducts) {
    ThreadPool one(1), three(3);
    const int64_t K = 512;
    for (int64_t T : {1, 6}) {
        const Problem a = make_problem(GgmlType::Q4_K, K, 300, T, 11), b = make_problem(GgmlType::Q8_0, K, 70, T, 12),
                      c = make_problem(GgmlType::F16, K, 9, T, 13);
        const std::vector<float>& x = a.x;  // one input for all three
        std::vector<float> ya(size_t(a.N * T)), yb(size_t((b.N + 5) * T)), yc(size_t(c.N * T));
        const MatmulJob jobs[3] = {{a.wt, a.W.data(), a.N, ya.data(), a.N},
                                   {b.wt, b.W.data(), b.N, yb.data(), b.N + 5},
                                   {c.wt, c.W.data(), c.N, yc.data(), c.N}};
        cpu_matmul_group(jobs, 3, K, x.data(), T, three);
        for (const MatmulJob& j : jobs) {
            std::vector<float> want(size_t(j.ldy * T));
            cpu_matmul(j.wt, j.W, K, j.N, x.data(), T, want.data(), j.ldy, one);
            for (int64_t t = 0; t < T; ++t)
                for (int64_t o = 0; o < j.N; ++o)
                    ASSERT_EQ(j.y[t * j.ldy + o], want[size_t(t * j.ldy + o)])
                        << type_name(j.wt) << " T=" << T << " t=" << t << " o=" << o;
        }
    }
    std::vector<uint8_t> w(4096);
    std::vector<float> x(512), y(64, 7.f);
    const MatmulJob bad[2] = {{GgmlType::Q8_0, w.data(), 2, y.data(), 2}, {GgmlType::Q4_K, w.data(), 4, y.data() + 8, 2}};
    EXPECT_THROW(cpu_matmul_group(bad, 2, 256, x.data(), 1, one), Error);  // ldy < N in the second
    EXPECT_EQ(y[0], 7.f) << "the valid first product must not have run";
    EXPECT_THROW(cpu_matmul_check(GgmlType::Q4_K, 100, 2, 2), Error);
    EXPECT_NO_THROW(cpu_matmul_check(GgmlType::Q4_K, 256, 2, 2));
}

// Decode of long K-quant rows runs each row in chunks of super-blocks,
// interleaved with the task's other rows: the result must be bit-identical to
// one pass per row (the same rows as part of a two-token product, which takes
// the dot kernels' one-pass path), on every level and thread count.
TEST(QuantMatmul, LongRowsInChunksEqualOnePass) {
    ThreadPool one(1), three(3);
    for (GgmlType wt : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
        for (int64_t K : {4096, 9216, 6400}) {  // 4096: one pass; 6400 = 25 super-blocks: a short last chunk
            const Problem p = make_problem(wt, K, 37, 1, uint32_t(K) + uint32_t(wt));
            std::vector<float> x2(p.x);
            x2.insert(x2.end(), p.x.begin(), p.x.end());
            for (Isa isa : kernels::supported_isas()) {
                std::vector<float> pair(size_t(2 * p.N));
                kernels::matmul_isa(isa, wt, p.W.data(), K, p.N, x2.data(), 2, pair.data(), p.N, one,
                                    kernels::TilePath::Dot);
                for (ThreadPool* pool : {&one, &three}) {
                    const std::vector<float> y = run(p, isa, *pool, 0);
                    for (int64_t o = 0; o < p.N; ++o)
                        ASSERT_EQ(y[size_t(o)], pair[size_t(o)])
                            << type_name(wt) << " K=" << K << " row " << o << " " << kernels::isa_name(isa);
                }
            }
        }
}

TEST(QuantMatmul, BadInputIsAnError) {
    ThreadPool pool(1);
    std::vector<uint8_t> w(4096);
    std::vector<float> x(512), y(64);
    try {
        cpu_matmul(GgmlType::IQ2_XXS, w.data(), 256, 2, x.data(), 1, y.data(), 2, pool);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos) << e.what();
    }
    EXPECT_THROW(cpu_matmul(GgmlType::Q4_K, w.data(), 100, 2, x.data(), 1, y.data(), 2, pool), Error);
    EXPECT_THROW(cpu_matmul(GgmlType::Q8_0, w.data(), 64, 4, x.data(), 1, y.data(), 2, pool), Error);  // ldy < N
}

TEST(QuantMatmul, ReportsIsa) {
    const std::string isa = cpu_kernel_isa();
    EXPECT_TRUE(isa == "scalar" || isa == "avx2" || isa == "avx512vnni") << isa;
    std::printf("cpu kernel isa: %s\n", isa.c_str());
}

#if defined(__linux__)
TEST(QuantMatmul, EnvironmentCanLowerTheIsa) {
    // The level is read once per process, so ask a child process.
    std::string out;
    ASSERT_EQ(test::run_command("QINFER_CPU_ISA=scalar /proc/" + std::to_string(getpid()) +
                                    "/exe --gtest_filter=QuantMatmul.ReportsIsa",
                                &out),
              0)
        << out;
    EXPECT_NE(out.find("cpu kernel isa: scalar"), std::string::npos) << out;
}
#endif

// The SIMD Q8_K activation quantizer against quantize_ref_q8_K, byte for byte:
// random rows at several scales, and the edge cases of its maximum search and
// rounding (zero blocks, equal magnitudes of both signs, halves after scaling,
// NaN and infinity).
TEST(QuantMatmul, SimdQ8KActivationsEqualTheReferenceQuantizer) {
    const kernels::KernelTable* t = kernels::avx2_table();
    if (!t || !t->quantize_q8_K || !kernels::cpu_supports(Isa::Avx2)) GTEST_SKIP() << "no AVX2 quantizer here";
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<std::vector<float>> rows;
    for (float scale : {1e-30f, 1e-3f, 1.f, 1e4f}) {
        std::vector<float> r(4 * QK_K);
        for (float& v : r) v = nd(rng) * scale;
        rows.push_back(r);
    }
    std::vector<float> edge(5 * QK_K, 0.f);  // block 0: all zero
    for (int j = 0; j < QK_K; ++j) edge[size_t(QK_K + j)] = float(j % 7) - 3.f;  // block 1: -3 before +3
    edge[size_t(QK_K + 200)] = 3.f;
    for (int j = 0; j < QK_K; ++j) edge[size_t(2 * QK_K + j)] = 127.f * float(j - 128) / 254.f;  // halves after x (-127/max)
    edge[size_t(2 * QK_K + 5)] = -127.f;
    for (int j = 0; j < QK_K; ++j) edge[size_t(3 * QK_K + j)] = float(j) * 0.01f;
    edge[size_t(3 * QK_K + 17)] = std::numeric_limits<float>::quiet_NaN();  // block 3: a NaN
    edge[size_t(4 * QK_K + 3)] = std::numeric_limits<float>::infinity();  // block 4: an infinity
    edge[size_t(4 * QK_K + 9)] = 2.f;
    rows.push_back(edge);
    for (const std::vector<float>& r : rows) {
        const int64_t n = int64_t(r.size());
        std::vector<block_q8_K> want(size_t(n / QK_K)), got(size_t(n / QK_K));
        quantize_ref_q8_K(r.data(), want.data(), n);
        t->quantize_q8_K(r.data(), got.data(), n);
        for (size_t b = 0; b < want.size(); ++b) {
            EXPECT_EQ(std::memcmp(&want[b].d, &got[b].d, sizeof want[b].d), 0) << "block " << b << " d";
            EXPECT_EQ(std::memcmp(want[b].qs, got[b].qs, sizeof want[b].qs), 0) << "block " << b << " qs";
            EXPECT_EQ(std::memcmp(want[b].bsums, got[b].bsums, sizeof want[b].bsums), 0) << "block " << b << " bsums";
        }
    }
}
