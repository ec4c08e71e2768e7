// CUDA kernels against CPU references on random data: activation quantization
// (bit-exact with quant/quantize_row), matrix products for every weight type and
// token count (against an f64 product of the same quantized operands), row
// gather, argmax. Outputs are poisoned before each run and checked to be fully
// written. Skipped when there is no GPU (CI builds with nvcc but has none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "gguf/gguf.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "runtime/backend.h"
#include "cuda_testutil.h"
#include "testutil.h"

#ifdef QINFER_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/kernels.h"
#endif

namespace qinfer {
namespace {

using test::set_env;
using test::unset_env;


std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, scale);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
        v[i] = nd(rng);
        if (i % 97 == 13) v[i] *= 8.f;  // outliers, so block maxima vary
    }
    return v;
}

// N random rows of K weights quantized to `type` (row stride rb bytes) and
// dequantized back on the host: the exact operand the kernels see.
struct QuantWeights {
    size_t rb = 0;
    std::vector<uint8_t> q;
    std::vector<float> deq;
};
QuantWeights quantized_weights(GgmlType type, int64_t K, int64_t N, uint32_t seed) {
    const std::vector<float> wf = random_floats(size_t(N * K), seed, 0.5f);
    QuantWeights w;
    w.rb = row_bytes(type, K);
    w.q.resize(w.rb * size_t(N));
    w.deq.resize(size_t(N * K));
    for (int64_t n = 0; n < N; ++n) {
        quantize_row(type, &wf[size_t(n * K)], &w.q[w.rb * size_t(n)], K);
        dequantize_row(type, &w.q[w.rb * size_t(n)], &w.deq[size_t(n * K)], K);
    }
    return w;
}

// Poison pattern: all bits set is a NaN for f32.
constexpr uint8_t kPoison = 0xFF;

Tensor upload(Backend& be, GgmlType t, int64_t K, int64_t N, const std::vector<uint8_t>& bytes, const char* name) {
    gguf::TensorInfo ti;
    ti.name = name;
    ti.type = t;
    ti.n_dims = 2;
    ti.ne[0] = K;
    ti.ne[1] = N;
    ti.nbytes = bytes.size();
    ti.data = bytes.data();
    Tensor w = be.upload_weight(ti);
    be.synchronize();
    return w;
}

Tensor put_f32(Backend& be, const std::vector<float>& v, std::initializer_list<int64_t> ne, const char* name) {
    Tensor t = be.alloc(GgmlType::F32, ne, name);
    be.write(t, v.data(), v.size() * 4);
    return t;
}

std::vector<float> get_f32(Backend& be, const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.nbytes() / 4));
    be.read(t, v.data(), v.size() * 4);
    return v;
}

void poison(Backend& be, const Tensor& t) {
    std::vector<uint8_t> p(t.nbytes(), kPoison);
    be.write(t, p.data(), p.size());
}

// The activation type a weight type's dot product uses (ggml vec_dot_type).
GgmlType act_type(GgmlType w) {
    switch (w) {
        case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return GgmlType::Q8_0;
        case GgmlType::Q4_1: case GgmlType::Q5_1: return GgmlType::Q8_1;
        case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return GgmlType::Q8_K;
        default: return GgmlType::F32;  // F32, F16, BF16 weights multiply f32 activations
    }
}

// The CPU backend's Q8_0 / Q8_1 activation quantizer (quant/cpu_matmul.cpp):
// the reference layout, rounded to nearest with ties to even.
void quantize_q8_rne(GgmlType t, const float* x, uint8_t* dst, int64_t K) {
    const size_t bs = traits(t).type_size;
    for (int64_t i = 0; i < K / 32; ++i, x += 32) {
        uint8_t* b = dst + size_t(i) * bs;
        float amax = 0.f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        int8_t* qs = reinterpret_cast<int8_t*>(b + (t == GgmlType::Q8_1 ? 4 : 2));
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            qs[j] = int8_t(std::nearbyint(x[j] * id));
            sum += qs[j];
        }
        const uint16_t dh = fp32_to_fp16(d);
        std::memcpy(b, &dh, 2);
        if (t == GgmlType::Q8_1) {
            const uint16_t sh = fp32_to_fp16(float(sum) * d);
            std::memcpy(b + 2, &sh, 2);
        }
    }
}

