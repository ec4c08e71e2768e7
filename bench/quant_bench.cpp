// CPU kernel throughput at Qwen3.5-4B shapes (n_embd 2560, n_ff 9216).
//   matvec (T=1, decode): weight bytes streamed per second ("bytes_per_second");
//     compare with BM_MemRead, the streaming-read bandwidth of the same machine.
//   matvec on an L2-resident matrix: the kernel's compute ceiling.
//   matmul (T=512, prompt processing): GFLOP/s ("flops" counter, 2*K*N*T per call),
//     path 0 = the dot kernels (a weight block unpacked per 4 activation rows),
//     path 1 = the int8 tile kernels (cpu_q8_gemm.h; other types fall back to 0).
//     Small-T rows of both paths locate the crossover (q8_gemm_min_rows).
// Weights are rotated through a pool larger than the L3 cache so every matvec
// reads them from DRAM, as decode does with a real model.
// Run: build/bench/quant_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "common/thread_pool.h"
#include "quant/cpu_kernels.h"
#include "quant/cpu_matmul.h"
#include "quant/cpu_q8_gemm.h"
#include "quant/quant.h"

using namespace qinfer;

namespace {

constexpr size_t kPoolBytes = size_t(512) << 20;  // >> L3 on current desktop/server parts

// `copies` independent copies of an N x K weight matrix of type t (rows are
// real quantized data, 64 distinct rows repeated).
struct Weights {
    size_t matrix_bytes = 0;
    int copies = 0;
    std::vector<uint8_t> data;
};

// One matrix (pool) at a time: the pools are large.
const Weights& weights(GgmlType t, int64_t K, int64_t N, bool rotate) {
    static std::tuple<int, int64_t, int64_t, bool> cached_key{-1, 0, 0, false};
    static std::unique_ptr<Weights> cached;
    const auto key = std::make_tuple(int(t), K, N, rotate);
    if (cached && key == cached_key) return *cached;
    cached.reset();
    auto w = std::make_unique<Weights>();
    const size_t rb = row_bytes(t, K);
    w->matrix_bytes = rb * size_t(N);
    w->copies = rotate ? int(std::max<size_t>(1, kPoolBytes / w->matrix_bytes)) : 1;
    w->data.resize(w->matrix_bytes * size_t(w->copies));
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.f, 0.02f);
    std::vector<float> row(static_cast<size_t>(K));
    std::vector<uint8_t> rows(rb * 64);
    for (int r = 0; r < 64; ++r) {
        for (float& v : row) v = nd(rng);
        quantize_row(t, row.data(), rows.data() + r * rb, K);
    }
    for (size_t off = 0; off < w->data.size(); off += rb)
        std::memcpy(w->data.data() + off, rows.data() + (off / rb % 64) * rb, rb);
    cached_key = key;
    cached = std::move(w);
    return *cached;
}

ThreadPool& pool(int n) {
    static std::map<int, std::unique_ptr<ThreadPool>> p;
    std::unique_ptr<ThreadPool>& q = p[n];
    if (!q) q = std::make_unique<ThreadPool>(n);
    return *q;
}

// 1, 2 and, on bigger machines, every hardware thread.
std::vector<int> thread_counts() {
    std::vector<int> t = {1, 2};
    const int hw = int(std::thread::hardware_concurrency());
    if (hw > 2) t.push_back(hw);
    return t;
}

void BM_Matvec(benchmark::State& st) {
    const auto t = GgmlType(st.range(0));
    const int64_t K = st.range(1), N = st.range(2);
    const int threads = int(st.range(3));
    const Weights& w = weights(t, K, N, true);
    std::vector<float> x(static_cast<size_t>(K), 0.5f), y(static_cast<size_t>(N));
    int c = 0;
    for (auto _ : st) {
        cpu_matmul(t, w.data.data() + size_t(c) * w.matrix_bytes, K, N, x.data(), 1, y.data(), N, pool(threads));
        benchmark::DoNotOptimize(y.data());
        c = (c + 1) % w.copies;
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(w.matrix_bytes));
    st.SetLabel(std::string(type_name(t)) + " " + cpu_kernel_isa());
}

// Same kernel on a matrix that stays in L2: the compute ceiling of the decode
// kernel, to compare with the DRAM numbers above.
void BM_MatvecL2(benchmark::State& st) {
    const auto t = GgmlType(st.range(0));
    const int64_t K = st.range(1), N = std::max<int64_t>(16, int64_t((384 << 10) / row_bytes(t, K)));
    const Weights& w = weights(t, K, N, false);
    std::vector<float> x(static_cast<size_t>(K), 0.5f), y(static_cast<size_t>(N));
    for (auto _ : st) {
        cpu_matmul(t, w.data.data(), K, N, x.data(), 1, y.data(), N, pool(1));
        benchmark::DoNotOptimize(y.data());
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(w.matrix_bytes));
    st.SetLabel(std::string(type_name(t)) + " " + cpu_kernel_isa());
}

