// The CPU backend's SIMD inner loops (runtime/cpu/cpu_vec.h) against their
// scalar forms and against double-precision definitions: the vectorised exp
// behind silu / sigmoid / softmax (odd lengths, extreme and NaN inputs), the
// attention's tile and q8_0 forms (bit for bit against dot / axpy /
// dequantize_row / quantize_row), and the delta-rule step that interleaves
// rows. The SIMD checks skip where the CPU (or the build) has no AVX2 form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/fp16.h"
#include "quant/quant.h"
#include "runtime/cpu/cpu_vec.h"

namespace qinfer::cpu {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float lo, float hi) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

const VecOps* simd_or_skip() {
    const VecOps* ops = vec_avx2();
    if (!ops || &vec() != ops) return nullptr;  // not compiled in, or this CPU / QINFER_CPU_ISA lowers it
    return ops;
}

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// |got - want| within rel * |want| (or an absolute floor for values near zero).
void expect_close(float got, double want, double rel, double abs_floor, const char* what, size_t i) {
    const double err = std::fabs(double(got) - want);
    EXPECT_LE(err, std::max(rel * std::fabs(want), abs_floor)) << what << " at " << i << ": got " << got << " want "
                                                               << want;
}

TEST(CpuVec, ActivationsMatchTheDefinitionAtEveryLength) {
    const VecOps* ops = simd_or_skip();
    if (!ops) GTEST_SKIP() << "no AVX2 vector ops on this CPU";
    const double rel = 4 * std::numeric_limits<float>::epsilon();
    for (size_t n : {1, 7, 8, 9, 16, 37, 1000}) {
        const std::vector<float> x = random_vec(n, uint32_t(n), -30.f, 30.f), u = random_vec(n, uint32_t(n) + 1, -2.f, 2.f);
        std::vector<float> y(n), yu(n), ys(n);
        ops->silu(x.data(), y.data(), int64_t(n));
        ops->silu_mul(x.data(), u.data(), yu.data(), int64_t(n));
        ops->sigmoid_mul(u.data(), x.data(), ys.data(), int64_t(n));
        for (size_t i = 0; i < n; ++i) {
            expect_close(y[i], silu_ref(x[i]), rel, 1e-30, "silu", i);
            expect_close(yu[i], silu_ref(x[i]) * u[i], rel, 1e-30, "silu_mul", i);
            expect_close(ys[i], u[i] * sigmoid_ref(x[i]), rel, 1e-30, "sigmoid_mul", i);
        }
        // In place, as rms_norm_gated and swiglu use it.
        std::vector<float> inplace = u;
        ops->silu_mul(x.data(), inplace.data(), inplace.data(), int64_t(n));
        EXPECT_EQ(inplace, yu);
    }
}

TEST(CpuVec, ExtremeInputsSaturateAndNaNPropagates) {
    const VecOps* ops = simd_or_skip();
    if (!ops) GTEST_SKIP() << "no AVX2 vector ops on this CPU";
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> x = {-1e30f, -200.f, -88.5f, -87.f, 87.f, 88.5f, 200.f, 1e30f, inf, -inf, nan, 0.f};
    // silu(-inf) is -inf / inf, NaN in the scalar form too: index 9 checks sigmoid only.
    const int64_t n = int64_t(x.size());
    std::vector<float> y(x.size()), s(x.size()), one(x.size(), 1.f);
    ops->silu(x.data(), y.data(), n);
    ops->sigmoid_mul(one.data(), x.data(), s.data(), n);
    for (size_t i = 0; i + 2 < x.size(); ++i) {
        if (i != 9) {
            ASSERT_FALSE(std::isnan(y[i])) << x[i];
        }
        EXPECT_GE(s[i], 0.f) << x[i];
        EXPECT_LE(s[i], 1.f) << x[i];
        if (x[i] > 0) {
            EXPECT_FLOAT_EQ(s[i], 1.f) << x[i];
            EXPECT_EQ(y[i], x[i]) << x[i];
        } else {
            EXPECT_LT(s[i], 1e-37f) << x[i];
            if (i != 9) {
                EXPECT_LE(std::fabs(y[i]), 1e-35f) << x[i];
            }
        }
    }
    EXPECT_TRUE(std::isnan(y[10]));
    EXPECT_TRUE(std::isnan(s[10]));
    EXPECT_EQ(y[11], 0.f);
    EXPECT_EQ(s[11], 0.5f);
}