void quantize_act_ref(GgmlType t, const float* x, uint8_t* dst, int64_t K) {
    if (t == GgmlType::Q8_0 || t == GgmlType::Q8_1) quantize_q8_rne(t, x, dst, K);
    else quantize_row(t, x, dst, K);
}

// x as the dot product sees it: quantized to the activation type and back.
// For Q8_1 also returns per block (s - d * sum q), the correction ggml's
// Q4_1/Q5_1 product makes through the stored s.
std::vector<float> act_as_seen(GgmlType wt, const float* x, int64_t K, std::vector<double>* s_corr) {
    const GgmlType at = act_type(wt);
    std::vector<float> out(static_cast<size_t>(K));
    if (at == GgmlType::F32) {
        std::copy(x, x + K, out.begin());
        return out;
    }
    std::vector<uint8_t> q(row_bytes(at, K));
    quantize_act_ref(at, x, q.data(), K);
    if (at == GgmlType::Q8_1) {
        const block_q8_1* b = reinterpret_cast<const block_q8_1*>(q.data());
        for (int64_t j = 0; j < K / 32; ++j) {
            const float d = fp16_to_fp32(b[j].d);
            int sum = 0;
            for (int i = 0; i < 32; ++i) {
                out[size_t(32 * j + i)] = d * float(b[j].qs[i]);
                sum += b[j].qs[i];
            }
            s_corr->push_back(double(fp16_to_fp32(b[j].s)) - double(d) * sum);
        }
        return out;
    }
    dequantize_row(at, q.data(), out.data(), K);
    return out;
}

// Min of a Q4_1 / Q5_1 block (both keep it at byte offset 2).
double block_min(GgmlType wt, const uint8_t* row, int64_t j) {
    const size_t bs = traits(wt).type_size;
    uint16_t m;
    std::memcpy(&m, row + size_t(j) * bs + 2, 2);
    return fp16_to_fp32(m);
}

struct MatmulCase {
    GgmlType type;
    int64_t K;
};

class CudaMatmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(CudaMatmul, MatchesF64ProductOfTheSameQuantizedOperands) {
    REQUIRE_GPU();
    const GgmlType wt = GetParam().type;
    const int64_t K = GetParam().K;
    auto be = make_cuda_backend(0);
    for (int64_t N : {1, 37, 130}) {
        const QuantWeights qw = quantized_weights(wt, K, N, uint32_t(7 + N + K));
        const size_t rb = qw.rb;
        const std::vector<uint8_t>& wq = qw.q;
        const std::vector<float>& wd = qw.deq;
        const Tensor w = upload(*be, wt, K, N, wq, "w");
        // T > 8 runs the tensor-core kernels (the f16 one, default for Q4_K / Q5_K,
        // and the int8 one), except for N < 128 up to T = 64 (matvec token chunks)
        for (int64_t T : {1, 2, 3, 5, 8, 13, 40, 80, -13, -40, -80}) {
            const bool int8_mma = T < 0;
            T = std::abs(T);
            if (int8_mma) set_env("QINFER_CUDA_MMA", "int8");
            std::vector<float> xf = random_floats(size_t(T * K), uint32_t(1000 + T * 31 + N), 2.f);
            if (T > 2) std::fill(xf.begin() + K, xf.begin() + K + std::min<int64_t>(K, 256), 0.f);  // an all-zero block
            const Tensor x = put_f32(*be, xf, {K, T}, "x");
            const int64_t ldy = N + 3;  // strided output rows: the padding must stay untouched
            Tensor ybuf = be->alloc(GgmlType::F32, {ldy, T}, "y");
            poison(*be, ybuf);
            const Tensor y = view(ybuf, {N, T}, {size_t(ldy) * 4});
            be->matmul(w, x, y, nullptr);
            const std::vector<float> got = get_f32(*be, ybuf);
            for (int64_t t = 0; t < T; ++t) {
                std::vector<double> corr;
                const std::vector<float> a = act_as_seen(wt, &xf[size_t(t * K)], K, &corr);
                for (int64_t n = 0; n < N; ++n) {
                    double ref = 0, mag = 0;
                    for (int64_t k = 0; k < K; ++k) {
                        const double p = double(wd[size_t(n * K + k)]) * double(a[size_t(k)]);
                        ref += p;
                        mag += std::fabs(p);
                    }
                    if (!corr.empty())
                        for (int64_t j = 0; j < K / 32; ++j) ref += block_min(wt, &wq[rb * size_t(n)], j) * corr[size_t(j)];
                    const float g = got[size_t(t * ldy + n)];
                    ASSERT_TRUE(std::isfinite(g)) << type_name(wt) << " N=" << N << " T=" << T << " t=" << t << " n=" << n;
                    ASSERT_NEAR(g, ref, 3e-5 * mag + 1e-6)
                        << type_name(wt) << " K=" << K << " N=" << N << " T=" << T << " t=" << t << " n=" << n;
                }
                for (int64_t n = N; n < ldy; ++n) {
                    uint32_t bits;
                    std::memcpy(&bits, &got[size_t(t * ldy + n)], 4);
                    ASSERT_EQ(bits, 0xFFFFFFFFu) << "padding overwritten";
                }
            }
            Tensor xx = x;
            be->free(xx);
            be->free(ybuf);
            if (int8_mma) unset_env("QINFER_CUDA_MMA");
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMatmul,
                         ::testing::Values(MatmulCase{GgmlType::Q4_0, 128}, MatmulCase{GgmlType::Q4_1, 96},
                                           MatmulCase{GgmlType::Q5_0, 128}, MatmulCase{GgmlType::Q5_1, 160},
                                           MatmulCase{GgmlType::Q8_0, 288}, MatmulCase{GgmlType::Q4_K, 512},
                                           // 88 units per row: the pipelined decode loop's several steps and
                                           // its ragged last one (lanes 0-23)
                                           MatmulCase{GgmlType::Q4_K, 2816},
                                           MatmulCase{GgmlType::Q5_K, 256}, MatmulCase{GgmlType::Q6_K, 768},
                                           MatmulCase{GgmlType::F16, 136}, MatmulCase{GgmlType::BF16, 264},
                                           MatmulCase{GgmlType::F32, 100}),
                         [](const ::testing::TestParamInfo<MatmulCase>& i) {
                             return std::string(type_name(i.param.type)) + "_K" + std::to_string(i.param.K);
                         });

// Prompt-sized products (T >= 128 tokens, N >= 256 rows) dequantize the weight
// to f16 and multiply f16 activations on cuBLAS (f32 accumulation): within the
// f16 roundings of both operands (2 x 2^-11 relative per product) of the f64
// product of the dequantized weights and the f32 activations. Every quantized
// type, with K both a single and several blocks.
TEST(CudaMatmul, PromptStepsOnF16MatchF64Product) {
    REQUIRE_GPU();
    auto be = make_cuda_backend(0);
    const int64_t T = 130;
    auto check = [&](GgmlType wt, int64_t N, const char* what) {
        const int64_t K = traits(wt).block_size == 256 ? 768 : 96;
        const QuantWeights qw = quantized_weights(wt, K, N, uint32_t(17 + K + N));
        const std::vector<float>& wd = qw.deq;
        const Tensor w = upload(*be, wt, K, N, qw.q, "w");
        const std::vector<float> xf = random_floats(size_t(T * K), uint32_t(99 + K), 2.f);
        const Tensor x = put_f32(*be, xf, {K, T}, "x");
        Tensor y = be->alloc(GgmlType::F32, {N, T}, "y");
        poison(*be, y);
        be->matmul(w, x, y, nullptr);
        const std::vector<float> got = get_f32(*be, y);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; ++n) {
                double ref = 0, mag = 0;
                for (int64_t k = 0; k < K; ++k) {
                    const double p = double(wd[size_t(n * K + k)]) * double(xf[size_t(t * K + k)]);
                    ref += p;
                    mag += std::fabs(p);
                }
                const float g = got[size_t(t * N + n)];
                ASSERT_TRUE(std::isfinite(g)) << type_name(wt) << " " << what << " t=" << t << " n=" << n;
                ASSERT_NEAR(g, ref, 1.2e-3 * mag + 1e-6)
                    << type_name(wt) << " " << what << " K=" << K << " t=" << t << " n=" << n;
            }
        Tensor xx = x;
        be->free(xx);
        be->free(y);
    };
    // Each weight dequantized per step through the scratch, and once into a
    // kept f16 copy.
    for (const char* copy : {"0", "1"}) {
        set_env("QINFER_CUDA_F16_COPY", copy);
        for (GgmlType wt : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
            check(wt, 300, *copy == '1' ? "f16 copy" : "one chunk");
    }
    // Weights above the f16 scratch go in row chunks: 256 KB holds 170 rows of
    // 768, so 300 rows take two GEMMs (170 + 130) into the same output.
    set_env("QINFER_CUDA_F16_COPY", "0");
    set_env("QINFER_CUDA_F16_CHUNK_KB", "256");
    check(GgmlType::Q4_K, 300, "two chunks");
    check(GgmlType::Q6_K, 300, "two chunks");
    unset_env("QINFER_CUDA_F16_CHUNK_KB");
    unset_env("QINFER_CUDA_F16_COPY");
}

// The f16 copy of a weight is made at its first prompt step, reused by the
// next (no new memory) and released with the weight; decode-sized products
// never make one.
TEST(CudaMatmul, F16CopyIsMadeOnceAndFreedWithTheWeight) {
    REQUIRE_GPU();
    set_env("QINFER_CUDA_F16_COPY", "1");
    auto be = make_cuda_backend(0);
    auto& cuda = static_cast<CudaBackend&>(*be);
    const int64_t K = 512, N = 256;
    const QuantWeights qw = quantized_weights(GgmlType::Q4_K, K, N, 5);
    const uint64_t before = cuda.memory_in_use();
    Tensor w = upload(*be, GgmlType::Q4_K, K, N, qw.q, "w");
    const uint64_t uploaded = cuda.memory_in_use();
    auto product = [&](int64_t T) {
        Tensor x = put_f32(*be, random_floats(size_t(T * K), 7), {K, T}, "x");
        Tensor y = be->alloc(GgmlType::F32, {N, T}, "y");
        be->matmul(w, x, y, nullptr);
        std::vector<float> got = get_f32(*be, y);
        be->free(x);
        be->free(y);
        return got;
    };
    product(4);  // (grows only the small activation scratch)
    EXPECT_LT(cuda.memory_in_use() - uploaded, uint64_t(K * N * 2)) << "a decode product made a copy";
    const std::vector<float> first = product(200);
    const uint64_t with_copy = cuda.memory_in_use();
    EXPECT_GE(with_copy, uploaded + uint64_t(K * N * 2));
    EXPECT_EQ(product(200), first);
    EXPECT_EQ(cuda.memory_in_use(), with_copy) << "the second step made another copy";
    be->free(w);
    EXPECT_EQ(cuda.memory_in_use(), with_copy - (uploaded - before) - uint64_t(K * N * 2));
    unset_env("QINFER_CUDA_F16_COPY");
}

TEST(CudaMatmul, BiasAndBatchedEqualsTokenByToken) {
    REQUIRE_GPU();
    auto be = make_cuda_backend(0);
    const int64_t K = 256, N = 77, T = 19;
    for (GgmlType wt : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16}) {
        const std::vector<float> wf = random_floats(size_t(N * K), 5);
        const size_t rb = row_bytes(wt, K);
        std::vector<uint8_t> wq(rb * size_t(N));
        for (int64_t n = 0; n < N; ++n) quantize_row(wt, &wf[size_t(n * K)], &wq[rb * size_t(n)], K);
        const Tensor w = upload(*be, wt, K, N, wq, "w");
        const std::vector<float> bias = random_floats(size_t(N), 6);
        const Tensor b = put_f32(*be, bias, {N}, "bias");
        const std::vector<float> xf = random_floats(size_t(T * K), 8);
        const Tensor x = put_f32(*be, xf, {K, T}, "x");
        Tensor y = be->alloc(GgmlType::F32, {N, T}, "y");
        poison(*be, y);
        be->matmul(w, x, y, &b);
        const std::vector<float> all = get_f32(*be, y);
        for (int64_t t = 0; t < T; ++t) {
            const Tensor x1 = put_f32(*be, std::vector<float>(xf.begin() + t * K, xf.begin() + (t + 1) * K), {K, 1}, "x1");
            Tensor y1 = be->alloc(GgmlType::F32, {N, 1}, "y1");
            be->matmul(w, x1, y1, &b);
            const std::vector<float> one = get_f32(*be, y1);
            for (int64_t n = 0; n < N; ++n)
                ASSERT_NEAR(all[size_t(t * N + n)], one[size_t(n)], 2e-5 * (std::fabs(one[size_t(n)]) + 1.f))
                    << type_name(wt) << " t=" << t << " n=" << n;
            Tensor a = x1;
            be->free(a);
            be->free(y1);
        }
    }
}

class CudaGetRows : public ::testing::TestWithParam<GgmlType> {};

TEST_P(CudaGetRows, EqualsDequantizeRow) {
    REQUIRE_GPU();
    const GgmlType wt = GetParam();
    auto be = make_cuda_backend(0);
    const int64_t K = 512, N = 23;
    const std::vector<float> wf = random_floats(size_t(N * K), 11);
    const size_t rb = row_bytes(wt, K);
    std::vector<uint8_t> wq(rb * size_t(N));
    for (int64_t n = 0; n < N; ++n) quantize_row(wt, &wf[size_t(n * K)], &wq[rb * size_t(n)], K);
    const Tensor w = upload(*be, wt, K, N, wq, "w");
    const std::vector<int32_t> ids = {22, 0, 5, 5, 17};
    Tensor idt = be->alloc(GgmlType::I32, {int64_t(ids.size())}, "ids");
    be->write(idt, ids.data(), ids.size() * 4);
    Tensor out = be->alloc(GgmlType::F32, {K, int64_t(ids.size())}, "out");
    poison(*be, out);
    be->get_rows(w, idt, out);
    const std::vector<float> got = get_f32(*be, out);
    std::vector<float> ref(static_cast<size_t>(K));
    for (size_t t = 0; t < ids.size(); ++t) {
        dequantize_row(wt, &wq[rb * size_t(ids[t])], ref.data(), K);
        for (int64_t k = 0; k < K; ++k) ASSERT_EQ(got[t * size_t(K) + size_t(k)], ref[size_t(k)]) << "row " << t << " k " << k;
    }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaGetRows,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0,
                                           GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K),
                         [](const ::testing::TestParamInfo<GgmlType>& i) { return std::string(type_name(i.param)); });

