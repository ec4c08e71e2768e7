// CUDA benchmarks (plain main, prints a table):
//   cuda_bench --kernels                      matvec bandwidth per weight type at 4B shapes
//   cuda_bench --model M.gguf [--pp 512] [--tg 128] [--ttft 4096] [--long 32768]
// Model numbers go through Model::forward with every layer, the embedding and
// the head on the GPU (logits of the last token are read back each step, as
// the engine does today). Kernel numbers are timed with CUDA events over many
// launches, rotating over enough weight copies to defeat the 60 MB L2.
#include <cstdio>

#ifndef QINFER_HAVE_CUDA
int main() {
    std::printf("cuda_bench: built without CUDA\n");
    return 0;
}
#else
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/layout.h"

using namespace qinfer;

namespace {

// Portable environment switches (POSIX setenv / Windows _putenv_s).
inline void set_env(const char* k, const char* v) {
#ifdef _WIN32
    _putenv_s(k, v);
#else
    setenv(k, v, 1);
#endif
}
inline void unset_env(const char* k) {
#ifdef _WIN32
    _putenv_s(k, "");
#else
    unsetenv(k);
#endif
}

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) fail(strfmt("%s: %s", #x, cudaGetErrorString(e_)));               \
    } while (0)

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- kernels

void bench_kernels() {
    struct Shape {
        const char* what;
        GgmlType type;
        int64_t K, N;
    };
    const Shape shapes[] = {
        {"ffn_up 2560->9216", GgmlType::Q4_K, 2560, 9216},  {"ffn_down 9216->2560", GgmlType::Q4_K, 9216, 2560},
        {"ffn_down 9216->2560", GgmlType::Q6_K, 9216, 2560}, {"attn_qkv 2560->8192", GgmlType::Q4_K, 2560, 8192},
        {"ssm_out 4096->2560", GgmlType::Q4_K, 4096, 2560},  {"ssm_alpha 2560->32", GgmlType::Q4_K, 2560, 32},
        {"lm_head 2560->248320", GgmlType::Q6_K, 2560, 248320}, {"ffn_up q8_0", GgmlType::Q8_0, 2560, 9216},
        {"ffn_up q5_K", GgmlType::Q5_K, 2560, 9216},          {"ffn_up q4_0", GgmlType::Q4_0, 2560, 9216},
        {"ffn_up q5_0", GgmlType::Q5_0, 2560, 9216},          {"ffn_up f16", GgmlType::F16, 2560, 9216},
        {"ffn_up bf16", GgmlType::BF16, 2560, 9216},
    };
    std::printf("\n%-24s %-5s %3s %10s %10s %9s\n", "matvec", "type", "T", "MB", "us", "GB/s");
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::mt19937 rng(1);
    for (const Shape& sh : shapes) {
        const int64_t nb = sh.K * sh.N / traits(sh.type).block_size;
        const cuda::WeightLayout l = cuda::weight_layout(sh.type, nb);
        const int copies = int(std::max<size_t>(1, std::min<size_t>(16, (size_t(256) << 20) / l.total + 1)));
        std::vector<uint8_t*> w(static_cast<size_t>(copies));
        std::vector<uint8_t> host(l.total);
        for (auto& b : host) b = uint8_t(rng());
        // sane f16 scales where the layout keeps them (keeps the math finite)
        for (int c = 0; c < copies; ++c) {
            CK(cudaMalloc(&w[size_t(c)], l.total));
            CK(cudaMemcpy(w[size_t(c)], host.data(), l.total, cudaMemcpyHostToDevice));
        }
        for (int T : {1, 4, 8}) {
            const cuda::ActKind kind = cuda::act_kind_for(sh.type);
            float* x;
            CK(cudaMalloc(&x, size_t(sh.K * T) * 4));
            std::vector<float> xh(static_cast<size_t>(sh.K * T));
            for (auto& v : xh) v = float(int(rng() % 2001) - 1000) / 1000.f;
            CK(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
            void* act = nullptr;
            const size_t ab = std::max<size_t>(cuda::act_bytes(kind, sh.K, T), 16);
            CK(cudaMalloc(&act, ab));
            cuda::quantize_act(kind, x, sh.K, sh.K, T, act, s);
            const cuda::ActQ a = cuda::act_view(kind, act, x, sh.K, T);
            float* y;
            CK(cudaMalloc(&y, size_t(sh.N * T) * 4));
            cuda::DeviceWeight dw;
            dw.type = sh.type;
            dw.K = sh.K;
            dw.N = sh.N;
            dw.layout = l;
            const int iters = 200;
            for (int i = 0; i < 10; ++i) {
                dw.data = w[size_t(i % copies)];
                cuda::matmul_vec(dw, a, T, y, sh.N, nullptr, s);
            }
            CK(cudaEventRecord(e0, s));
            for (int i = 0; i < iters; ++i) {
                dw.data = w[size_t(i % copies)];
                cuda::matmul_vec(dw, a, T, y, sh.N, nullptr, s);
            }
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double us = 1000.0 * ms / iters;
            std::printf("%-24s %-5s %3d %10.2f %10.2f %9.0f\n", sh.what, type_name(sh.type), T, l.total / 1e6, us,
                        l.total / 1e3 / us);
            CK(cudaFree(x));
            CK(cudaFree(act));
            CK(cudaFree(y));
        }
        for (uint8_t* p : w) CK(cudaFree(p));
    }
}

// ---- model

std::unique_ptr<Model> load_gpu(const std::string& path, int n_ctx, int n_batch) {
    ModelOptions opt;
    opt.n_ctx = n_ctx;
    opt.n_batch = n_batch;
    const HParams hp = HParams::from_gguf(*gguf::File::open(path));
    Placement pl;
    pl.backends.push_back(make_cuda_backend(0));
    pl.layer.assign(size_t(hp.n_layer), 0);
    const double t0 = now_s();
    auto m = Model::load(path, opt, std::move(pl));
    std::printf("load: %.2f s (%s)\n", now_s() - t0, m->backend_description().c_str());
    return m;
}

// Prompt of n tokens from position p0, in batches of nb; logits of the last only.
double prompt(Model& m, int p0, int n, int nb, std::vector<float>& logits) {
    const double t0 = now_s();
    const int V = int(m.hparams().n_vocab);
    for (int i = 0; i < n; i += nb) {
        Batch b;
        const int c = std::min(nb, n - i);
        for (int j = 0; j < c; ++j) b.add((p0 + i + j) * 7919 % (V - 300) + 100, p0 + i + j, 0, i + j == n - 1);
        m.forward(b, logits);
    }
    return now_s() - t0;
}

// Greedy decode of n tokens after the last logits row; the GPU picks each
// token (Model::forward_argmax), as greedy generation does.
double decode(Model& m, int p0, int n, std::vector<float>& logits) {
    const int64_t V = m.hparams().n_vocab;
    std::vector<int32_t> tok = {int32_t(std::max_element(logits.end() - V, logits.end()) - (logits.end() - V))};
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) {
        Batch b;
        b.add(tok[0], p0 + i, 0, true);
        m.forward_argmax(b, tok);
    }
    return now_s() - t0;
}

void bench_variants(const std::string& path, int pp, int tg) {
    // Same model, one switch at a time: what each piece is worth.
    const char* variants[][2] = {{"QINFER_CUDA_GRAPHS", "0"},   {"QINFER_CUDA_FUSE", "0"},
                                 {"QINFER_CUDA_FUSE_NORM", "0"}, {"QINFER_CUDA_REG_NORM", "0"},
                                 {"QINFER_CUDA_MMA", "0"},      {"QINFER_CUDA_PREFILL", "mma"}};
    std::vector<float> logits;
    for (auto& v : variants) {
        set_env(v[0], v[1]);
        auto m = load_gpu(path, pp + tg + 16, pp);
        prompt(*m, 0, pp, pp, logits);
        m->clear_slot(0);
        const double tp = prompt(*m, 0, pp, pp, logits);
        decode(*m, pp, 8, logits);
        const double td = decode(*m, pp + 8, tg, logits);
        std::printf("%-28s pp%d %9.1f tok/s   tg%d %8.1f tok/s\n", (std::string(v[0]) + "=" + v[1]).c_str(), pp,
                    pp / tp, tg, tg / td);
        unset_env(v[0]);
    }
}

void bench_model(const std::string& path, int pp, int tg, int ttft, int long_ctx) {
    std::vector<float> logits;
    std::printf("\nmodel %s\n", path.c_str());
    {
        auto m = load_gpu(path, std::max(pp + tg + 8, 1024), pp);
        prompt(*m, 0, pp, pp, logits);  // warm-up: sizes scratch, loads kernels
        m->clear_slot(0);
        const double tp = prompt(*m, 0, pp, pp, logits);
        decode(*m, pp, 8, logits);  // warm-up: records the decode graph
        const double td = decode(*m, pp + 8, tg, logits);
        std::printf("%-28s %10.1f tok/s  (%.2f ms)\n", ("pp" + std::to_string(pp)).c_str(), pp / tp, tp * 1e3);
        std::printf("%-28s %10.1f tok/s  (%.3f ms/token)\n", ("tg" + std::to_string(tg) + " @" + std::to_string(pp)).c_str(),
                    tg / td, td * 1e3 / tg);
    }
    if (ttft > 0) {
        auto m = load_gpu(path, ttft + 8, ttft);
        prompt(*m, 0, ttft, ttft, logits);
        m->clear_slot(0);
        const double t = prompt(*m, 0, ttft, ttft, logits);
        std::printf("%-28s %10.1f ms     (%.0f tok/s)\n", ("ttft " + std::to_string(ttft)).c_str(), t * 1e3, ttft / t);
    }
    if (long_ctx > 0) {
        const int nb = 4096;
        auto m = load_gpu(path, long_ctx + 64, nb);
        const double tf = prompt(*m, 0, long_ctx, nb, logits);
        decode(*m, long_ctx, 4, logits);
        const double td = decode(*m, long_ctx + 4, 32, logits);
        std::printf("%-28s %10.1f tok/s  (fill %.2f s)\n", ("tg32 @" + std::to_string(long_ctx)).c_str(), 32 / td, tf);
    }
}

}  // namespace

int main(int argc, char** argv) {
    try {
        std::string model;
        int pp = 512, tg = 128, ttft = 0, long_ctx = 0;
        bool kernels = false, variants = false;
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            auto next = [&]() -> std::string {
                if (i + 1 >= argc) fail("missing value after " + a);
                return argv[++i];
            };
            if (a == "--kernels") kernels = true;
            else if (a == "--model") model = next();
            else if (a == "--pp") pp = std::stoi(next());
            else if (a == "--tg") tg = std::stoi(next());
            else if (a == "--ttft") ttft = std::stoi(next());
            else if (a == "--long") long_ctx = std::stoi(next());
            else if (a == "--variants") variants = true;
            else fail("unknown argument " + a);
        }
        if (cuda_device_count() == 0) fail("no CUDA device");
        if (kernels) bench_kernels();
        if (!model.empty() && !variants) bench_model(model, pp, tg, ttft, long_ctx);
        if (!model.empty() && variants) bench_variants(model, pp, tg);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cuda_bench: %s\n", e.what());
        return 1;
    }
}
#endif  // QINFER_HAVE_CUDA