TEST(CpuVec, ExpSubSumIsASoftmaxNumerator) {
    const VecOps* ops = simd_or_skip();
    if (!ops) GTEST_SKIP() << "no AVX2 vector ops on this CPU";
    for (size_t n : {1, 5, 8, 13, 256}) {
        std::vector<float> x = random_vec(n, 40 + uint32_t(n), -50.f, 10.f);
        const std::vector<float> in = x;
        const float m = 10.f;
        const float sum = ops->exp_sub_sum(x.data(), int64_t(n), m);
        double want_sum = 0;
        for (size_t i = 0; i < n; ++i) {
            const double e = std::exp(double(in[i] - m));  // the difference rounds to float first, as in the op
            want_sum += e;
            expect_close(x[i], e, 4 * std::numeric_limits<float>::epsilon(), 1e-37, "exp", i);
        }
        expect_close(sum, want_sum, 1e-6, 0, "sum", n);
    }
}

// The attention's tile forms: scores of several query rows against several
// keys, and weighted value rows summed for several heads (f32 rows, and f16
// rows whose exact floats feed axpy). Each result must be the one-row
// function's (dot, axpy per row), bit for bit, on every table: the per-token
// and the query-tile tasks rely on it.
TEST(CpuVec, TileFormsEqualOneRowAtATime) {
    std::vector<const VecOps*> tables = {&vec_scalar()};
    if (const VecOps* ops = vec_avx2(); ops && &vec() == ops) tables.push_back(ops);
    for (const VecOps* ops : tables)
        for (int64_t n : {5, 24, 40, 256, 261})
            for (int64_t m : {1, 2, 3, 4, 7}) {
                const int64_t nk = 7, ks = n + 3;  // seven key rows of n, 3 floats apart
                const std::vector<float> keys = random_vec(size_t(nk * ks), 1, -1.f, 1.f);
                std::vector<std::vector<float>> q, acc;
                std::vector<const float*> qp;
                std::vector<float*> ap;
                for (int64_t h = 0; h < m; ++h) {
                    q.push_back(random_vec(size_t(n), 10 + uint32_t(h), -1.f, 1.f));
                    acc.push_back(random_vec(size_t(n), 20 + uint32_t(h), -1.f, 1.f));
                }
                for (int64_t h = 0; h < m; ++h) qp.push_back(q[size_t(h)].data());
                const int64_t ss = nk + 2;
                std::vector<float> s(size_t(m * ss), -7.f);
                ops->dot_tile(qp.data(), m, keys.data(), ks, nk, n, 0.3f, s.data(), ss);
                for (int64_t i = 0; i < m; ++i)
                    for (int64_t j = 0; j < nk; ++j)
                        EXPECT_EQ(s[size_t(i * ss + j)], 0.3f * ops->dot(keys.data() + j * ks, q[size_t(i)].data(), n))
                            << ops->name << " n " << n << " row " << i << " key " << j;

                // Value rows: the keys reused, weights w[h * 9 + j], f32 and f16 forms.
                std::vector<uint16_t> keys_h(keys.size());
                ops->to_f16(keys.data(), keys_h.data(), int64_t(keys.size()));
                std::vector<float> keys_back(keys.size());  // the halves as floats (exact)
                for (size_t e = 0; e < keys.size(); ++e) keys_back[e] = fp16_to_fp32(keys_h[e]);
                const std::vector<float> w = random_vec(size_t(m * 9), 3, -1.f, 1.f);
                std::vector<std::vector<float>> acc_f16 = acc, want = acc, want_f16 = acc;
                for (int64_t h = 0; h < m; ++h) ap.push_back(acc[size_t(h)].data());
                ops->axpy_rows_heads(w.data(), 9, keys.data(), ks, nk, ap.data(), m, n);
                for (int64_t h = 0; h < m; ++h) ap[size_t(h)] = acc_f16[size_t(h)].data();
                ops->axpy_rows_heads_f16(w.data(), 9, keys_h.data(), ks, nk, ap.data(), m, n);
                for (int64_t h = 0; h < m; ++h) {
                    const size_t i = size_t(h);
                    for (int64_t j = 0; j < nk; ++j) {
                        ops->axpy(w[size_t(h * 9 + j)], keys.data() + j * ks, want[i].data(), n);
                        ops->axpy(w[size_t(h * 9 + j)], keys_back.data() + j * ks, want_f16[i].data(), n);
                    }
                    EXPECT_EQ(acc[i], want[i]) << ops->name << " n " << n << " head " << h;
                    EXPECT_EQ(acc_f16[i], want_f16[i]) << ops->name << " n " << n << " head " << h;
                }
                // to_f32 undoes to_f16 exactly (every half is a float).
                std::vector<float> back(keys.size());
                ops->to_f32(keys_h.data(), back.data(), int64_t(keys.size()));
                for (size_t e = 0; e < keys.size(); ++e) ASSERT_EQ(back[e], fp16_to_fp32(keys_h[e]));
            }
}

