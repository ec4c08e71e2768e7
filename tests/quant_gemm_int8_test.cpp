// The int8 tile kernels of prompt processing (cpu_q8_gemm.h) against the dot
// kernels (same integers, other float order), a double-precision product over
// the dequantized weights (error bounded by the 8-bit activation rounding), and
// each other across ISA levels.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "quant/cpu_kernels.h"
#include "quant/cpu_matmul.h"
#include "quant/cpu_q8_gemm.h"
#include "quant/quant.h"

using namespace qinfer;
using kernels::Isa;
using kernels::TilePath;

namespace {

const GgmlType kTypes[] = {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                           GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q5_1};

struct Problem {
    GgmlType wt;
    int64_t K, N, T;
    std::vector<uint8_t> W;
    std::vector<float> x;        // T x K
    std::vector<double> ref;     // T x N, dequantized weights x f32 activations in double
    std::vector<double> bound;   // T x N, worst case of the activation rounding
    std::vector<double> absdot;  // T x N, sum |w x|: scale of float rounding
};

Problem make_problem(GgmlType wt, int64_t K, int64_t N, int64_t T, uint32_t seed) {
    Problem p{wt, K, N, T, {}, {}, {}, {}, {}};
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> ud(0.2f, 2.0f);
    std::vector<float> w(size_t(N * K)), wd(size_t(N * K));
    for (int64_t i = 0; i < N * K; i += 16) {
        const float s = ud(rng);
        for (int64_t j = i; j < i + 16; ++j) w[j] = nd(rng) * s * 0.05f;
    }
    for (int i = 0; i < 8; ++i) w[rng() % w.size()] *= 6.f;
    p.x.resize(size_t(T * K));
    for (float& v : p.x) v = nd(rng) + 0.3f;  // nonzero mean: exercises the min / offset terms
    for (int i = 0; i < 4; ++i) p.x[rng() % p.x.size()] *= 8.f;  // outliers: coarse blocks
    const size_t rb = row_bytes(wt, K);
    p.W.resize(rb * size_t(N));
    for (int64_t o = 0; o < N; ++o) {
        quantize_row(wt, w.data() + o * K, p.W.data() + o * rb, K);
        dequantize_row(wt, p.W.data() + o * rb, wd.data() + o * K, K);
    }
    // Activations are rounded to steps of amax/127 per block (256 values for
    // K-quants, 32 for the others): each value moves by at most half a step.
    const int64_t qb = kernels::act_format(wt) == kernels::ActFormat::Q8_K ? 256 : 32;
    std::vector<double> half_step(size_t(T * K));
    for (int64_t t = 0; t < T; ++t)
        for (int64_t b = 0; b < K; b += qb) {
            double amax = 0;
            for (int64_t k = b; k < b + qb; ++k) amax = std::max(amax, double(std::fabs(p.x[t * K + k])));
            for (int64_t k = b; k < b + qb; ++k) half_step[t * K + k] = 0.5 * amax / 127;
        }
    p.ref.resize(size_t(T * N));
    p.bound.resize(size_t(T * N));
    p.absdot.resize(size_t(T * N));
    for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < N; ++o) {
            double s = 0, b = 0, a = 0;
            for (int64_t k = 0; k < K; ++k) {
                const double wk = wd[o * K + k], xk = p.x[t * K + k];
                s += wk * xk;
                b += std::fabs(wk) * half_step[t * K + k];
                a += std::fabs(wk * xk);
            }
            p.ref[t * N + o] = s;
            p.bound[t * N + o] = b;
            p.absdot[t * N + o] = a;
        }
    return p;
}

std::vector<float> run(const Problem& p, Isa isa, TilePath path, ThreadPool& pool) {
    const int64_t ldy = p.N + 3;
    std::vector<float> y(size_t(p.T * ldy), -12345.f);
    kernels::matmul_isa(isa, p.wt, p.W.data(), p.K, p.N, p.x.data(), p.T, y.data(), ldy, pool, path);
    std::vector<float> out(size_t(p.T * p.N));
    for (int64_t t = 0; t < p.T; ++t) {
        for (int64_t o = 0; o < p.N; ++o) out[t * p.N + o] = y[t * ldy + o];
        for (int64_t o = p.N; o < ldy; ++o) EXPECT_EQ(y[t * ldy + o], -12345.f) << "wrote past N";
    }
    return out;
}

// Float rounding of a sum of K products (and of the scale products) in single
// precision: a few ulps of sum |w x|.
constexpr double kFloatRel = 2e-6;

}  // namespace

