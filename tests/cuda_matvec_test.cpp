// One-token (decode) matrix-vector kernels: the persistent multi-row kernel
// (matvec variant 3, the default) against the one-row-per-warp kernels it
// replaced (variants 2 and 1), which must give the same bits, and against the
// CPU backend's product (cpu_matmul) within float rounding. Weights are random
// blocks of every type the one-token path takes (random quant bytes, sane
// scales) at odd and model sizes; outputs are NaN-poisoned before each run so
// every row must be written. Multi-job launches cover mixed types, empty jobs,
// bias and the residual epilogue. A timing test prints GB/s of the new and the
// previous kernel on model-shaped products (numbers only, it asserts nothing
// about speed). Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "common/fp16.h"
#include "common/thread_pool.h"
#include "quant/blocks.h"
#include "quant/cpu_matmul.h"
#include "quant/quant.h"
#include "runtime/backend.h"
#include "cuda_testutil.h"

#ifdef QINFER_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/kernels.h"
#include "runtime/cuda/layout.h"
#endif

namespace qinfer {
namespace {

#ifdef QINFER_HAVE_CUDA

#define CU(call) ASSERT_EQ((call), cudaSuccess) << #call

struct Rng {  // splitmix64: fast enough for half a gigabyte of weights
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uniform() { return float(next() >> 40) * (1.f / 16777216.f); }  // [0, 1)
    float normal() {  // sum of uniforms: plenty for test data
        float a = 0;
        for (int i = 0; i < 4; ++i) a += uniform();
        return (a - 2.f) * 1.7320508f;
    }
};

void put_f16(uint8_t* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

// n blocks of type t in the GGUF layout: every quant byte random, the f16
// scales small and random (some negative where the format allows, a few zero).
std::vector<uint8_t> random_blocks(GgmlType t, int64_t nb, uint64_t seed) {
    const size_t bs = traits(t).type_size;
    std::vector<uint8_t> v(size_t(nb) * bs);
    Rng r(seed);
    for (size_t i = 0; i + 8 <= v.size(); i += 8) {
        const uint64_t x = r.next();
        std::memcpy(&v[i], &x, 8);
    }
    for (size_t i = v.size() / 8 * 8; i < v.size(); ++i) v[i] = uint8_t(r.next());
    auto scale = [&](float lo, float hi, bool sign) {
        const int64_t pick = int64_t(r.next() % 64);
        if (pick == 0) return 0.f;
        const float m = lo + (hi - lo) * r.uniform();
        return sign && (r.next() & 1) ? -m : m;
    };
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* p = &v[size_t(b) * bs];
        switch (t) {
            case GgmlType::Q8_0:  // -128 is no quantizer's output (and saturates SIMD int16 products)
                for (size_t k = 0; k < sizeof(block_q8_0::qs); ++k) {
                    uint8_t& q = p[offsetof(block_q8_0, qs) + k];
                    if (q == 0x80) q = 0x81;
                }
                put_f16(p + offsetof(block_q8_0, d), scale(0.004f, 0.03f, true));
                break;
            case GgmlType::Q4_0: case GgmlType::Q5_0:
                put_f16(p + offsetof(block_q4_0, d), scale(0.004f, 0.03f, true));
                break;
            case GgmlType::Q4_1: case GgmlType::Q5_1:
                put_f16(p + offsetof(block_q4_1, d), scale(0.004f, 0.03f, false));
                put_f16(p + offsetof(block_q4_1, m), scale(0.004f, 0.2f, true));
                break;
            case GgmlType::Q4_K: case GgmlType::Q5_K:
                put_f16(p + offsetof(block_q4_K, d), scale(0.0005f, 0.003f, false));
                put_f16(p + offsetof(block_q4_K, dmin), scale(0.0005f, 0.003f, false));
                break;
            case GgmlType::Q6_K:
                put_f16(p + offsetof(block_q6_K, d), scale(0.0005f, 0.003f, true));
                break;
            default:
                ADD_FAILURE() << "no random blocks for " << type_name(t);
        }
    }
    return v;
}

std::vector<float> random_x(int64_t n, uint64_t seed) {
    Rng r(seed);
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        x[size_t(i)] = r.normal();
        if (i % 97 == 13) x[size_t(i)] *= 8.f;  // outliers, so block maxima vary
    }
    if (n >= 512) std::fill(x.begin() + 256, x.begin() + 512, 0.f);  // an all-zero block
    return x;
}

cuda::ActKind act_kind(GgmlType t) { return cuda::act_kind_for(t); }

// Device memory freed on scope exit.
struct DevBuf {
    void* p = nullptr;
    size_t n = 0;
    explicit DevBuf(size_t bytes) : n(bytes) {
        if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) p = nullptr;
    }
    ~DevBuf() {
        if (p) cudaFree(p);
    }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    float* f() const { return static_cast<float*>(p); }
};