// q8_0 cache rows to floats: the SIMD form must be dequantize_row's, bit for
// bit, since the attention reads a q8_0 cache through it in every task.
TEST(CpuVec, Q8_0RowsEqualDequantizeRow) {
    std::vector<const VecOps*> tables = {&vec_scalar()};
    if (const VecOps* ops = vec_avx2(); ops && &vec() == ops) tables.push_back(ops);
    const int64_t n = 256;
    std::vector<float> x = random_vec(size_t(n), 4, -3.f, 3.f);
    for (int64_t i = 32; i < 64; ++i) x[size_t(i)] *= 1e-6f;  // a block whose f16 scale is subnormal
    for (int64_t i = 64; i < 96; ++i) x[size_t(i)] = 0.f;     // and an all-zero block
    std::vector<uint8_t> q(row_bytes(GgmlType::Q8_0, n));
    quantize_row(GgmlType::Q8_0, x.data(), q.data(), n);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    dequantize_row(GgmlType::Q8_0, q.data(), want.data(), n);
    for (const VecOps* ops : tables) {
        ops->q8_0_to_f32(q.data(), got.data(), n);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << ops->name << " at " << i;
    }
    // Weighted q8_0 value rows (three rows of 64 values, 10 bytes of gap
    // between them): each element as axpy over the dequantized rows.
    const int64_t vn = 64, vstride = int64_t(row_bytes(GgmlType::Q8_0, vn)) + 10;
    std::vector<uint8_t> vrows(size_t(3 * vstride));
    for (int j = 0; j < 3; ++j) {
        const std::vector<float> vx = random_vec(size_t(vn), 30 + uint32_t(j), -4.f, 4.f);
        quantize_row(GgmlType::Q8_0, vx.data(), &vrows[size_t(j * vstride)], vn);
    }
    for (const VecOps* ops : tables)
        for (int64_t heads : {1, 2, 5}) {
            const std::vector<float> w = random_vec(size_t(heads * 3), 40, -1.f, 1.f);
            std::vector<std::vector<float>> acc, want;
            std::vector<float*> ap;
            for (int64_t h = 0; h < heads; ++h) acc.push_back(random_vec(size_t(vn), 50 + uint32_t(h), -1.f, 1.f));
            want = acc;
            for (auto& a : acc) ap.push_back(a.data());
            ops->axpy_rows_heads_q8_0(w.data(), 3, vrows.data(), vstride, 3, ap.data(), heads, vn);
            std::vector<float> row(static_cast<size_t>(vn));
            for (int64_t j = 0; j < 3; ++j) {
                dequantize_row(GgmlType::Q8_0, &vrows[size_t(j * vstride)], row.data(), vn);
                for (int64_t h = 0; h < heads; ++h) ops->axpy(w[size_t(h * 3 + j)], row.data(), want[size_t(h)].data(), vn);
            }
            for (int64_t h = 0; h < heads; ++h) EXPECT_EQ(acc[size_t(h)], want[size_t(h)]) << ops->name << " head " << h;
        }

    // And back: the bytes quantize_row writes. Rows with halves after scaling
    // (round half away from zero), negative ties, a NaN, an infinity, tiny and
    // huge blocks.
    std::vector<float> r = random_vec(size_t(8 * 32), 5, -2.f, 2.f);
    for (int j = 0; j < 32; ++j) r[size_t(j)] = float(j - 16) * 0.5f;  // amax 8: d = 8/127
    for (int j = 0; j < 32; ++j) r[size_t(32 + j)] = float(j - 16) + 0.5f;  // with the 127 below: d = 1, exact ties
    r[size_t(32 + 31)] = 127.f;
    r[size_t(64 + 3)] = std::numeric_limits<float>::quiet_NaN();
    r[size_t(96 + 7)] = std::numeric_limits<float>::infinity();
    for (int j = 0; j < 32; ++j) r[size_t(128 + j)] *= 1e-30f;
    for (int j = 0; j < 32; ++j) r[size_t(160 + j)] *= 1e30f;
    for (int j = 0; j < 32; ++j) r[size_t(192 + j)] = 0.f;
    std::vector<uint8_t> want_q(row_bytes(GgmlType::Q8_0, 256)), got_q(want_q.size());
    quantize_row(GgmlType::Q8_0, r.data(), want_q.data(), 256);
    for (const VecOps* ops : tables) {
        ops->to_q8_0(r.data(), got_q.data(), 256);
        // Every byte but the NaN's and the infinity's own quant (x * id is NaN
        // there: int8_t(NaN) is undefined in the reference).
        for (size_t i = 0; i < want_q.size(); ++i)
            if (i != 2 * 34 + 2 + 3 && i != 3 * 34 + 2 + 7) {
                EXPECT_EQ(want_q[i], got_q[i]) << ops->name << " byte " << i << " (block " << i / 34 << ")";
            }
    }
}

