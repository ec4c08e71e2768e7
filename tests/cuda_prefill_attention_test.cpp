// Prompt attention on the tensor cores (cuda::attention_prefill) against a
// double-precision reference: every head dim and group it covers, segments of
// lengths around its token tiles, at the start of a sequence and after a cached
// prefix, several segments of different slots in one call; the cases it
// declines; and its time next to the one-pass kernel at the Qwen3.5-4B shape
// (printed). Skipped when there is no GPU.
//
// Tolerance: Q (scaled) and P are rounded to f16 (relative 2^-11 ~ 4.9e-4
// each) with f32 accumulation; a score of a few units then moves by ~1e-3 and a
// softmax weight by as much relatively, so the error is ~1e-3 of the V values
// (at most ~1e-3 relative to 1 + max |ref|, mostly less as the errors average
// over keys). kTol = 5e-3 leaves a 5x margin; a wrong mask, scale, fragment
// or row mapping gives errors of order 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/fp16.h"
#include "runtime/backend.h"
#include "cuda_testutil.h"

#ifdef QINFER_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda_attention_testutil.h"
#include "runtime/cuda/kernels.h"
#endif

namespace qinfer {
namespace {

#ifdef QINFER_HAVE_CUDA
using test::randn;

#define CU(call) ASSERT_EQ((call), cudaSuccess) << #call

constexpr double kTol = 5e-3;

using Cache = test::KvTestCache;
using test::Dev;
using test::kNaN;
using test::ref_attention;

// Compares got with ref over the listed tokens (all when empty): every value
// finite and max |ref - got| <= tol (1 + max |ref|). The message names the worst
// and the first bad element as (token, head, e).
::testing::AssertionResult close_to(const std::vector<float>& ref, const std::vector<float>& got, int64_t n_head,
                                    int64_t d, double tol, const std::vector<int64_t>& tokens = {}) {
    const int64_t row = n_head * d, T = int64_t(ref.size()) / row;
    std::vector<int64_t> ts = tokens;
    if (ts.empty())
        for (int64_t t = 0; t < T; ++t) ts.push_back(t);
    auto where = [&](size_t i) {
        std::ostringstream os;
        os << "(token " << int64_t(i) / row << ", head " << (int64_t(i) / d) % n_head << ", e " << int64_t(i) % d
           << ": got " << got[i] << ", ref " << ref[i] << ")";
        return os.str();
    };
    double max_ref = 0, max_err = 0;
    size_t worst = 0, n_bad_value = 0, first_nonfinite = SIZE_MAX;
    for (int64_t t : ts)
        for (size_t i = size_t(t * row); i < size_t((t + 1) * row); ++i) {
            max_ref = std::max(max_ref, double(std::fabs(ref[i])));
            if (!std::isfinite(got[i])) {
                if (n_bad_value++ == 0) first_nonfinite = i;
                continue;
            }
            const double err = std::fabs(double(ref[i]) - double(got[i]));
            if (err > max_err) {
                max_err = err;
                worst = i;
            }
        }
    const double bound = tol * (1.0 + max_ref);
    size_t first_bad = SIZE_MAX, n_bad = 0;
    for (int64_t t : ts)
        for (size_t i = size_t(t * row); i < size_t((t + 1) * row); ++i)
            if (std::isfinite(got[i]) && std::fabs(double(ref[i]) - double(got[i])) > bound && n_bad++ == 0)
                first_bad = i;
    if (n_bad_value == 0 && n_bad == 0)
        return ::testing::AssertionSuccess() << "max error " << max_err / (1.0 + max_ref) << " relative";
    auto r = ::testing::AssertionFailure();
    if (n_bad_value) r << n_bad_value << " non-finite values, the first at " << where(first_nonfinite) << "; ";
    r << "max error " << max_err / (1.0 + max_ref) << " relative to 1 + max|ref| = " << 1.0 + max_ref
      << " (bound " << tol << ") at " << where(worst);
    if (n_bad) r << "; " << n_bad << " values over the bound, the first at " << where(first_bad);
    return r;
}

// One attention_prefill call over the given segments (batch order), the output
// poisoned first. q goes to the device with row strides that leave NaN gaps
// (q_h = d + 4, q_t = n_head (d + 4) + 12), so a read outside a row shows.
struct PrefillRun {
    const Cache& c;
    int64_t n_head, T = 0;
    std::vector<cuda::Segment> segs;
    std::vector<int32_t> pos, slot;  // per token, for the reference
    int64_t q_h, q_t;
    Dev dq, dout, dseg;
    PrefillRun(const Cache& c_, int64_t n_head_, const std::vector<cuda::Segment>& s)
        : c(c_), n_head(n_head_), segs(s), q_h(c.d + 4), q_t(n_head * (c.d + 4) + 12), dq(bytes_q(c_, n_head_, s)),
          dout(size_t(count(s) * n_head * c.d) * 4), dseg(s.size() * sizeof(cuda::Segment)) {
        for (const cuda::Segment& sg : segs)
            for (int32_t i = 0; i < sg.count; ++i) {
                pos.push_back(sg.pos0 + i);
                slot.push_back(sg.slot);
            }
        T = int64_t(pos.size());
        cudaMemcpy(dseg.p, segs.data(), segs.size() * sizeof(cuda::Segment), cudaMemcpyHostToDevice);
    }
    static int64_t count(const std::vector<cuda::Segment>& s) {
        int64_t n = 0;
        for (const auto& x : s) n += x.count;
        return n;
    }
    static size_t bytes_q(const Cache& c, int64_t n_head, const std::vector<cuda::Segment>& s) {
        return size_t(count(s) * (n_head * (c.d + 4) + 12)) * 4;
    }
    cuda::Rows q_rows() const {
        cuda::Rows r;
        r.data = dq.as<float>();
        r.n = c.d;
        r.n1 = n_head;
        r.n2 = T;
        r.s1 = q_h;
        r.s2 = q_t;
        return r;
    }
    void upload_q(const std::vector<float>& q) const {  // q [T][n_head][d]
        std::vector<float> strided(dq.bytes / 4, kNaN);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < n_head; ++h)
                std::copy_n(&q[size_t((t * n_head + h) * c.d)], c.d, &strided[size_t(t * q_t + h * q_h)]);
        EXPECT_EQ(cudaMemcpy(dq.p, strided.data(), strided.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
    bool launch(float scale, cudaStream_t s = nullptr) const {
        return cuda::attention_prefill(q_rows(), c.view(), dseg.as<cuda::Segment>(), int(segs.size()), T, scale,
                                       dout.as<float>(), s);
    }
    std::vector<float> run(const std::vector<float>& q, float scale) {
        upload_q(q);
        EXPECT_EQ(cudaMemset(dout.p, 0xFF, dout.bytes), cudaSuccess);
        EXPECT_TRUE(launch(scale)) << "attention_prefill declined d " << c.d << " group " << n_head / c.n_kv;
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> out(size_t(T * n_head * c.d));
        EXPECT_EQ(cudaMemcpy(out.data(), dout.p, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        return out;
    }
};

struct Shape {
    int64_t d, group;
    GgmlType kv = GgmlType::F16;  // q8_0: dequantized to f16 as the tiles are staged
};
[[maybe_unused]] void PrintTo(const Shape& s, std::ostream* os) {
    *os << "d=" << s.d << " group=" << s.group << " cache " << type_name(s.kv);
}

class CudaPrefillAttention : public ::testing::TestWithParam<Shape> {};

// One segment of lengths around the token tiles (64 / group tokens) and the
// key tiles, at position 0 and after 1000 cached keys, in one of three slots.
TEST_P(CudaPrefillAttention, OneSegmentMatchesReference) {
    REQUIRE_GPU();
    const Shape sh = GetParam();
    const int64_t n_kv = 2, n_head = n_kv * sh.group;
    const float scale = 1.f / std::sqrt(float(sh.d));
    Cache c(sh.d, n_kv, 2048, 3, sh.kv);
    ASSERT_TRUE(c.dk.p && c.dv.p);
    uint32_t seed = 100 + uint32_t(sh.d * 10 + sh.group);
    for (int32_t pos0 : {0, 1000})
        for (int32_t count : {1, 15, 16, 17, 63, 64, 65, 300}) {
            const int32_t s = count % 3;
            c.fill(s, pos0 + count, seed++);
            PrefillRun r(c, n_head, {{0, count, s, pos0}});
            ASSERT_TRUE(r.dq.p && r.dout.p && r.dseg.p);
            // q of scale 3 on odd lengths: peaked softmax, the running max moves
            const std::vector<float> q = randn(size_t(count * n_head * sh.d), seed++, count % 2 ? 3.f : 1.f);
            const std::vector<float> got = r.run(q, scale);
            EXPECT_TRUE(close_to(ref_attention(c, q, n_head, r.pos, r.slot, scale), got, n_head, sh.d, kTol))
                << "d " << sh.d << " group " << sh.group << ": segment of " << count << " tokens at pos0 " << pos0
                << " in slot " << s;
        }
}

// Several sequences in one step: segments in three slots with different
// lengths and prefixes, a one-token one among them, and one that ends on the
// last position of the cache (2040: not a multiple of any key tile, so the last
// tile reaches past the slot). Twice: the result must be the same bits.
TEST_P(CudaPrefillAttention, SeveralSegmentsInOneCall) {
    REQUIRE_GPU();
    const Shape sh = GetParam();
    const int64_t n_kv = 2, n_head = n_kv * sh.group, n_ctx = 2040;
    const float scale = 1.f / std::sqrt(float(sh.d));
    Cache c(sh.d, n_kv, n_ctx, 3, sh.kv);
    ASSERT_TRUE(c.dk.p && c.dv.p);
    uint32_t seed = 7000 + uint32_t(sh.d * 10 + sh.group);
    const std::vector<std::vector<cuda::Segment>> calls = {
        {{0, 100, 1, 500}, {100, 1, 0, 0}, {101, 70, 2, 37}},
        {{0, 33, 0, 5}, {33, 1, 1, 1234}, {34, 33, 2, int32_t(n_ctx - 33)}},
    };
    for (const auto& segs : calls) {
        for (const cuda::Segment& sg : segs) c.fill(sg.slot, sg.pos0 + sg.count, seed++);
        PrefillRun r(c, n_head, segs);
        ASSERT_TRUE(r.dq.p && r.dout.p && r.dseg.p);
        const std::vector<float> q = randn(size_t(r.T * n_head * sh.d), seed++, 2.f);
        const std::vector<float> got = r.run(q, scale);
        EXPECT_TRUE(close_to(ref_attention(c, q, n_head, r.pos, r.slot, scale), got, n_head, sh.d, kTol))
            << "d " << sh.d << " group " << sh.group << ": " << segs.size() << " segments, " << r.T << " tokens";
        const std::vector<float> again = r.run(q, scale);
        EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * 4), 0) << "two runs of the same step differ";
    }
}

std::vector<Shape> shapes() {
    std::vector<Shape> v;
    for (int64_t d : {64, 128, 256})
        for (int64_t g : {1, 2, 4, 8}) v.push_back({d, g});
    for (int64_t d : {64, 128, 256})
        for (int64_t g : {2, 8}) v.push_back({d, g, GgmlType::Q8_0});
    return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaPrefillAttention, ::testing::ValuesIn(shapes()),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                             char name[40];
                             std::snprintf(name, sizeof name, "d%d_g%d%s", int(i.param.d), int(i.param.group),
                                           i.param.kv == GgmlType::Q8_0 ? "_q8_0" : "");
                             return std::string(name);
                         });

// What it does not cover it declines without launching anything: the output
// stays poisoned and no error is pending.
TEST(CudaPrefillAttentionDeclines, F32CacheOddHeadDimAndGroups) {
    REQUIRE_GPU();
    struct Case {
        int64_t d, n_kv, n_head;
        GgmlType kv;
        const char* what;
    };
    const Case cases[] = {
        {128, 2, 8, GgmlType::F32, "f32 cache"},
        {96, 2, 8, GgmlType::F16, "head dim 96"},
        {128, 2, 6, GgmlType::F16, "group 3"},
        {128, 2, 32, GgmlType::F16, "group 16"},
    };
    for (const Case& k : cases) {
        Cache c(k.d, k.n_kv, 64, 1, k.kv);
        ASSERT_TRUE(c.dk.p && c.dv.p);
        c.fill(0, 20, 5);
        PrefillRun r(c, k.n_head, {{0, 20, 0, 0}});
        ASSERT_TRUE(r.dq.p && r.dout.p && r.dseg.p);
        r.upload_q(randn(size_t(r.T * k.n_head * k.d), 6));
        CU(cudaMemset(r.dout.p, 0xFF, r.dout.bytes));
        EXPECT_FALSE(r.launch(0.1f)) << k.what;
        CU(cudaDeviceSynchronize());
        CU(cudaGetLastError());
        std::vector<uint8_t> out(r.dout.bytes);
        CU(cudaMemcpy(out.data(), r.dout.p, out.size(), cudaMemcpyDeviceToHost));
        EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0xFF; }))
            << k.what << ": the output was written";
    }
}