void BM_Matmul(benchmark::State& st) {
    const auto t = GgmlType(st.range(0));
    const int64_t K = st.range(1), N = st.range(2), T = st.range(3);
    const int threads = int(st.range(4));
    const auto path = st.range(5) ? kernels::TilePath::Gemm : kernels::TilePath::Dot;
    const Weights& w = weights(t, K, N, false);
    std::vector<float> x(static_cast<size_t>(K * T)), y(static_cast<size_t>(N * T));
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (float& v : x) v = nd(rng);
    for (auto _ : st) {
        kernels::matmul_isa(kernels::detected_isa(), t, w.data.data(), K, N, x.data(), T, y.data(), N, pool(threads),
                            path);
        benchmark::DoNotOptimize(y.data());
    }
    st.counters["flops"] = benchmark::Counter(2.0 * double(K) * double(N) * double(T) * double(st.iterations()),
                                              benchmark::Counter::kIsRate);
    st.SetLabel(std::string(type_name(t)) + " " + cpu_kernel_isa() + (st.range(5) ? " int8-tile" : " dot"));
}

// Streaming read of a buffer much larger than L3, split over the pool's threads.
void BM_MemRead(benchmark::State& st) {
    const int threads = int(st.range(0));
    static std::vector<uint64_t> buf(kPoolBytes / 8, 1);
    const size_t n = buf.size();
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    for (auto _ : st) {
        pool(threads).run_on_all([&](int id, int nt) {
            const size_t b = n * size_t(id) / size_t(nt), e = n * size_t(id + 1) / size_t(nt);
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t i = b; i + 4 <= e; i += 4) {
                s0 += buf[i];
                s1 += buf[i + 1];
                s2 += buf[i + 2];
                s3 += buf[i + 3];
            }
            sums[size_t(id)] = s0 + s1 + s2 + s3;
        });
        benchmark::DoNotOptimize(sums.data());
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(n * 8));
}

void BM_Memcpy(benchmark::State& st) {
    static std::vector<uint8_t> src(kPoolBytes / 2, 1), dst(kPoolBytes / 2);
    for (auto _ : st) {
        std::memcpy(dst.data(), src.data(), src.size());
        benchmark::DoNotOptimize(dst.data());
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(src.size()) * 2);  // read + write
}

void matvec_args(benchmark::internal::Benchmark* b) {
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16})
        for (auto [K, N] : {std::pair<int64_t, int64_t>{2560, 9216}, {9216, 2560}})
            for (int threads : thread_counts()) b->Args({int64_t(t), K, N, threads});
    b->ArgNames({"type", "K", "N", "threads"});
}

void matmul_args(benchmark::internal::Benchmark* b) {
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16})
        for (int threads : {1, 2})
            for (int path : {0, 1}) {
                if (path && !kernels::q8_group_size(t)) continue;
                b->Args({int64_t(t), 2560, 9216, 512, threads, path});
            }
    b->ArgNames({"type", "K", "N", "T", "threads", "path"});
}

// Short prompts: where the tile kernels start to pay for repacking the weights.
void matmul_small_args(benchmark::internal::Benchmark* b) {
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K})
        for (int64_t T : {2, 4, 8, 16, 32})
            for (int path : {0, 1}) b->Args({int64_t(t), 2560, 9216, T, 1, path});
    b->ArgNames({"type", "K", "N", "T", "threads", "path"});
}

}  // namespace

BENCHMARK(BM_MemRead)
    ->Apply([](benchmark::internal::Benchmark* b) {
        for (int t : thread_counts()) b->Arg(t);
    })
    ->ArgName("threads")
    ->UseRealTime();
BENCHMARK(BM_Memcpy)->UseRealTime();
BENCHMARK(BM_Matvec)->Apply(matvec_args)->UseRealTime();
BENCHMARK(BM_MatvecL2)
    ->ArgsProduct({{int64_t(GgmlType::Q4_K), int64_t(GgmlType::Q6_K), int64_t(GgmlType::Q8_0), int64_t(GgmlType::F16)},
                   {2560, 9216}})
    ->ArgNames({"type", "K"});
BENCHMARK(BM_Matmul)->Apply(matmul_args)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Matmul)->Name("BM_MatmulSmallT")->Apply(matmul_small_args)->UseRealTime()->Unit(benchmark::kMillisecond);