TEST(CpuVec, DeltaStepEqualsTheOneRowForm) {
    const VecOps* ops = simd_or_skip();
    if (!ops) GTEST_SKIP() << "no AVX2 vector ops on this CPU";
    // Rows not a multiple of 4 (the interleaved group) and a row length with a
    // tail; a token sequence so the state carries between steps.
    for (auto [rows, n] : {std::pair<int64_t, int64_t>{7, 20}, {128, 128}}) {
        std::vector<float> S = random_vec(size_t(rows * n), 7, -1.f, 1.f), S1 = S;
        std::vector<float> out(static_cast<size_t>(rows)), out1(static_cast<size_t>(rows));
        for (int t = 0; t < 5; ++t) {
            const std::vector<float> k = random_vec(size_t(n), 100 + t, -.3f, .3f), q = random_vec(size_t(n), 200 + t, -.3f, .3f),
                                     v = random_vec(size_t(rows), 300 + t, -1.f, 1.f);
            const float alpha = 0.9f - 0.1f * float(t), beta = 0.3f + 0.1f * float(t), scale = 0.125f;
            ops->delta_step(S.data(), rows, n, alpha, beta, k.data(), q.data(), v.data(), scale, out.data());
            // The same arithmetic one row at a time, in double, as the definition reads.
            for (int64_t r = 0; r < rows; ++r) {
                float* s = &S1[size_t(r * n)];
                double sk = 0;
                for (int64_t i = 0; i < n; ++i) sk += double(s[i] *= alpha) * k[size_t(i)];
                const double delta = double(beta) * (double(v[size_t(r)]) - sk);
                double o = 0;
                for (int64_t i = 0; i < n; ++i) o += double(s[i] += float(delta) * k[size_t(i)]) * q[size_t(i)];
                out1[size_t(r)] = float(o * scale);
            }
            for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(out[size_t(r)], out1[size_t(r)], 1e-5) << "row " << r << " t " << t;
        }
        double worst = 0;
        for (size_t i = 0; i < S.size(); ++i) worst = std::max(worst, double(std::fabs(S[i] - S1[i])));
        EXPECT_LT(worst, 1e-5);
        // Bit-identical to the scalar-order rows it replaced would be too strong
        // (8 lanes vs serial sums); the scalar table must agree within the same bound.
        std::vector<float> S2 = random_vec(size_t(rows * n), 7, -1.f, 1.f), S3 = S2;
        const std::vector<float> k = random_vec(size_t(n), 9, -.3f, .3f), q = random_vec(size_t(n), 10, -.3f, .3f),
                                 v = random_vec(size_t(rows), 11, -1.f, 1.f);
        ops->delta_step(S2.data(), rows, n, 0.8f, 0.5f, k.data(), q.data(), v.data(), 1.f, out.data());
        vec_scalar().delta_step(S3.data(), rows, n, 0.8f, 0.5f, k.data(), q.data(), v.data(), 1.f, out1.data());
        for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(out[size_t(r)], out1[size_t(r)], 1e-5) << "row " << r;
    }
}

}  // namespace
}  // namespace qinfer::cpu
