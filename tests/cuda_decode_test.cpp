// The small kernels of a decode step, called directly: argmax over the logits
// (one row spread over a cluster of blocks) and attention over the KV cache at
// short and long contexts inside a large capacity (the launch depends on the
// capacity, the work on the length read from the device). Checked against
// references in this file, repeatedly on the same buffers and through a
// replayed CUDA graph, as the decode loop uses them; timings are printed for
// the GPU runs. Skipped when there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
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

using test::randn;


#ifdef QINFER_HAVE_CUDA
#define CU(call) ASSERT_EQ((call), cudaSuccess) << #call

constexpr float kInf = std::numeric_limits<float>::infinity();
using test::kNaN;

using test::Dev;

// The argmax the decode step must reproduce: the first maximum; NaN never wins;
// an all -inf row gives its first index, an all-NaN or empty row 0.
int32_t ref_argmax(const float* v, int64_t n) {
    float best = -kInf;
    int64_t bi = -1;
    for (int64_t i = 0; i < n; ++i)
        if (v[i] > best || (v[i] == best && bi < 0)) {
            best = v[i];
            bi = i;
        }
    return int32_t(bi < 0 ? 0 : bi);
}

// Runs argmax_rows over T rows of n (row stride ld), placed `off` floats into
// the device buffer (so rows start at any 4-byte offset), and returns the ids.
std::vector<int32_t> gpu_argmax(const std::vector<float>& rows, int64_t ld, int64_t n, int64_t T, Dev& dl, Dev& di,
                                int64_t off = 0, cudaStream_t s = nullptr) {
    EXPECT_LE((rows.size() + size_t(off)) * 4, dl.bytes);
    EXPECT_EQ(cudaMemcpy(dl.as<float>() + off, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemset(di.p, 0x7f, size_t(T) * 4), cudaSuccess);  // poison
    cuda::argmax_rows(dl.as<float>() + off, ld, n, T, di.as<int32_t>(), s);
    std::vector<int32_t> ids(size_t(T), -1);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ids.data(), di.p, size_t(T) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return ids;
}

// Cluster caps the tests run under: the auto choice (16 blocks on an H200) and
// one block per row (older GPUs), and a small cluster.
const int kCaps[] = {0, 1, 4};

struct ArgmaxCap {
    explicit ArgmaxCap(int c) { cuda::set_argmax_cluster(c); }
    ~ArgmaxCap() { cuda::set_argmax_cluster(0); }
};

TEST(CudaDecodeArgmax, MatchesCpuOnOddLengthsAndStrides) {
    REQUIRE_GPU();
    const int64_t kMaxN = 248320 + 7, T = 3;
    Dev dl(size_t(kMaxN + 3) * size_t(T) * 4), di(64);
    ASSERT_TRUE(dl.p && di.p);
    uint32_t seed = 1;
    for (int cap : kCaps) {
        ArgmaxCap c(cap);
        for (int64_t n : {1, 2, 3, 4, 5, 31, 64, 1025, 4097, 65537, 248320}) {
            for (int64_t pad : {0, 1, 3}) {  // row starts at every 4-byte offset of a 16-byte line
                const int64_t ld = n + pad;
                std::vector<float> rows = randn(size_t(ld * T), seed++, 3.f);
                const std::vector<int32_t> got = gpu_argmax(rows, ld, n, T, dl, di);
                for (int64_t t = 0; t < T; ++t)
                    EXPECT_EQ(got[size_t(t)], int32_t(std::max_element(&rows[size_t(t * ld)], &rows[size_t(t * ld + n)]) -
                                                      &rows[size_t(t * ld)]))
                        << "cap " << cap << " n " << n << " ld " << ld << " row " << t;
            }
        }
    }
}

TEST(CudaDecodeArgmax, FirstOfTiesWinsEverywhere) {
    REQUIRE_GPU();
    const int64_t n = 248320;
    Dev dl(size_t(n + 3) * 4), di(64);
    ASSERT_TRUE(dl.p && di.p);
    // Tie sets: the first element lies in every block's slice of a 16-block
    // split, at slice edges, in the unaligned head and the tail.
    std::vector<std::vector<int64_t>> ties = {{0, n - 1}, {n - 1}, {1, 2}, {n - 2, n - 1}, {n / 2, n / 2 + 1}};
    for (int k = 1; k < 16; ++k) {
        const int64_t edge = n * k / 16;
        ties.push_back({edge - 1, edge, n - 1});
        ties.push_back({edge, edge + 1});
        ties.push_back({edge + 3, 0 + n - 4});
    }
    for (int cap : kCaps) {
        ArgmaxCap c(cap);
        for (int64_t off : {0, 1, 2, 3}) {  // aligned and misaligned rows
            for (const auto& tie : ties) {
                std::vector<float> row = randn(size_t(n), 7, 1.f);
                for (int64_t i : tie) row[size_t(i)] = 42.f;
                const std::vector<int32_t> got = gpu_argmax(row, n, n, 1, dl, di, off);
                EXPECT_EQ(got[0], int32_t(tie[0])) << "cap " << cap << " off " << off << " first tie " << tie[0];
            }
        }
        // +0 and -0 compare equal: the first of them wins, whichever its sign
        for (bool neg_first : {false, true}) {
            std::vector<float> row(size_t(n), -1.f);
            row[1000] = neg_first ? -0.f : 0.f;
            row[200000] = neg_first ? 0.f : -0.f;
            EXPECT_EQ(gpu_argmax(row, n, n, 1, dl, di)[0], 1000) << "cap " << cap;
        }
    }
}

TEST(CudaDecodeArgmax, InfinitiesNaNsAndSeveralRows) {
    REQUIRE_GPU();
    const int64_t n = 70001, T = 9;
    Dev dl(size_t(n * T) * 4), di(64);
    ASSERT_TRUE(dl.p && di.p);
    std::vector<float> rows = randn(size_t(n * T), 11, 2.f);
    auto row = [&](int64_t t) { return &rows[size_t(t * n)]; };
    std::fill(row(0), row(0) + n, -kInf);                     // all -inf: 0
    std::fill(row(1), row(1) + n, -kInf);
    row(1)[0] = kNaN;                                         // NaN first, then -inf: 1
    std::fill(row(2), row(2) + n, kNaN);                      // all NaN: 0
    for (int64_t i = 0; i < n; i += 3) row(3)[i] = kNaN;      // NaNs never win
    row(3)[50000] = 100.f;
    row(4)[60000] = kInf;                                     // +inf, twice: the first
    row(4)[60001] = kInf;
    row(4)[5] = kNaN;
    std::fill(row(5), row(5) + n, 0.f);                       // all equal: 0
    row(6)[n - 1] = 1e30f;                                    // last element
    row(7)[0] = 1e30f;                                        // first element
    for (int cap : kCaps) {
        ArgmaxCap c(cap);
        const std::vector<int32_t> got = gpu_argmax(rows, n, n, T, dl, di);
        for (int64_t t = 0; t < T; ++t) EXPECT_EQ(got[size_t(t)], ref_argmax(row(t), n)) << "cap " << cap << " row " << t;
        EXPECT_EQ(got[0], 0);
        EXPECT_EQ(got[1], 1);
        EXPECT_EQ(got[2], 0);
        EXPECT_EQ(got[3], 50000);
        EXPECT_EQ(got[4], 60000);
        EXPECT_EQ(got[5], 0);
        EXPECT_EQ(got[6], n - 1);
        EXPECT_EQ(got[7], 0);
    }
    // zero-length rows: id 0
    EXPECT_EQ(gpu_argmax(rows, n, 0, 2, dl, di), (std::vector<int32_t>{0, 0}));
}

TEST(CudaDecodeArgmax, RepeatedCallsAndGraphReplay) {
    REQUIRE_GPU();
    const int64_t n = 248320, T = 2;
    Dev dl(size_t(n * T) * 4), di(64);
    ASSERT_TRUE(dl.p && di.p);
    // the same buffers over and over, new data each time
    for (int it = 0; it < 40; ++it) {
        std::vector<float> rows = randn(size_t(n * T), 100 + uint32_t(it));
        rows[size_t((it * 7919) % (n * T))] = 10.f + float(it);
        const std::vector<int32_t> got = gpu_argmax(rows, n, n, T, dl, di);
        for (int64_t t = 0; t < T; ++t) ASSERT_EQ(got[size_t(t)], ref_argmax(&rows[size_t(t * n)], n)) << "call " << it;
    }
    // captured once, replayed with new logits written between replays
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cuda::argmax_rows(dl.as<float>(), n, n, T, di.as<int32_t>(), s);
    CU(cudaStreamEndCapture(s, &graph));
    CU(cudaGraphInstantiate(&exec, graph, 0));
    for (int it = 0; it < 40; ++it) {
        std::vector<float> rows = randn(size_t(n * T), 500 + uint32_t(it));
        if (it % 3 == 0) rows[size_t(n + (it * 104729) % n)] = rows[size_t(n + (it * 7) % n)] = 99.f;  // a tie
        CU(cudaMemcpyAsync(dl.p, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice, s));
        CU(cudaMemsetAsync(di.p, 0x7f, size_t(T) * 4, s));
        CU(cudaGraphLaunch(exec, s));
        std::vector<int32_t> got(static_cast<size_t>(T));
        CU(cudaMemcpyAsync(got.data(), di.p, size_t(T) * 4, cudaMemcpyDeviceToHost, s));
        CU(cudaStreamSynchronize(s));
        for (int64_t t = 0; t < T; ++t) ASSERT_EQ(got[size_t(t)], ref_argmax(&rows[size_t(t * n)], n)) << "replay " << it;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
}

// Mean time of `reps` calls of fn on the default stream, in microseconds.
template <typename F> double time_us(F fn, int reps = 200) {
    fn();  // warm-up
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int i = 0; i < reps; ++i) fn();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return double(ms) * 1000.0 / reps;
}

TEST(CudaDecodeArgmax, Timing) {
    REQUIRE_GPU();
    const int64_t n = 248320;
    Dev dl(size_t(n) * 4), di(64);
    ASSERT_TRUE(dl.p && di.p);
    std::vector<float> row = randn(size_t(n), 3);
    CU(cudaMemcpy(dl.p, row.data(), row.size() * 4, cudaMemcpyHostToDevice));
    for (int cap : {0, 8, 1}) {
        ArgmaxCap c(cap);
        const double us = time_us([&] { cuda::argmax_rows(dl.as<float>(), n, n, 1, di.as<int32_t>(), nullptr); });
        CU(cudaGetLastError());
        std::printf("[ argmax ] %lld floats, cluster cap %d: %.2f us per call (200 calls)\n", (long long)n, cap, us);
    }
}

// ---------------------------------------------------------------- top-k candidates

// top_k_rows against the host's Backend::top_k order (top_k_order: larger
// logit first, -0 as +0, NaN last, the lower index among equals), values
// bit for bit, on rows with many ties, NaN, infinities and zeros of both signs.
void check_top_k(const std::vector<float>& rows, int64_t ld, int64_t n, int64_t T, int k, Dev& dl, Dev& dv, Dev& di,
                 Dev& dw, const char* what) {
    ASSERT_LE(cuda::top_k_work_bytes(n, T, k), dw.bytes);
    ASSERT_EQ(cudaMemcpy(dl.p, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(dv.p, 0x7f, size_t(T * k) * 4), cudaSuccess);  // poison
    ASSERT_EQ(cudaMemset(di.p, 0x7f, size_t(T * k) * 4), cudaSuccess);
    cuda::top_k_rows(dl.as<float>(), ld, n, T, k, dv.as<float>(), di.as<int32_t>(), dw.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> v(size_t(T * k));
    std::vector<int32_t> id(size_t(T * k));
    ASSERT_EQ(cudaMemcpy(v.data(), dv.p, v.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(id.data(), di.p, id.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t t = 0; t < T; ++t) {
        std::vector<uint64_t> best;
        top_k_slice(&rows[size_t(t * ld)], 0, n, k, best);
        std::sort(best.begin(), best.end(), std::greater<uint64_t>());
        for (int j = 0; j < k; ++j) {
            const int64_t want = top_k_index(best[size_t(j)]);
            ASSERT_EQ(id[size_t(t * k + j)], want) << what << " n " << n << " k " << k << " row " << t << " rank " << j;
            ASSERT_EQ(std::memcmp(&v[size_t(t * k + j)], &rows[size_t(t * ld + want)], 4), 0) << what << " rank " << j;
        }
    }
}

TEST(CudaDecodeTopK, MatchesHostOrder) {
    REQUIRE_GPU();
    const int64_t kMaxN = 248320, T = 3;
    Dev dl(size_t(kMaxN + 5) * size_t(T) * 4), dv(size_t(T) * 256 * 4), di(size_t(T) * 256 * 4);
    Dev dw(cuda::top_k_work_bytes(kMaxN, T, 1) + cuda::top_k_work_bytes(kMaxN, T, 256));
    ASSERT_TRUE(dl.p && dv.p && di.p && dw.p);
    uint32_t seed = 5;
    for (int64_t n : {256, 1000, 4097, 65537, 248320}) {
        for (int k : {1, 2, 40, 64, 255, 256}) {
            if (k > n) continue;
            const int64_t ld = n + 5;
            std::vector<float> rows = randn(size_t(ld * T), seed++, 3.f);
            // row 0: logits on a coarse grid (ties everywhere); row 1: specials
            for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = std::round(rows[size_t(i)] * 2.f) / 2.f;
            float* r1 = &rows[size_t(ld)];
            r1[0] = kNaN;
            r1[1] = -0.0f;
            r1[2] = 0.0f;
            r1[n / 2] = kInf;
            r1[n - 1] = -kInf;
            r1[n / 3] = kNaN;
            check_top_k(rows, ld, n, T, k, dl, dv, di, dw, "random");
            // every value equal (zeros of both signs): the lowest indices win
            for (int64_t i = 0; i < ld * T; ++i) rows[size_t(i)] = (i % 3) ? 0.0f : -0.0f;
            check_top_k(rows, ld, n, T, k, dl, dv, di, dw, "zeros");
        }
    }
}

TEST(CudaDecodeTopK, Timing) {
    REQUIRE_GPU();
    const int64_t n = 248320;
    Dev dl(size_t(n) * 4 * 64), dv(256 * 4 * 64), di(256 * 4 * 64), dw(cuda::top_k_work_bytes(n, 64, 40) +
                                                                        cuda::top_k_work_bytes(n, 64, 256));
    ASSERT_TRUE(dl.p && dv.p && di.p && dw.p);
    std::vector<float> rows = randn(size_t(n) * 64, 3);
    CU(cudaMemcpy(dl.p, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
    for (int64_t T : {1, 64}) {
        for (int k : {40, 256}) {
            const double us = time_us([&] {
                cuda::top_k_rows(dl.as<float>(), n, n, T, k, dv.as<float>(), di.as<int32_t>(), dw.p, nullptr);
            });
            CU(cudaGetLastError());
            std::printf("[ top_k ] %lld rows of %lld floats, k %d: %.2f us per call (200 calls)\n", (long long)T,
                        (long long)n, k, us);
        }
    }
}

// ---------------------------------------------------------------- attention

using Cache = test::KvTestCache;
using test::ref_attention;

// One attention call on the device; the output is poisoned first.
struct AttnRun {
    const Cache& c;
    int64_t n_head, T;
    int max_seg;  // the most tokens of one sequence (decode: 1)
    bool early = true;  // the split kernel loads the rows below pos + 1 - max_seg before its wait
    Dev dq, dout, dpos, dslot, work;
    AttnRun(const Cache& c_, int64_t n_head_, int64_t T_, int max_seg_ = 1)
        : c(c_), n_head(n_head_), T(T_), max_seg(max_seg_), dq(size_t(T * n_head * c.d) * 4),
          dout(size_t(T * n_head * c.d) * 4), dpos(size_t(T) * 4), dslot(size_t(T) * 4),
          work(cuda::attention_work_bytes(T, n_head, c.d, c.n_ctx, max_seg)) {
        if (work.p) cudaMemset(work.p, 0xFF, work.bytes);  // NaN: unwritten partials must never be read
    }
    cuda::Rows q_rows() const {
        cuda::Rows r;
        r.data = dq.as<float>();
        r.n = c.d;
        r.n1 = n_head;
        r.n2 = T;
        r.s1 = c.d;
        r.s2 = n_head * c.d;
        return r;
    }
    void launch(float scale, cudaStream_t s) const {
        cuda::attention(q_rows(), c.view(), dpos.as<int32_t>(), dslot.as<int32_t>(), T, scale, dout.as<float>(),
                        work.p, max_seg, s, nullptr, 0, early ? max_seg : 0);
    }
    std::vector<float> run(const std::vector<float>& q, const std::vector<int32_t>& pos,
                           const std::vector<int32_t>& slot, float scale) {
        cudaMemcpy(dq.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dpos.p, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dslot.p, slot.data(), slot.size() * 4, cudaMemcpyHostToDevice);
        cudaMemset(dout.p, 0xFF, dout.bytes);
        launch(scale, nullptr);
        std::vector<float> out(size_t(T * n_head * c.d));
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        cudaMemcpy(out.data(), dout.p, out.size() * 4, cudaMemcpyDeviceToHost);
        return out;
    }
};

// Max |ref - got| relative to 1 + max |ref|; infinite when got holds a non-finite value.
double rel_err(const std::vector<float>& ref, const std::vector<float>& got) {
    double m = 0, r = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        m = std::max(m, double(std::fabs(ref[i] - got[i])));
        r = std::max(r, double(std::fabs(ref[i])));
    }
    return m / (1.0 + r);
}

struct DecodeCase {
    int64_t d, group;
    GgmlType kv;
};

// Readable parameters in test listings (instead of the struct's bytes).
[[maybe_unused]] void PrintTo(const DecodeCase& c, std::ostream* os) {
    *os << "d=" << c.d << " group=" << c.group << " " << type_name(c.kv);
}

class CudaDecodeAttention : public ::testing::TestWithParam<DecodeCase> {};

// One token at lengths around the tile and split sizes, in a cache of 32768
// positions (128 splits launched) and in a small one (one split), two slots;
// then several tokens of different slots and lengths in one call.
TEST_P(CudaDecodeAttention, MatchesReferenceAtShortAndLongContexts) {
    REQUIRE_GPU();
    const DecodeCase dc = GetParam();
    const int64_t n_kv = dc.group >= 8 ? 2 : 4, n_head = n_kv * dc.group;
    const float scale = 1.f / std::sqrt(float(dc.d));
    const int64_t kFill = 4097;
    uint32_t seed = 1000 + uint32_t(dc.d * 10 + dc.group);
    for (int64_t n_ctx : {int64_t(32768), int64_t(4160), int64_t(64)}) {
        Cache c(dc.d, n_kv, n_ctx, 2, dc.kv, kFill);
        ASSERT_TRUE(c.dk.p && c.dv.p);
        const int64_t filled = std::min(kFill, n_ctx);
        c.fill(0, filled, seed++);
        c.fill(1, filled, seed++);
        AttnRun r1(c, n_head, 1);
        ASSERT_TRUE(r1.work.p || cuda::attention_work_bytes(1, n_head, c.d, n_ctx, 1) == 0);
        for (int64_t n : {1, 5, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 4096, 4097}) {
            if (n > filled) continue;
            for (int32_t s : {0, 1}) {
                // q scaled up so the softmax is peaked (and the max moves between splits)
                const std::vector<float> q = randn(size_t(n_head * c.d), seed++, n % 2 ? 3.f : 1.f);
                const std::vector<float> got = r1.run(q, {int32_t(n - 1)}, {s}, scale);
                const std::vector<float> ref = ref_attention(c, q, n_head, {int32_t(n - 1)}, {s}, scale);
                EXPECT_LT(rel_err(ref, got), 2e-5) << "n_ctx " << n_ctx << " n " << n << " slot " << s;
                // rows loaded before the kernel's wait or after it: the same bits
                r1.early = false;
                const std::vector<float> late = r1.run(q, {int32_t(n - 1)}, {s}, scale);
                r1.early = true;
                EXPECT_EQ(std::memcmp(late.data(), got.data(), got.size() * 4), 0)
                    << "n_ctx " << n_ctx << " n " << n << " slot " << s;
            }
        }
        // several tokens in one call (decode of a few sequences / speculative),
        // and a prefill-sized batch (one split per token)
        const std::vector<std::vector<int32_t>> batches[2] = {
            {{int32_t(filled - 1), 4, 0, int32_t(std::min<int64_t>(300, filled - 1))}, {1, 0, 1, 0}},
            {{0, 1, 2, int32_t(filled / 2), int32_t(filled - 1), 63, int32_t(std::min<int64_t>(64, filled - 1))},
             {0, 0, 0, 1, 1, 0, 1}}};
        for (const auto& b : batches) {
            const int64_t T = int64_t(b[0].size());
            AttnRun r(c, n_head, T, T > 4 ? 8 : 1);  // the second as a prompt step: one pass
            const std::vector<float> q = randn(size_t(T * n_head * c.d), seed++, 2.f);
            const std::vector<float> got = r.run(q, b[0], b[1], scale);
            EXPECT_LT(rel_err(ref_attention(c, q, n_head, b[0], b[1], scale), got), 2e-5)
                << "n_ctx " << n_ctx << " T " << T;
            if (T > 4) continue;  // a prompt step (one pass) rounds differently
            // every row of a decode step is the same bits as that token alone
            const size_t row = size_t(n_head * c.d);
            for (int64_t t = 0; t < T; ++t) {
                const std::vector<float> qt(q.begin() + std::ptrdiff_t(t * row), q.begin() + std::ptrdiff_t((t + 1) * row));
                const std::vector<float> alone = r1.run(qt, {b[0][size_t(t)]}, {b[1][size_t(t)]}, scale);
                EXPECT_EQ(std::memcmp(alone.data(), got.data() + t * row, row * 4), 0)
                    << "n_ctx " << n_ctx << " T " << T << " token " << t;
            }
        }
    }
}

std::vector<DecodeCase> decode_cases() {
    std::vector<DecodeCase> v;
    for (int64_t d : {64, 128, 256})
        for (int64_t g : {1, 2, 4, 8})
            for (GgmlType kv : {GgmlType::F16, GgmlType::F32, GgmlType::Q8_0}) v.push_back({d, g, kv});
    return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDecodeAttention, ::testing::ValuesIn(decode_cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& i) {
                             char name[64];
                             std::snprintf(name, sizeof name, "d%d_g%d_%s", int(i.param.d), int(i.param.group),
                                           type_name(i.param.kv));
                             return std::string(name);
                         });

// A decode token's attention must not depend on what else is in its step (the
// server batches requests as they come) nor on the run: the row of token
// (slot 1, pos 700) alone, in a batch of 4 and in one of 40 rows, bit for bit,
// and every call twice with the same bits; prompt-sized steps (past the split
// kernel's token limit) stay within rounding of it.
TEST(CudaDecodeAttentionBatch, RowDoesNotDependOnItsBatch) {
    REQUIRE_GPU();
    const int64_t d = 256, n_kv = 4, n_head = 16, n_ctx = 4096;
    Cache c(d, n_kv, n_ctx, 3, GgmlType::F16, 1024);
    ASSERT_TRUE(c.dk.p && c.dv.p);
    for (int s = 0; s < 3; ++s) c.fill(s, 1024, 77 + uint32_t(s));
    const float scale = 1.f / 16.f;
    const std::vector<float> q1 = randn(size_t(n_head * d), 5, 2.f);
    std::vector<float> alone;
    for (int64_t T : {1, 4, 40, 80}) {
        std::vector<int32_t> pos, slot;
        std::vector<float> q = randn(size_t(T * n_head * d), 6 + uint32_t(T), 2.f);
        for (int64_t t = 0; t < T; ++t) {
            pos.push_back(int32_t((t * 37) % 1000));
            slot.push_back(int32_t(t % 3));
        }
        const int64_t at = T / 2;  // the watched row
        pos[size_t(at)] = 700;
        slot[size_t(at)] = 1;
        std::copy(q1.begin(), q1.end(), q.begin() + std::ptrdiff_t(at * n_head * d));
        AttnRun r(c, n_head, T);
        const std::vector<float> got = r.run(q, pos, slot, scale);
        const std::vector<float> again = r.run(q, pos, slot, scale);
        EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * 4), 0) << "two runs of a batch of " << T;
        const std::vector<float> row(got.begin() + std::ptrdiff_t(at * n_head * d),
                                     got.begin() + std::ptrdiff_t((at + 1) * n_head * d));
        if (T == 1) {
            alone = row;
            EXPECT_LT(rel_err(ref_attention(c, q1, n_head, {700}, {1}, scale), alone), 2e-5);
        } else if (T <= 64) {
            EXPECT_EQ(std::memcmp(row.data(), alone.data(), row.size() * 4), 0) << "batch of " << T;
        } else {
            EXPECT_LT(rel_err(alone, row), 2e-5) << "batch of " << T;
        }
    }
}

// One far key aligned with q dominates: the output is its V row, wherever the
// split holding it lies.
TEST(CudaDecodeAttentionNeedle, FarKeyWinsAcrossSplits) {
    REQUIRE_GPU();
    const int64_t d = 256, n_kv = 4, n_head = 16, n = 12000;
    Cache c(d, n_kv, 32768, 1, GgmlType::F16, n);
    ASSERT_TRUE(c.dk.p && c.dv.p);
    c.fill(0, n, 77);
    AttnRun r(c, n_head, 1);
    for (int64_t j : {int64_t(0), int64_t(63), int64_t(64), int64_t(9000), n - 1}) {
        std::vector<float> q(size_t(n_head * d));
        for (int64_t h = 0; h < n_head; ++h)
            for (int64_t e = 0; e < d; ++e) q[size_t(h * d + e)] = 4.f * c.k[c.hoff(0, j) + size_t((h / 4) * d + e)];
        const std::vector<float> got = r.run(q, {int32_t(n - 1)}, {0}, 1.f / 16.f);
        const std::vector<float> ref = ref_attention(c, q, n_head, {int32_t(n - 1)}, {0}, 1.f / 16.f);
        EXPECT_LT(rel_err(ref, got), 2e-5) << "needle at " << j;
        EXPECT_NEAR(got[0], c.v[c.hoff(0, j)], 1e-2) << "needle at " << j;  // head 0 reads kv head 0's row j
    }
}

// The decode loop: captured once at a large capacity, replayed as the context
// grows (pos written between replays), through the short, tile, split and long
// regimes, including jumps.
TEST(CudaDecodeAttentionGraph, ReplayFollowsTheLengthOnTheDevice) {
    REQUIRE_GPU();
    const int64_t d = 256, n_kv = 4, n_head = 16, n_max = 9000;
    for (GgmlType kv : {GgmlType::F16, GgmlType::F32, GgmlType::Q8_0}) {
        Cache c(d, n_kv, 32768, 2, kv, n_max);
        ASSERT_TRUE(c.dk.p && c.dv.p);
        c.fill(1, n_max, 31);
        AttnRun r(c, n_head, 1);
        const std::vector<float> q = randn(size_t(n_head * d), 32, 2.f);
        const int32_t slot = 1;
        CU(cudaMemcpy(r.dq.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(r.dslot.p, &slot, 4, cudaMemcpyHostToDevice));
        cudaStream_t s;
        CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        r.launch(1.f / 16.f, s);
        CU(cudaStreamEndCapture(s, &graph));
        CU(cudaGraphInstantiate(&exec, graph, 0));
        std::vector<int32_t> positions;
        for (int32_t p = 0; p < 140; ++p) positions.push_back(p);
        for (int32_t p : {255, 256, 257, 511, 4095, 4096, 64, 8191, 8999, 3, 0}) positions.push_back(p);
        for (int32_t p : positions) {
            CU(cudaMemcpyAsync(r.dpos.p, &p, 4, cudaMemcpyHostToDevice, s));
            CU(cudaMemsetAsync(r.dout.p, 0xFF, r.dout.bytes, s));
            CU(cudaGraphLaunch(exec, s));
            std::vector<float> got(size_t(n_head * d));
            CU(cudaMemcpyAsync(got.data(), r.dout.p, got.size() * 4, cudaMemcpyDeviceToHost, s));
            CU(cudaStreamSynchronize(s));
            const std::vector<float> ref = ref_attention(c, q, n_head, {p}, {slot}, 1.f / 16.f);
            ASSERT_LT(rel_err(ref, got), 2e-5) << "pos " << p << " " << type_name(kv);
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(s);
    }
}

// Qwen3.5-4B's full-attention layers: 16 q heads, 4 kv heads, d 256, a cache
// of 32768, f16 and q8_0 (half the bytes). "warm": 200 calls on one slot (at
// 32k keys 71 MB of q8_0, 134 MB of f16, some of which may stay in a 50 MB L2
// and the address translation caches from one call to the next); "cold": 4
// slots in turn, closer to a model, whose layers each read their own cache
// once per token with the other layers' weights and caches in between.
TEST(CudaDecodeAttentionTiming, Qwen35Shape) {
    REQUIRE_GPU();
    const int64_t d = 256, n_kv = 4, n_head = 16, n_ctx = 32768;
    constexpr int kSlots = 4;
    for (GgmlType kv : {GgmlType::F16, GgmlType::Q8_0}) {
        Cache c(d, n_kv, n_ctx, kSlots, kv, 1);
        ASSERT_TRUE(c.dk.p && c.dv.p);
        // Every byte 0x2C: f16 values (and q8_0 scales) 0x2C2C (~0.065), q8_0
        // values 44: finite, cheap to fill, every V row the same.
        CU(cudaMemset(c.dk.p, 0x2C, c.bytes()));
        CU(cudaMemset(c.dv.p, 0x2C, c.bytes()));
        const float v_value = fp16_to_fp32(0x2C2C) * (kv == GgmlType::Q8_0 ? 44.f : 1.f);
        const std::vector<float> q = randn(size_t(n_head * d), 5);
        std::vector<std::unique_ptr<AttnRun>> runs;  // one per slot
        for (int32_t slot = 0; slot < kSlots; ++slot) {
            runs.push_back(std::make_unique<AttnRun>(c, n_head, 1));
            CU(cudaMemcpy(runs.back()->dq.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(runs.back()->dslot.p, &slot, 4, cudaMemcpyHostToDevice));
        }
        for (int32_t n : {5, 512, 4096, 32768}) {
            const int32_t p = n - 1;
            for (auto& r : runs) CU(cudaMemcpy(r->dpos.p, &p, 4, cudaMemcpyHostToDevice));
            const double warm = time_us([&] { runs[0]->launch(1.f / 16.f, nullptr); });
            int next = 0;
            const double cold = time_us([&] { runs[size_t(next++ % kSlots)]->launch(1.f / 16.f, nullptr); });
            CU(cudaGetLastError());
            for (const auto& r : runs) {
                std::vector<float> out(size_t(n_head * d));
                CU(cudaMemcpy(out.data(), r->dout.p, out.size() * 4, cudaMemcpyDeviceToHost));
                EXPECT_NEAR(out[0], v_value, 1e-3 * v_value) << "n " << n << " " << type_name(kv);  // the mean of equal rows
            }
            const double gb = double(n) * double(n_kv) * double(c.head_row_bytes()) * 2 / 1e9;
            std::printf("[ attention ] 16 q / 4 kv heads, d 256, %s, capacity %lld, length %d: %.2f us per call "
                        "(split + combine, 200 calls), %.0f GB/s of K/V; cold (%d slots in turn): %.2f us, %.0f GB/s\n",
                        type_name(kv), (long long)n_ctx, n, warm, gb / (warm * 1e-6), kSlots, cold,
                        gb / (cold * 1e-6));
        }
    }
}

#else
TEST(CudaDecode, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif

}  // namespace
}  // namespace qinfer