// Median of `reps` single launches, each timed with its own events, in microseconds.
template <typename F> double median_us(F fn, int reps = 20) {
    fn();  // warm-up
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<double> us;
    for (int i = 0; i < reps; ++i) {
        cudaEventRecord(e0);
        fn();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        us.push_back(double(ms) * 1000.0);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}

// Qwen3.5-4B's full-attention layer in the last 512-token step of a 4096-token
// prompt: 16 q / 4 kv heads, d 256, f16 and q8_0 caches of 4096. The tensor-core kernel
// next to the one-pass kernel (cuda::attention with max_seg_len 512); both
// checked against each other and, on a few tokens, against the reference.
TEST(CudaPrefillAttentionTiming, Qwen35LastChunkOf4096) {
    REQUIRE_GPU();
    const int64_t d = 256, n_kv = 4, n_head = 16, n_ctx = 4096, T = 512;
    const int32_t pos0 = 3584;
    const float scale = 1.f / 16.f;
    for (GgmlType kv : {GgmlType::F16, GgmlType::Q8_0}) {
        Cache c(d, n_kv, n_ctx, 1, kv);
        ASSERT_TRUE(c.dk.p && c.dv.p);
        c.fill(0, n_ctx, 11);
        PrefillRun r(c, n_head, {{0, int32_t(T), 0, pos0}});
        ASSERT_TRUE(r.dq.p && r.dout.p && r.dseg.p);
        const std::vector<float> q = randn(size_t(T * n_head * d), 12, 2.f);
        const std::vector<float> got = r.run(q, scale);

        ASSERT_EQ(cuda::attention_work_bytes(T, n_head, d, n_ctx, int(T)), 0u) << "one-pass kernel expected";
        Dev dpos(size_t(T) * 4), dslot(size_t(T) * 4), dout1(size_t(T * n_head * d) * 4);
        ASSERT_TRUE(dpos.p && dslot.p && dout1.p);
        CU(cudaMemcpy(dpos.p, r.pos.data(), size_t(T) * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dslot.p, r.slot.data(), size_t(T) * 4, cudaMemcpyHostToDevice));
        auto one_pass = [&] {
            cuda::attention(r.q_rows(), c.view(), dpos.as<int32_t>(), dslot.as<int32_t>(), T, scale,
                            dout1.as<float>(), nullptr, int(T), nullptr);
        };
        CU(cudaMemset(dout1.p, 0xFF, dout1.bytes));
        one_pass();
        CU(cudaDeviceSynchronize());
        std::vector<float> base(size_t(T * n_head * d));
        CU(cudaMemcpy(base.data(), dout1.p, base.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_TRUE(close_to(base, got, n_head, d, kTol)) << type_name(kv) << ": tensor-core vs one-pass kernel";
        const std::vector<int64_t> some = {0, 1, 15, 16, 255, 511};
        EXPECT_TRUE(close_to(ref_attention(c, q, n_head, r.pos, r.slot, scale, some), got, n_head, d, kTol, some))
            << type_name(kv) << ": tensor-core vs reference";

        const double us_tc = median_us([&] { r.launch(scale); });
        CU(cudaGetLastError());
        const double us_one = median_us(one_pass);
        CU(cudaGetLastError());
        double flops = 0;  // QK^T and PV over the keys each token sees
        for (int64_t t = 0; t < T; ++t) flops += double(pos0 + t + 1) * double(n_head) * double(d) * 4.0;
        std::printf("[ prefill attention ] 16 q / 4 kv heads, d 256, %s, 512 tokens at 3584: tensor cores %.1f us "
                    "(%.0f TFLOP/s), one-pass kernel %.1f us (%.0f TFLOP/s), %.1fx (median of 20)\n",
                    type_name(kv), us_tc, flops / (us_tc * 1e6), us_one, flops / (us_one * 1e6), us_one / us_tc);
    }
}

#else
TEST(CudaPrefillAttention, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif

}  // namespace
}  // namespace qinfer