TEST(QuantGemmInt8, MatchesDotKernelsAndReferenceOnEveryLevel) {
    ThreadPool pool(2);
    uint32_t seed = 100;
    for (GgmlType wt : kTypes)
        for (int64_t K : {256, 2560})
            for (int64_t N : {13, 37})  // not a multiple of 8 or 16
                for (int64_t T : {1, 3, 5, 17}) {
                    if (K == 2560 && N == 37 && T != 17) continue;  // keep the test fast
                    const Problem p = make_problem(wt, K, N, T, seed++);
                    std::vector<float> gemm_scalar, gemm_avx2;
                    for (Isa isa : kernels::supported_isas()) {
                        SCOPED_TRACE(std::string(type_name(wt)) + " " + kernels::isa_name(isa) + " K=" +
                                     std::to_string(K) + " N=" + std::to_string(N) + " T=" + std::to_string(T));
                        const std::vector<float> dot = run(p, isa, TilePath::Dot, pool);
                        const std::vector<float> gemm = run(p, isa, TilePath::Gemm, pool);
                        for (size_t i = 0; i < gemm.size(); ++i) {
                            // The 8-bit activations are the only approximation beyond float rounding.
                            const double slack = p.bound[i] + kFloatRel * 4 * p.absdot[i];
                            ASSERT_LE(std::fabs(gemm[i] - p.ref[i]), slack) << "element " << i;
                            ASSERT_LE(std::fabs(dot[i] - p.ref[i]), slack) << "element " << i;
                            // Same integer sums and the same float steps per output as the
                            // dot kernels of this level: bit-identical, so that a prompt gives
                            // the same logits in one batch as token by token (any difference
                            // would flip later activation roundings). Also catches packing errors.
                            ASSERT_EQ(gemm[i], dot[i]) << "element " << i;
                        }
                        if (isa == Isa::Scalar) {
                            gemm_scalar = gemm;
                        } else {
                            for (size_t i = 0; i < gemm.size(); ++i)
                                ASSERT_NEAR(gemm[i], gemm_scalar[i], kFloatRel * p.absdot[i]) << "element " << i;
                        }
                        if (isa == Isa::Avx2) gemm_avx2 = gemm;
                        if (isa == Isa::Avx512) {
                            // Same per-lane float steps as AVX2: bit-identical.
                            for (size_t i = 0; i < gemm.size(); ++i) ASSERT_EQ(gemm[i], gemm_avx2[i]) << "element " << i;
                        }
                    }
                }
}

TEST(QuantGemmInt8, SimdLevelsAvailable) {
    if (!kernels::cpu_supports(Isa::Avx2)) GTEST_SKIP() << "no AVX2 on this CPU: only the portable kernel was tested";
    EXPECT_NE(kernels::pick_gemm(Isa::Avx2, GgmlType::Q4_K).fn, nullptr);
    EXPECT_EQ(kernels::pick_gemm(Isa::Avx2, GgmlType::Q4_K).nr, 8);
    if (!kernels::cpu_supports(Isa::Avx512))
        GTEST_SKIP() << "no AVX512-VNNI on this CPU: the AVX-512 tile kernel was not run";
    EXPECT_EQ(kernels::pick_gemm(Isa::Avx512, GgmlType::Q4_K).nr, 16);
}

TEST(QuantGemmInt8, AutoPathAndThreadsAndGroups) {
    // cpu_matmul picks the tile kernels from q8_gemm_min_rows() rows; results
    // must not depend on the thread count (the split of rows and panels), and a
    // group equals the products one by one.
    ThreadPool one(1), three(3);
    const Isa isa = kernels::detected_isa();
    const int64_t K = 512;
    const int64_t T = std::max(kernels::q8_gemm_min_rows(GgmlType::Q4_K), kernels::q8_gemm_min_rows(GgmlType::Q6_K)) + 7;
    const Problem a = make_problem(GgmlType::Q4_K, K, 300, T, 7), b = make_problem(GgmlType::Q6_K, K, 45, T, 8);
    const std::vector<float> forced = run(a, isa, TilePath::Gemm, one);
    for (ThreadPool* pool : {&one, &three}) {
        const std::vector<float> y = run(a, isa, TilePath::Auto, *pool);
        for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], isa >= Isa::Avx2 ? forced[i] : y[i]) << i;
    }
    std::vector<float> ya(size_t(a.N * T)), yb(size_t(b.N * T));
    const MatmulJob jobs[2] = {{a.wt, a.W.data(), a.N, ya.data(), a.N}, {b.wt, b.W.data(), b.N, yb.data(), b.N}};
    kernels::matmul_group_isa(isa, jobs, 2, K, a.x.data(), T, three, TilePath::Gemm);
    for (size_t i = 0; i < ya.size(); ++i) ASSERT_EQ(ya[i], forced[i]) << i;
    Problem b_on_a = b;
    b_on_a.x = a.x;
    const std::vector<float> want_b = run(b_on_a, isa, TilePath::Gemm, one);
    for (size_t i = 0; i < yb.size(); ++i) ASSERT_EQ(yb[i], want_b[i]) << i;
}

TEST(QuantGemmInt8, ManyRowsFewOutputsSplitsRows) {
    // N smaller than one panel and many activation rows: the driver splits
    // the rows into blocks (each packs the panel again).
    ThreadPool pool(4);
    const Problem p = make_problem(GgmlType::Q5_K, 256, 3, 130, 9);
    const std::vector<float> y = run(p, kernels::detected_isa(), TilePath::Gemm, pool);
    for (size_t i = 0; i < y.size(); ++i)
        ASSERT_LE(std::fabs(y[i] - p.ref[i]), p.bound[i] + 4 * kFloatRel * p.absdot[i]) << i;
}