TEST(CudaArgmax, LowestIndexOfTheMaximum) {
    REQUIRE_GPU();
    auto be = make_cuda_backend(0);
    const int64_t V = 5003, T = 4;
    std::vector<float> l = random_floats(size_t(V * T), 3);
    l[size_t(0 * V + 4000)] = 50.f;
    l[size_t(1 * V + 7)] = 60.f;
    l[size_t(1 * V + 4999)] = 60.f;  // tie: the lower index wins
    l[size_t(2 * V + 0)] = 70.f;
    l[size_t(3 * V + 5002)] = 80.f;
    const Tensor lg = put_f32(*be, l, {V, T}, "logits");
    Tensor ids = be->alloc(GgmlType::I32, {T}, "ids");
    be->argmax(lg, ids);
    std::vector<int32_t> got(static_cast<size_t>(T));
    be->read(ids, got.data(), got.size() * 4);
    EXPECT_EQ(got, (std::vector<int32_t>{4000, 7, 0, 5002}));
}

#ifdef QINFER_HAVE_CUDA
// The GPU activation quantizers reproduce the CPU backend's bit for bit.
TEST(CudaQuantize, BitIdenticalToReferenceQuantizers) {
    REQUIRE_GPU();
    const int64_t K = 1024, T = 3;
    std::vector<float> x = random_floats(size_t(K * T), 21, 3.f);
    std::fill(x.begin() + 256, x.begin() + 512, 0.f);  // zero blocks
    x[600] = 9.f;  // |max| tie with opposite signs: the first one wins
    x[601] = -9.f;
    // a block with amax 127 (d = 1): halves are exact ties, rounded to even
    for (int i = 0; i < 32; ++i) x[size_t(K + 32 * 5 + i)] = float(i) - 15.5f;
    x[size_t(K + 32 * 5)] = 127.f;
    float* dx = nullptr;
    ASSERT_EQ(cudaMalloc(&dx, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    for (auto [kind, qt] : {std::pair{cuda::ActKind::Q8_0, GgmlType::Q8_0}, std::pair{cuda::ActKind::Q8_1, GgmlType::Q8_1},
                            std::pair{cuda::ActKind::Q8_K, GgmlType::Q8_K}}) {
        const size_t bytes = cuda::act_bytes(kind, K, T);
        void* buf = nullptr;
        ASSERT_EQ(cudaMalloc(&buf, bytes), cudaSuccess);
        ASSERT_EQ(cudaMemset(buf, 0xFF, bytes), cudaSuccess);
        cuda::quantize_act(kind, dx, K, K, T, buf, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint8_t> host(bytes);
        ASSERT_EQ(cudaMemcpy(host.data(), buf, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        const cuda::ActQ a = cuda::act_view(kind, buf, dx, K, T);
        auto off = [&](const void* p) { return size_t(static_cast<const uint8_t*>(p) - static_cast<const uint8_t*>(buf)); };
        const int8_t* qs = reinterpret_cast<const int8_t*>(host.data() + off(a.qs));
        const float* d = reinterpret_cast<const float*>(host.data() + off(a.d));
        const float* s = reinterpret_cast<const float*>(host.data() + off(a.s));
        const int16_t* bsum = reinterpret_cast<const int16_t*>(host.data() + off(a.bsum));
        for (int64_t t = 0; t < T; ++t) {
            std::vector<uint8_t> ref(row_bytes(qt, K));
            quantize_act_ref(qt, &x[size_t(t * K)], ref.data(), K);
            if (qt == GgmlType::Q8_K) {
                const block_q8_K* b = reinterpret_cast<const block_q8_K*>(ref.data());
                for (int64_t j = 0; j < K / 256; ++j) {
                    ASSERT_EQ(d[t * (K / 256) + j], b[j].d) << "d of block " << j;
                    for (int i = 0; i < 256; ++i) ASSERT_EQ(qs[t * K + j * 256 + i], b[j].qs[i]) << j << "," << i;
                    for (int i = 0; i < 16; ++i) ASSERT_EQ(bsum[t * (K / 16) + j * 16 + i], b[j].bsums[i]);
                }
            } else {
                for (int64_t j = 0; j < K / 32; ++j) {
                    const uint8_t* blk = ref.data() + size_t(j) * traits(qt).type_size;
                    uint16_t dh;
                    std::memcpy(&dh, blk, 2);
                    ASSERT_EQ(d[t * (K / 32) + j], fp16_to_fp32(dh)) << "d of block " << j;
                    const int8_t* rq = reinterpret_cast<const int8_t*>(blk + (qt == GgmlType::Q8_1 ? 4 : 2));
                    int s16[2] = {0, 0};
                    for (int i = 0; i < 32; ++i) {
                        ASSERT_EQ(qs[t * K + j * 32 + i], rq[i]) << "block " << j << " element " << i;
                        s16[i / 16] += rq[i];
                    }
                    ASSERT_EQ(bsum[t * (K / 16) + 2 * j], s16[0]);
                    ASSERT_EQ(bsum[t * (K / 16) + 2 * j + 1], s16[1]);
                    if (qt == GgmlType::Q8_1) {
                        uint16_t sh;
                        std::memcpy(&sh, blk + 2, 2);
                        ASSERT_EQ(s[t * (K / 32) + j], fp16_to_fp32(sh));
                    }
                }
            }
        }
        cudaFree(buf);
    }
    cudaFree(dx);
}

// The rope's frequencies come from the host as the CPU backend computes them
// (std::pow in double), so GPU and CPU angles are equal; rotary widths the
// kernels cannot hold are refused with a message, before anything runs.
TEST(CudaRope, FrequenciesAreTheCpuBackendsAndOddWidthsFail) {
    for (int n_rot : {64, 128, 256}) {
        const cuda::RopeFreqs f = cuda::rope_freqs(n_rot, 1e7f);
        for (int i = 0; i < n_rot / 2; ++i)
            ASSERT_EQ(f.inv[i], std::pow(double(1e7f), -2.0 * double(i) / double(n_rot))) << n_rot << " pair " << i;
    }
    for (int n_rot : {0, 3, 258}) {
        try {
            (void)cuda::rope_freqs(n_rot, 1e4f);
            ADD_FAILURE() << "n_rot " << n_rot << " accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("n_rot"), std::string::npos) << e.what();
        }
    }
}

// A KV cache row the shared row writer cannot take (head dim not a multiple of
// 32, a cache type it does not write) is refused before any launch.
TEST(CudaKvStore, RefusesHeadDimsAndTypesItCannotWrite) {
    cuda::KvView kv;
    kv.n_kv = 2;
    kv.n_ctx = 16;
    kv.n_slots = 1;
    const cuda::Rows rows;
    for (auto [type, d, what] : {std::tuple{GgmlType::F16, int64_t(80), "multiple of 32"},
                                 std::tuple{GgmlType::Q4_K, int64_t(128), "not supported"}}) {
        kv.type = type;
        kv.d = d;
        try {
            cuda::kv_store(rows, rows, kv, nullptr, nullptr, 1, nullptr);
            ADD_FAILURE() << "d " << d << " accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    }
}

// The cost of a kernel boundary in a captured graph (printed), and that every
// kernel of a chain waited for the one before: each adds one to what the one
// before wrote, so the last one holds the number of launches.
TEST(CudaLaunchTiming, ChainsCountEveryLaunchAndPrintTheBoundaryCost) {
    REQUIRE_GPU();
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const cuda::LaunchCost c = cuda::probe_launch_cost(200, 5, s);
    cudaStreamDestroy(s);
    EXPECT_EQ(c.last_value, c.launches);
    for (double us : {c.empty_block, c.chain_block, c.chain_grid, c.chain_grid_plain}) EXPECT_GT(us, 0.0);
    std::printf("[ timing ] us per kernel in a graph of 200: empty 1 block %.2f | waiting 1 block %.2f | "
                "waiting full grid %.2f | full grid without PDL %.2f\n",
                c.empty_block, c.chain_block, c.chain_grid, c.chain_grid_plain);
}
#endif

}  // namespace
}  // namespace qinfer