// A weight matrix on the GPU in the kernels' layout.
struct GpuWeight {
    GgmlType type;
    int64_t K, N;
    std::vector<uint8_t> gguf;  // host copy in the GGUF layout (for the CPU reference)
    std::unique_ptr<DevBuf> mem;
    cuda::DeviceWeight dw() const {
        cuda::DeviceWeight w;
        w.type = type;
        w.K = K;
        w.N = N;
        w.data = static_cast<const uint8_t*>(mem->p);
        w.layout = cuda::weight_layout(type, N * K / int64_t(traits(type).block_size));
        return w;
    }
};

GpuWeight make_weight(GgmlType t, int64_t K, int64_t N, uint64_t seed) {
    GpuWeight w{t, K, N, {}, nullptr};
    const int64_t nb = N * K / int64_t(traits(t).block_size);
    w.gguf = random_blocks(t, nb, seed);
    const cuda::WeightLayout l = cuda::weight_layout(t, nb);
    std::vector<uint8_t> packed(l.total);
    cuda::repack_weight(t, w.gguf.data(), nb, packed.data());
    w.mem = std::make_unique<DevBuf>(l.total);
    if (w.mem->p) {
        EXPECT_EQ(cudaMemcpy(w.mem->p, packed.data(), packed.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    return w;
}

// Quantized activations of one token on the GPU.
struct GpuAct {
    std::unique_ptr<DevBuf> x, buf;
    cuda::ActQ a;
};

GpuAct make_act(GgmlType wt, const std::vector<float>& x) {
    GpuAct g;
    const int64_t K = int64_t(x.size());
    const cuda::ActKind k = act_kind(wt);
    g.x = std::make_unique<DevBuf>(x.size() * 4);
    g.buf = std::make_unique<DevBuf>(cuda::act_bytes(k, K, 1));
    EXPECT_EQ(cudaMemcpy(g.x->p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    cuda::quantize_act(k, g.x->f(), K, K, 1, g.buf->p, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    g.a = cuda::act_view(k, g.buf->p, g.x->f(), K, 1);
    return g;
}

void poison(const DevBuf& b) { ASSERT_EQ(cudaMemset(b.p, 0xFF, b.n), cudaSuccess); }  // NaN floats

std::vector<float> get(const DevBuf& b, size_t n) {
    std::vector<float> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), b.p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}

// Restores the environment's kernel choice when a test ends.
struct VariantGuard {
    ~VariantGuard() {
        cuda::set_matvec_variant(0);
        cuda::set_matvec_rows(0);
        cuda::set_matvec_steps(0);
    }
};

// The one-token kernels compared bit for bit: 1 and 2 (one row per warp), 3
// (v3, rows per warp chosen per launch), v3 with 1 (id 4), 2 (5), 4 (6) and 8
// (7) rows per warp, and one row per warp with four steps of loads in flight
// (8; its activations loaded step by step).
constexpr int kKernelIds[] = {3, 4, 5, 6, 7, 8, 2, 1};
constexpr int kKernels = 9;  // array size for outputs indexed by id
const char* const kKernelNames[kKernels] = {"", "v1", "v2", "v3", "v3 R=1", "v3 R=2", "v3 R=4", "v3 R=8",
                                            "v3 R=1 S=4"};
void select_kernel(int id) {
    cuda::set_matvec_variant(id >= 3 ? 3 : id);
    cuda::set_matvec_rows(id == 8 ? 1 : id >= 4 ? 1 << (id - 4) : 0);
    cuda::set_matvec_steps(id == 8 ? 4 : 0);
}

// A row with its quant bits zeroed: what is left is the per-block offset
// (Q4_1 / Q5_1 min, Q4_K / Q5_K -dmin * m) that the products apply apart from
// the scaled quants, so both parts' magnitudes enter the rounding bound. Empty
// for types without such an offset.
std::vector<uint8_t> offsets_only(GgmlType t, const uint8_t* row, int64_t K) {
    size_t z0 = 0, z1 = 0;  // zeroed byte range of each block
    switch (t) {
        case GgmlType::Q4_1: z0 = offsetof(block_q4_1, qs); z1 = sizeof(block_q4_1); break;
        case GgmlType::Q5_1: z0 = offsetof(block_q5_1, qh); z1 = sizeof(block_q5_1); break;
        case GgmlType::Q4_K: z0 = offsetof(block_q4_K, qs); z1 = sizeof(block_q4_K); break;
        case GgmlType::Q5_K: z0 = offsetof(block_q5_K, qh); z1 = sizeof(block_q5_K); break;
        default: return {};
    }
    const size_t bs = traits(t).type_size;
    std::vector<uint8_t> v(row, row + row_bytes(t, K));
    for (size_t b = 0; b < v.size(); b += bs) std::fill(v.begin() + ptrdiff_t(b + z0), v.begin() + ptrdiff_t(b + z1), 0);
    return v;
}

// CPU product of rows [r0, r0 + n) and per row the sum of |w x| plus twice
// |offset x| (the scale of the float rounding both sides may make).
void cpu_rows(const GpuWeight& w, const std::vector<float>& x, int64_t r0, int64_t n, std::vector<float>& y,
              std::vector<double>& mag) {
    static ThreadPool pool(4);
    const size_t rb = row_bytes(w.type, w.K);
    y.assign(size_t(n), 0.f);
    cpu_matmul(w.type, w.gguf.data() + size_t(r0) * rb, w.K, n, x.data(), 1, y.data(), n, pool);
    mag.assign(size_t(n), 0.0);
    std::vector<float> row(size_t(w.K)), off(size_t(w.K), 0.f);
    for (int64_t i = 0; i < n; ++i) {
        const uint8_t* src = w.gguf.data() + size_t(r0 + i) * rb;
        dequantize_row(w.type, src, row.data(), w.K);
        const std::vector<uint8_t> o = offsets_only(w.type, src, w.K);
        if (!o.empty()) dequantize_row(w.type, o.data(), off.data(), w.K);
        double m = 0;
        for (int64_t k = 0; k < w.K; ++k)
            m += (std::fabs(double(row[size_t(k)])) + 2 * std::fabs(double(off[size_t(k)]))) * std::fabs(double(x[size_t(k)]));
        mag[size_t(i)] = m;
    }
}

// got (GPU, rows [r0, r0 + n) of an output of bias-added rows) against the CPU.
void expect_near_cpu(const std::vector<float>& got, const GpuWeight& w, const std::vector<float>& x,
                     const float* bias, int64_t r0, int64_t n, const char* what) {
    if (n == 0) return;
    std::vector<float> ref;
    std::vector<double> mag;
    cpu_rows(w, x, r0, n, ref, mag);
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 5; ++i) {
        const float g = got[size_t(r0 + i)];
        const double want = double(ref[size_t(i)]) + (bias ? double(bias[r0 + i]) : 0.0);
        if (!std::isfinite(g) || std::fabs(double(g) - want) > 3e-5 * mag[size_t(i)] + 1e-6 + (bias ? 1e-6 * std::fabs(want) : 0)) {
            ADD_FAILURE() << what << " " << type_name(w.type) << " K=" << w.K << " N=" << w.N << " row " << r0 + i
                          << ": gpu " << g << " cpu " << want << " (|w x| sum " << mag[size_t(i)] << ")";
            ++bad;
        }
    }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

size_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        if (std::memcmp(&a[i], &b[i], 4) != 0) return i;
    return a.size();
}

// The CPU reference itself on these random blocks (all quant bit patterns,
// unlike quantizer output): cpu_matmul against an f64 product of the same
// quantized operands, within the tolerance the GPU comparisons use. Runs
// without a GPU.
TEST(CudaMatvecReference, CpuProductOfRandomBlocksIsSound) {
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
        const int64_t K = 2560, N = 64;
        const GpuWeight w{t, K, N, random_blocks(t, N * K / int64_t(traits(t).block_size), 17), nullptr};
        const std::vector<float> x = random_x(K, 18);
        // the activations as the integer products see them
        const GgmlType at = traits(t).block_size == 256 ? GgmlType::Q8_K : GgmlType::Q8_0;
        std::vector<uint8_t> q(row_bytes(at, K));
        quantize_row(at, x.data(), q.data(), K);
        std::vector<float> a(static_cast<size_t>(K));
        dequantize_row(at, q.data(), a.data(), K);
        std::vector<float> y;
        std::vector<double> mag;
        cpu_rows(w, x, 0, N, y, mag);
        std::vector<float> row(static_cast<size_t>(K));
        for (int64_t n = 0; n < N; ++n) {
            dequantize_row(t, w.gguf.data() + size_t(n) * row_bytes(t, K), row.data(), K);
            double ref = 0;
            for (int64_t k = 0; k < K; ++k) ref += double(row[size_t(k)]) * double(a[size_t(k)]);
            ASSERT_NEAR(y[size_t(n)], ref, 3e-5 * mag[size_t(n)] + 1e-6) << type_name(t) << " row " << n;
        }
    }
}

// ---- single products (matmul_vec, T = 1)

class CudaMatvecTypes : public ::testing::TestWithParam<GgmlType> {};

TEST_P(CudaMatvecTypes, NewKernelEqualsOldBitsAndCpu) {
    REQUIRE_GPU();
    VariantGuard guard;
    const GgmlType t = GetParam();
    const bool kq = traits(t).block_size == 256;
    std::vector<int64_t> Ks = {256, 2560, 9216};
    if (!kq) Ks.insert(Ks.begin(), {32, 160, 1056});  // a lane or a few per row; 33 units: one lane twice
    for (int64_t K : Ks) {
        for (int64_t N : {int64_t(1), int64_t(37), int64_t(4097)}) {
            SCOPED_TRACE(testing::Message() << type_name(t) << " K=" << K << " N=" << N);
            const GpuWeight w = make_weight(t, K, N, uint64_t(K * 131 + N));
            ASSERT_NE(w.mem->p, nullptr);
            const std::vector<float> x = random_x(K, uint64_t(K + 7 * N));
            const GpuAct act = make_act(t, x);
            std::vector<float> bias(static_cast<size_t>(N));
            Rng r(uint64_t(N) + 5);
            for (float& b : bias) b = r.normal();
            DevBuf dbias(size_t(N) * 4);
            CU(cudaMemcpy(dbias.p, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
            const bool with_bias = N == 37;
            DevBuf y(size_t(N + 5) * 4);  // 5 floats past the end must stay poisoned
            std::vector<float> out[kKernels];
            for (int v : kKernelIds) {
                select_kernel(v);
                ASSERT_EQ(cuda::matvec_variant(), std::min(v, 3));
                poison(y);
                cuda::matmul_vec(w.dw(), act.a, 1, y.f(), N, with_bias ? dbias.f() : nullptr, nullptr);
                CU(cudaDeviceSynchronize());
                out[v] = get(y, size_t(N + 5));
                for (int64_t i = N; i < N + 5; ++i) {
                    uint32_t bits;
                    std::memcpy(&bits, &out[v][size_t(i)], 4);
                    ASSERT_EQ(bits, 0xFFFFFFFFu) << "variant " << v << " wrote past the output";
                }
                out[v].resize(size_t(N));
            }
            for (int v : {4, 5, 6, 7, 8, 2})
                ASSERT_TRUE(same_bits(out[3], out[v]))
                    << "v3 != " << kKernelNames[v] << " at row " << first_diff(out[3], out[v]);
            ASSERT_TRUE(same_bits(out[2], out[1])) << "v2 != v1 at row " << first_diff(out[2], out[1]);
            expect_near_cpu(out[3], w, x, with_bias ? bias.data() : nullptr, 0, N, "matmul_vec");
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMatvecTypes,
                         ::testing::Values(GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                           GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K),
                         [](const ::testing::TestParamInfo<GgmlType>& i) { return std::string(type_name(i.param)); });

// ---- several jobs in one launch (matmul_vec_multi, T = 1)

struct JobSpec {
    GgmlType type;
    int64_t N;
    bool bias, residual;
};

void run_batch(int64_t K, const std::vector<JobSpec>& specs, uint64_t seed) {
    const int n = int(specs.size());
    ASSERT_LE(n, cuda::kMaxMatvecJobs);
    std::vector<GpuWeight> ws;
    std::vector<std::vector<float>> bias(static_cast<size_t>(n)), res(static_cast<size_t>(n));
    std::vector<std::unique_ptr<DevBuf>> dy, dbias, dres, dres_out;
    const std::vector<float> x = random_x(K, seed);
    const GpuAct act = make_act(specs[0].type, x);
    cuda::MatvecJob jobs[cuda::kMaxMatvecJobs];
    for (int i = 0; i < n; ++i) {
        const JobSpec& s = specs[size_t(i)];
        ASSERT_EQ(act_kind(s.type), act_kind(specs[0].type)) << "a batch shares its activations";
        ws.push_back(make_weight(s.type, K, s.N, seed * 10 + uint64_t(i)));
        ASSERT_NE(ws.back().mem->p, nullptr);
        Rng r(seed + 100 + uint64_t(i));
        bias[size_t(i)].resize(size_t(s.N));
        res[size_t(i)].resize(size_t(s.N));
        for (float& b : bias[size_t(i)]) b = r.normal();
        for (float& v : res[size_t(i)]) v = 4.f * r.normal();
        dy.push_back(std::make_unique<DevBuf>(size_t(s.N) * 4));
        dbias.push_back(std::make_unique<DevBuf>(size_t(s.N) * 4));
        dres.push_back(std::make_unique<DevBuf>(size_t(s.N) * 4));
        dres_out.push_back(std::make_unique<DevBuf>(size_t(s.N) * 4));
        if (s.N > 0) {
            CU(cudaMemcpy(dbias.back()->p, bias[size_t(i)].data(), size_t(s.N) * 4, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(dres.back()->p, res[size_t(i)].data(), size_t(s.N) * 4, cudaMemcpyHostToDevice));
        }
        cuda::MatvecJob& j = jobs[i];
        j.w = ws.back().dw();
        j.y = dy.back()->f();
        j.ldy = s.N;
        j.bias = s.bias ? dbias.back()->f() : nullptr;
        if (s.residual) {
            j.res = dres.back()->f();
            j.res_out = dres_out.back()->f();
            j.ld_res = j.ld_res_out = s.N;
        }
    }
    std::vector<std::vector<float>> y[kKernels], ro[kKernels];
    for (int v : kKernelIds) {
        select_kernel(v);
        for (int i = 0; i < n; ++i) {
            poison(*dy[size_t(i)]);
            poison(*dres_out[size_t(i)]);
        }
        cuda::matmul_vec_multi(jobs, n, act.a, 1, nullptr);
        CU(cudaDeviceSynchronize());
        for (int i = 0; i < n; ++i) {
            y[v].push_back(get(*dy[size_t(i)], size_t(specs[size_t(i)].N)));
            ro[v].push_back(get(*dres_out[size_t(i)], size_t(specs[size_t(i)].N)));
        }
    }
    for (int i = 0; i < n; ++i) {
        const JobSpec& s = specs[size_t(i)];
        SCOPED_TRACE(testing::Message() << "job " << i << " " << type_name(s.type) << " N=" << s.N);
        for (int v : {4, 5, 6, 7, 8, 2, 1}) {
            EXPECT_TRUE(same_bits(y[3][size_t(i)], y[v][size_t(i)]))
                << "y: v3 != " << kKernelNames[v] << " at row " << first_diff(y[3][size_t(i)], y[v][size_t(i)]);
            if (s.residual) {
                EXPECT_TRUE(same_bits(ro[3][size_t(i)], ro[v][size_t(i)]))
                    << "res_out: v3 != " << kKernelNames[v] << " at row " << first_diff(ro[3][size_t(i)], ro[v][size_t(i)]);
            }
        }
        expect_near_cpu(y[3][size_t(i)], ws[size_t(i)], x, s.bias ? bias[size_t(i)].data() : nullptr, 0, s.N,
                        "matmul_vec_multi");
        for (int64_t r = 0; r < s.N; ++r) {
            const float yv = y[3][size_t(i)][size_t(r)], got = ro[3][size_t(i)][size_t(r)];
            if (s.residual) {
                const float want = res[size_t(i)][size_t(r)] + yv;
                ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "res_out row " << r << ": " << got << " vs " << want;
            } else {
                uint32_t bits;
                std::memcpy(&bits, &got, 4);
                ASSERT_EQ(bits, 0xFFFFFFFFu) << "res_out written without a residual, row " << r;
            }
        }
    }
}

TEST(CudaMatvecMulti, GateUpPairOneType) {
    REQUIRE_GPU();
    VariantGuard guard;
    run_batch(2560, {{GgmlType::Q4_K, 4097, false, false}, {GgmlType::Q4_K, 4097, false, true}}, 1);
}

TEST(CudaMatvecMulti, MixedKQuantsBiasResidual) {
    REQUIRE_GPU();
    VariantGuard guard;
    run_batch(2560,
              {{GgmlType::Q4_K, 300, true, false},
               {GgmlType::Q6_K, 1, false, true},
               {GgmlType::Q5_K, 4097, true, true},
               {GgmlType::Q4_K, 37, false, true}},
              2);
    run_batch(9216, {{GgmlType::Q6_K, 2560, false, true}, {GgmlType::Q4_K, 513, true, false}}, 3);
}

TEST(CudaMatvecMulti, LegacyTypes) {
    REQUIRE_GPU();
    VariantGuard guard;
    run_batch(1056,
              {{GgmlType::Q4_0, 129, true, false}, {GgmlType::Q8_0, 77, false, true}, {GgmlType::Q5_0, 513, false, false}},
              4);
    run_batch(4096, {{GgmlType::Q4_1, 1000, false, true}, {GgmlType::Q5_1, 33, true, true}}, 5);
}

TEST(CudaMatvecMulti, EmptyJobs) {
    REQUIRE_GPU();
    VariantGuard guard;
    run_batch(512,
              {{GgmlType::Q6_K, 0, false, false},
               {GgmlType::Q4_K, 50, false, true},
               {GgmlType::Q4_K, 0, true, false},
               {GgmlType::Q4_K, 3, true, true}},
              6);
    run_batch(512, {{GgmlType::Q4_K, 7, false, false}, {GgmlType::Q6_K, 0, false, false}, {GgmlType::Q4_K, 9, true, true}},
              7);
}

// A chain without host synchronization, as in a decode step: quantize (into
// one activation buffer), product with the residual epilogue (ping-pong
// accumulators), again with the other input. With programmatic dependent
// launch each kernel may start before the previous one ends; every product
// must still see its own activations and the previous sum.
TEST(CudaMatvecMulti, DependentChainWithoutSync) {
    REQUIRE_GPU();
    VariantGuard guard;
    const int64_t K = 2560, N = 4097;
    const GpuWeight w = make_weight(GgmlType::Q4_K, K, N, 31);
    ASSERT_NE(w.mem->p, nullptr);
    const std::vector<float> xs[2] = {random_x(K, 32), random_x(K, 33)};
    std::vector<float> yref[2];
    for (int i = 0; i < 2; ++i) {  // each input's product, on its own
        const GpuAct a = make_act(GgmlType::Q4_K, xs[i]);
        DevBuf y(size_t(N) * 4);
        cuda::matmul_vec(w.dw(), a.a, 1, y.f(), N, nullptr, nullptr);
        CU(cudaDeviceSynchronize());
        yref[i] = get(y, size_t(N));
    }
    const cuda::ActKind kind = act_kind(GgmlType::Q4_K);
    DevBuf x0(size_t(K) * 4), x1(size_t(K) * 4), buf(cuda::act_bytes(kind, K, 1)), y(size_t(N) * 4);
    DevBuf acc0(size_t(N) * 4), acc1(size_t(N) * 4);
    CU(cudaMemcpy(x0.p, xs[0].data(), size_t(K) * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(x1.p, xs[1].data(), size_t(K) * 4, cudaMemcpyHostToDevice));
    std::vector<float> acc(static_cast<size_t>(N));
    Rng r(34);
    for (float& v : acc) v = r.normal();
    CU(cudaMemcpy(acc0.p, acc.data(), size_t(N) * 4, cudaMemcpyHostToDevice));
    cudaStream_t s = nullptr;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const cuda::ActQ a = cuda::act_view(kind, buf.p, nullptr, K, 1);
    const int steps = 12;
    for (int i = 0; i < steps; ++i) {
        const DevBuf& xi = i % 2 ? x1 : x0;
        cuda::quantize_act(kind, xi.f(), K, K, 1, buf.p, s);
        cuda::MatvecJob j;
        j.w = w.dw();
        j.y = y.f();
        j.ldy = N;
        j.res = (i % 2 ? acc1 : acc0).f();
        j.res_out = (i % 2 ? acc0 : acc1).f();
        j.ld_res = j.ld_res_out = N;
        cuda::matmul_vec_multi(&j, 1, a, 1, s);
        for (int64_t n = 0; n < N; ++n) acc[size_t(n)] = acc[size_t(n)] + yref[i % 2][size_t(n)];
    }
    CU(cudaStreamSynchronize(s));
    CU(cudaStreamDestroy(s));
    const std::vector<float> got = get(steps % 2 ? acc1 : acc0, size_t(N));
    ASSERT_TRUE(same_bits(got, acc)) << "first difference at row " << first_diff(got, acc);
    ASSERT_TRUE(same_bits(get(y, size_t(N)), yref[(steps - 1) % 2]));
}

// A one-token conv riding in the products' epilogue (ConvAfter) against the
// products and then conv1d_silu: the same conv output, state and product
// outputs, bit for bit; the second of two jobs, a nonzero slot, K = 4 and 2.
TEST(CudaMatvecConvAfter, EqualsSeparateConv) {
    REQUIRE_GPU();
    VariantGuard guard;
    cuda::set_matvec_variant(3);
    const int64_t K = 2560, C = 1280;  // the conv channels are the second job's rows
    for (int ks : {4, 2}) {
        SCOPED_TRACE(testing::Message() << "kernel size " << ks);
        const GpuWeight w0 = make_weight(GgmlType::Q4_K, K, 300, 21), w1 = make_weight(GgmlType::Q6_K, K, C, 22);
        const GpuAct act = make_act(GgmlType::Q4_K, random_x(K, 23));
        const int n_slots = 3, slot = 2;
        std::vector<float> cw(size_t(ks * C)), st0(size_t((ks - 1) * C * n_slots));
        Rng r(24);
        for (float& v : cw) v = 0.5f * r.normal();
        for (float& v : st0) v = r.normal();
        DevBuf y0(300 * 4), y1(size_t(C) * 4), dcw(cw.size() * 4), state(st0.size() * 4), out(size_t(C) * 4),
            seg(sizeof(cuda::Segment));
        const cuda::Segment sg{0, 1, slot, 7};
        CU(cudaMemcpy(dcw.p, cw.data(), cw.size() * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(seg.p, &sg, sizeof sg, cudaMemcpyHostToDevice));
        cuda::MatvecJob jobs[2];
        jobs[0].w = w0.dw();
        jobs[0].y = y0.f();
        jobs[0].ldy = 300;
        jobs[1].w = w1.dw();
        jobs[1].y = y1.f();
        jobs[1].ldy = C;
        ASSERT_TRUE(cuda::conv_after_fits(jobs, 2, 1));
        std::vector<float> y[2], o[2], s[2];
        for (int fused : {0, 1}) {
            CU(cudaMemcpy(state.p, st0.data(), st0.size() * 4, cudaMemcpyHostToDevice));
            poison(out);
            poison(y1);
            jobs[1].conv = fused ? cuda::ConvAfter{dcw.f(), ks, state.f(), static_cast<const cuda::Segment*>(seg.p),
                                                   out.f()}
                                 : cuda::ConvAfter{};
            cuda::matmul_vec_multi(jobs, 2, act.a, 1, nullptr);
            if (!fused)
                cuda::conv1d_silu(y1.f(), C, dcw.f(), ks, C, state.f(), n_slots,
                                  static_cast<const cuda::Segment*>(seg.p), 1, 1, out.f(), C, nullptr);
            CU(cudaDeviceSynchronize());
            y[fused] = get(y1, size_t(C));
            o[fused] = get(out, size_t(C));
            s[fused] = get(state, st0.size());
        }
        EXPECT_TRUE(same_bits(y[0], y[1])) << "product output at " << first_diff(y[0], y[1]);
        EXPECT_TRUE(same_bits(o[0], o[1])) << "conv output at " << first_diff(o[0], o[1]);
        EXPECT_TRUE(same_bits(s[0], s[1])) << "conv state at " << first_diff(s[0], s[1]);
        EXPECT_FALSE(same_bits(s[0], st0)) << "the state did not move";
    }
    cuda::set_matvec_variant(2);
    cuda::MatvecJob j;
    const GpuWeight w = make_weight(GgmlType::Q4_K, 256, 256, 1);
    j.w = w.dw();
    EXPECT_FALSE(cuda::conv_after_fits(&j, 1, 1)) << "v2 has no conv epilogue";
}

// The LM head shape (Qwen3.5-4B): Q6_K, 2560 x 248320, 521 MB. The default
// (3) times one and four rows per warp at its first call and keeps the faster:
// both, forced, give the same bits as the one-row kernel.
TEST(CudaMatvecLarge, Q6KHeadEqualsOldKernel) {
    REQUIRE_GPU();
    VariantGuard guard;
    const int64_t K = 2560, N = 248320;
    const GpuWeight w = make_weight(GgmlType::Q6_K, K, N, 99);
    if (!w.mem->p) GTEST_SKIP() << "not enough GPU memory";
    const std::vector<float> x = random_x(K, 98);
    const GpuAct act = make_act(GgmlType::Q6_K, x);
    DevBuf y(size_t(N) * 4);
    std::vector<float> out[kKernels];
    for (int v : {3, 2, 6, 8}) {  // tuned, v2, R = 4, R = 1 with four steps
        select_kernel(v);
        poison(y);
        cuda::matmul_vec(w.dw(), act.a, 1, y.f(), N, nullptr, nullptr);
        CU(cudaDeviceSynchronize());
        out[v] = get(y, size_t(N));
    }
    for (int v : {3, 6, 8})
        ASSERT_TRUE(same_bits(out[v], out[2])) << "kernel " << v << " != v2 at row " << first_diff(out[v], out[2]);
    expect_near_cpu(out[3], w, x, nullptr, 0, 3000, "head");
    expect_near_cpu(out[3], w, x, nullptr, N / 2 - 1500, 3000, "head");
    expect_near_cpu(out[3], w, x, nullptr, N - 3000, 3000, "head");
}

// ---- timing (printed, not asserted)

// Runs `launch(copy)` 200 times over enough copies of the weights that they do
// not stay in L2 (50 MB on an H100 / H200), returns microseconds per call.
// Back to back, so v3 (started with programmatic dependent launch on sm_90)
// overlaps each call's start with the previous one's end, as in a decode step;
// QINFER_CUDA_PDL=0 times the kernels one after the other.
template <class F>
double time_calls(int copies, F&& launch) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < 10; ++i) launch(i % copies);
    cudaEventRecord(a);
    const int reps = 200;
    for (int i = 0; i < reps; ++i) launch(i % copies);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 1000.0 * ms / reps;
}

struct TimedCase {
    const char* name;
    int64_t K;
    std::vector<std::pair<GgmlType, int64_t>> jobs;  // one job: matmul_vec, else matmul_vec_multi
};

TEST(CudaMatvecTiming, PrintsBandwidthNewVsOld) {
    REQUIRE_GPU();
    VariantGuard guard;
    const TimedCase cases[] = {
        {"ffn gate+up Q4_K 2560 x 2*9216 (two jobs)", 2560, {{GgmlType::Q4_K, 9216}, {GgmlType::Q4_K, 9216}}},
        {"ffn down Q6_K 9216 x 2560", 9216, {{GgmlType::Q6_K, 2560}}},
        {"proj Q4_K 2560 x 4096", 2560, {{GgmlType::Q4_K, 4096}}},
        {"ssm_out Q4_K 4096 x 2560", 4096, {{GgmlType::Q4_K, 2560}}},
        {"deltanet in Q4_K 2560 x 8192+4096+32+32", 2560,
         {{GgmlType::Q4_K, 8192}, {GgmlType::Q4_K, 4096}, {GgmlType::Q4_K, 32}, {GgmlType::Q4_K, 32}}},
        {"mixed Q4_K 2560 x 4096+1024, Q6_K x 1024", 2560,
         {{GgmlType::Q4_K, 4096}, {GgmlType::Q4_K, 1024}, {GgmlType::Q6_K, 1024}}},
        {"lm head Q6_K 2560 x 248320", 2560, {{GgmlType::Q6_K, 248320}}},
    };
    for (const TimedCase& c : cases) {
        const int nj = int(c.jobs.size());
        double bytes = 0;
        for (const auto& [t, n] : c.jobs) bytes += double(n) * double(row_bytes(t, c.K));
        const int copies = int(std::max(1.0, std::ceil(256e6 / bytes)));
        std::vector<GpuWeight> ws;  // copy c, job j at c * nj + j
        for (int i = 0; i < copies * nj; ++i) {
            const auto [t, n] = c.jobs[size_t(i % nj)];
            if (i < nj) {
                ws.push_back(make_weight(t, c.K, n, 500 + uint64_t(i)));
            } else {  // device copies of the first ones: same data, other addresses
                const GpuWeight& src = ws[size_t(i % nj)];
                GpuWeight w{t, c.K, n, {}, std::make_unique<DevBuf>(src.mem->n)};
                if (w.mem->p) {
                    CU(cudaMemcpy(w.mem->p, src.mem->p, src.mem->n, cudaMemcpyDeviceToDevice));
                }
                ws.push_back(std::move(w));
            }
            if (!ws.back().mem->p) GTEST_SKIP() << "not enough GPU memory for " << c.name;
        }
        const GpuAct act = make_act(c.jobs[0].first, random_x(c.K, 77));
        std::vector<std::unique_ptr<DevBuf>> ys;
        for (const auto& job : c.jobs) ys.push_back(std::make_unique<DevBuf>(size_t(job.second) * 4));
        auto launch_copy = [&](int copy) {
            if (nj == 1) {
                cuda::matmul_vec(ws[size_t(copy)].dw(), act.a, 1, ys[0]->f(), c.jobs[0].second, nullptr, nullptr);
            } else {
                cuda::MatvecJob jobs[cuda::kMaxMatvecJobs];
                for (int j = 0; j < nj; ++j) {
                    jobs[j].w = ws[size_t(copy * nj + j)].dw();
                    jobs[j].y = ys[size_t(j)]->f();
                    jobs[j].ldy = c.jobs[size_t(j)].second;
                }
                cuda::matmul_vec_multi(jobs, nj, act.a, 1, nullptr);
            }
        };
        double us[kKernels] = {};
        for (int v : {3, 4, 5, 6, 8, 2}) {
            select_kernel(v);
            us[v] = time_calls(copies, launch_copy);
            CU(cudaGetLastError());
        }
        // v3 once more with one copy, its weights in L2 (up to ~50 MB): what a
        // product costs when the bytes are not what it waits for
        select_kernel(3);
        const double hot = time_calls(1, launch_copy);
        CU(cudaGetLastError());
        std::printf("[ timing ] %-42s %6.1f MB: v3 %7.2f us %5.0f GB/s | R=1 %7.2f us %5.0f | R=2 %7.2f us %5.0f | "
                    "R=4 %7.2f us %5.0f | R=1 S=4 %7.2f us %5.0f | v2 %7.2f us %5.0f | v3 L2-hot %7.2f us %5.0f "
                    "(%d weight copies, 200 back-to-back launches)\n",
                    c.name, bytes / 1e6, us[3], bytes / us[3] / 1e3, us[4], bytes / us[4] / 1e3, us[5],
                    bytes / us[5] / 1e3, us[6], bytes / us[6] / 1e3, us[8], bytes / us[8] / 1e3, us[2],
                    bytes / us[2] / 1e3, hot, bytes / hot / 1e3, copies);
        std::fflush(stdout);
    }
}

#else

TEST(CudaMatvec, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace qinfer
