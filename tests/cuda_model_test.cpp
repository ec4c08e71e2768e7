// Whole models on the CUDA backend against the CPU backend on the reference
// models: logits of a prompt (max |diff| <= 1e-2 x max |ref|, or no farther
// from the reference implementation's logits than the CPU; argmax agreement
// where the CPU's top-2 margin exceeds the difference), prompt-at-once equals
// token-by-token on the GPU, and greedy continuations of the f16 / f32 models
// equal the reference ids. Skipped without a GPU or without reference data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "model/model.h"
#include "runtime/backend.h"
#include "greedy_steps.h"
#include "testutil.h"

namespace qinfer {
namespace {

const std::vector<int32_t> kS7 = {8193, 872, 198, 39, 4791, 1879, 8194};

ModelOptions options(int n_ctx) {
    ModelOptions opt;
    opt.n_ctx = n_ctx;
    opt.n_batch = 64;
    opt.n_threads = 2;
    return opt;
}

// Every layer, the embedding and the head on the GPU.
std::unique_ptr<Model> load_gpu(const std::string& path, const ModelOptions& opt) {
    const HParams hp = HParams::from_gguf(*gguf::File::open(path));
    Placement pl;
    pl.backends.push_back(make_cuda_backend(0));
    pl.layer.assign(size_t(hp.n_layer), 0);
    return Model::load(path, opt, std::move(pl));
}

// Every layer on the CPU, prompts of 32+ tokens offloaded to the GPU.
std::unique_ptr<Model> load_cpu_with_prompt_offload(const std::string& path, const ModelOptions& opt) {
    const HParams hp = HParams::from_gguf(*gguf::File::open(path));
    Placement pl;
    pl.backends.push_back(make_cpu_backend(std::make_shared<ThreadPool>(2)));
    pl.backends.push_back(make_cuda_backend(0));
    pl.layer.assign(size_t(hp.n_layer), 0);
    pl.offload = 1;
    ModelOptions oo = opt;
    oo.op_offload_min_batch = 32;
    return Model::load(path, oo, std::move(pl));
}

std::unique_ptr<Model> load_on(const std::string& path, bool gpu, int n_ctx) {
    const ModelOptions opt = options(n_ctx);
    return gpu ? load_gpu(path, opt) : Model::load(path, opt);
}

std::vector<float> run_batch(Model& m, const std::vector<int32_t>& ids) {
    Batch b;
    for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], int32_t(i), 0, true);
    std::vector<float> logits;
    m.forward(b, logits);
    return logits;
}

std::vector<float> run_one_by_one(Model& m, const std::vector<int32_t>& ids) {
    std::vector<float> all, one;
    for (size_t i = 0; i < ids.size(); ++i) {
        Batch b;
        b.add(ids[i], int32_t(i), 0, true);
        m.forward(b, one);
        all.insert(all.end(), one.begin(), one.end());
    }
    return all;
}

// Test names from model paths: "large/tiny-qwen3.f16.gguf" -> "large_tiny_qwen3_f16_gguf".
std::string param_name(const ::testing::TestParamInfo<std::string>& i) {
    std::string n = i.param;
    for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return n;
}

int argmax(const float* v, int64_t n) { return int(std::max_element(v, v + n) - v); }

using test::set_env;
using test::unset_env;

class CudaModel : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModel, LogitsMatchCpuBackend) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string path = test::reference_path(GetParam());
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    auto cpu = load_on(path, false, 64);
    auto gpu = load_on(path, true, 64);
    const int64_t V = cpu->hparams().n_vocab;
    const std::vector<float> lc = run_batch(*cpu, kS7), lg = run_batch(*gpu, kS7);
    ASSERT_EQ(lc.size(), lg.size());
    double maxref = 0, maxdiff = 0;
    for (size_t i = 0; i < lc.size(); ++i) {
        ASSERT_TRUE(std::isfinite(lg[i])) << "logit " << i;
        maxref = std::max(maxref, double(std::fabs(lc[i])));
        maxdiff = std::max(maxdiff, double(std::fabs(lc[i] - lg[i])));
    }
    std::printf("%s: max|cpu-gpu| %.3g, max|cpu| %.3g\n", GetParam().c_str(), maxdiff, maxref);
    // Quantized models: a float-order difference can flip the rounding of one
    // 8-bit activation quant, and later layers amplify it (the CPU's batched
    // and token-by-token runs differed by 2e-2 before their sums were put in
    // one order). Where the two backends part by more than 1e-2 x max, the GPU
    // must be as close to the reference implementation's logits as the CPU is.
    std::string ref = path.substr(0, path.size() - 5) + ".s7.logits.bin";
    if (maxdiff > 1e-2 * maxref && std::ifstream(ref).good()) {
        const std::vector<float> lr = test::read_f32(ref);
        ASSERT_EQ(lr.size(), lc.size()) << ref;
        double dc = 0, dg = 0;
        for (size_t i = 0; i < lr.size(); ++i) {
            dc = std::max(dc, double(std::fabs(lc[i] - lr[i])));
            dg = std::max(dg, double(std::fabs(lg[i] - lr[i])));
        }
        std::printf("%s: max|cpu-ref| %.3g, max|gpu-ref| %.3g\n", GetParam().c_str(), dc, dg);
        EXPECT_LE(dg, 1.25 * dc + 1e-2 * maxref) << "the GPU is farther from the reference than the CPU";
    } else {
        EXPECT_LE(maxdiff, 1e-2 * maxref);
    }
    for (size_t t = 0; t < kS7.size(); ++t) {
        const float* c = &lc[t * size_t(V)];
        std::vector<float> s(c, c + V);
        std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
        if (s[0] - s[1] > 2 * maxdiff) {
            EXPECT_EQ(argmax(c, V), argmax(&lg[t * size_t(V)], V)) << "position " << t;
        }
    }

    // The prompt at once equals token-by-token decode on the GPU.
    auto gpu2 = load_on(path, true, 64);
    const std::vector<float> l1 = run_one_by_one(*gpu2, kS7);
    double d1 = 0;
    for (size_t i = 0; i < lg.size(); ++i) d1 = std::max(d1, double(std::fabs(lg[i] - l1[i])));
    std::printf("%s: max|batch-token_by_token| %.3g\n", GetParam().c_str(), d1);
    EXPECT_LE(d1, 1e-3 * maxref);
}

INSTANTIATE_TEST_SUITE_P(Reference, CudaModel,
                         ::testing::Values("tiny-qwen35.f16.gguf", "tiny-qwen35.q8_0.gguf", "tiny-qwen35.q4_k_m.gguf",
                                           "tiny-qwen3.q4_k_m.gguf", "tiny-qwen2.q8_0.gguf", "large/tiny-qwen35.f32.gguf",
                                           "large/tiny-qwen3.f16.gguf", "large/tiny-qwen2.f16.gguf"),
                         param_name);

// A q8_0 KV cache: the GPU's logits against the CPU's with
// the same cache type, and the prompt at once against token-by-token decode on
// the GPU. Both backends quantize their own K/V rows, so a last-bit difference
// in a row can round a value to the neighbouring q8 step: the bound is the
// larger of the usual 1e-2 x max|logit| and twice what the q8 cache itself
// moves the CPU's logits (a wrong block, scale or layout moves them by the
// size of the logits).
class CudaModelQ8Cache : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModelQ8Cache, LogitsMatchCpuWithTheSameCache) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string path = test::reference_path(GetParam());
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    ModelOptions opt = options(64);
    opt.kv_type = GgmlType::Q8_0;
    const std::vector<float> lc = run_batch(*Model::load(path, opt), kS7);
    const std::vector<float> lg = run_batch(*load_gpu(path, opt), kS7);
    const std::vector<float> l1 = run_one_by_one(*load_gpu(path, opt), kS7);
    const std::vector<float> lf = run_batch(*Model::load(path, options(64)), kS7);  // f16 cache
    ASSERT_EQ(lc.size(), lg.size());
    ASSERT_EQ(l1.size(), lg.size());
    ASSERT_EQ(lf.size(), lg.size());
    double maxref = 0, maxdiff = 0, d1 = 0, cache_shift = 0;
    for (size_t i = 0; i < lc.size(); ++i) {
        ASSERT_TRUE(std::isfinite(lg[i])) << "logit " << i;
        maxref = std::max(maxref, double(std::fabs(lc[i])));
        maxdiff = std::max(maxdiff, double(std::fabs(lc[i] - lg[i])));
        d1 = std::max(d1, double(std::fabs(lg[i] - l1[i])));
        cache_shift = std::max(cache_shift, double(std::fabs(lc[i] - lf[i])));
    }
    std::printf("%s, q8_0 cache: max|cpu-gpu| %.3g, max|cpu| %.3g, max|cpu q8_0 - cpu f16| %.3g, "
                "max|batch-token_by_token| %.3g\n",
                GetParam().c_str(), maxdiff, maxref, cache_shift, d1);
    EXPECT_LE(maxdiff, std::max(1e-2 * maxref, 2 * cache_shift));
    EXPECT_LE(cache_shift, 0.1 * maxref) << "the CPU's q8_0 cache itself is off";
    EXPECT_LE(d1, 1e-3 * maxref);
}

INSTANTIATE_TEST_SUITE_P(Reference, CudaModelQ8Cache,
                         ::testing::Values("tiny-qwen35.f16.gguf", "tiny-qwen3.q4_k_m.gguf", "tiny-qwen2.q8_0.gguf"),
                         param_name);

// Split execution: the first half of the layers (and the embedding) on the
// GPU, the rest and the head on the CPU, and the other way round. The models
// whose full-offload logits agree with the CPU to ~1e-6 at this prompt must
// agree as closely split (the hidden state crosses the boundary as f32).
// Without a batch size, Model::load processes prompts in steps of 2048 tokens
// when every layer, the embedding and the head are on the GPU (-ngl all or
// auto choosing all), in steps of 512 otherwise.
TEST(CudaModelBatch, AutoBatchFollowsThePlacement) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string path = test::reference_path("tiny-qwen35.q8_0.gguf");
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    const HParams hp = HParams::from_gguf(*gguf::File::open(path));
    ModelOptions opt = options(256);
    opt.n_batch = kBatchAuto;
    opt.op_offload_min_batch = 0;
    opt.gpu_layers = int(hp.n_layer) + 1;
    EXPECT_EQ(Model::load(path, opt)->options().n_batch, kBatchFullGpu);
    opt.gpu_layers = kGpuLayersAuto;  // a tiny model fits whole on any GPU
    EXPECT_EQ(Model::load(path, opt)->options().n_batch, kBatchFullGpu);
    opt.gpu_layers = int(hp.n_layer);  // the head stays on the CPU
    EXPECT_EQ(Model::load(path, opt)->options().n_batch, kBatchDefault);
    opt.gpu_layers = 0;
    EXPECT_EQ(Model::load(path, opt)->options().n_batch, kBatchDefault);
}

class CudaSplit : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSplit, HalfTheLayersOnTheGpuMatchesCpu) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string path = test::reference_path(GetParam());
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    auto cpu = load_on(path, false, 64);
    const std::vector<float> lc = run_batch(*cpu, kS7);
    const HParams hp = HParams::from_gguf(*gguf::File::open(path));
    for (int gpu_first = 1; gpu_first >= 0; --gpu_first) {
        Placement pl;
        pl.backends.push_back(make_cuda_backend(0));
        pl.backends.push_back(make_cpu_backend(std::make_shared<ThreadPool>(2)));
        const int gpu = 0, host = 1;
        for (int64_t il = 0; il < hp.n_layer; ++il)
            pl.layer.push_back((il < hp.n_layer / 2) == bool(gpu_first) ? gpu : host);
        pl.embed = gpu_first ? gpu : host;
        pl.head = gpu_first ? host : gpu;
        auto split = Model::load(path, options(64), std::move(pl));
        const std::vector<float> ls = run_batch(*split, kS7);
        ASSERT_EQ(ls.size(), lc.size());
        double maxref = 0, maxdiff = 0;
        for (size_t i = 0; i < lc.size(); ++i) {
            maxref = std::max(maxref, double(std::fabs(lc[i])));
            maxdiff = std::max(maxdiff, double(std::fabs(lc[i] - ls[i])));
        }
        std::printf("%s, %s half on the GPU: max|cpu-split| %.3g\n", GetParam().c_str(), gpu_first ? "first" : "second",
                    maxdiff);
        EXPECT_LE(maxdiff, 1e-3 * maxref) << split->backend_description();
    }
}

INSTANTIATE_TEST_SUITE_P(Reference, CudaSplit,
                         ::testing::Values("tiny-qwen35.f16.gguf", "tiny-qwen35.q8_0.gguf", "tiny-qwen3.q4_k_m.gguf",
                                           "tiny-qwen2.q8_0.gguf"),
                         param_name);

// Long prompts: 256 tokens in one batch on the GPU against the CPU. The int8
// tensor-core products (QINFER_CUDA_PREFILL=mma) within 6e-2 x max |logit|:
// 8-bit activation roundings flipped by float order, amplified over the layers,
// as in LogitsMatchCpuBackend. The default for prompt steps, f16 weights and
// activations on cuBLAS, rounds differently from the CPU's 8-bit activations:
// bounded at 0.1 x max. And with every
// layer in host memory through prompt offload, which runs the same kernels on
// the same (streamed) weights: compared with the layers placed on the GPU and
// the embedding and head on the CPU, as in the offloaded model. Against the
// all-GPU model the offloaded logits were within 1e-6 (qwen2 q8_0) to 0.07
// (qwen3 q4_k_m, half the CPU/GPU gap: one activation rounding flipped); they
// must stay within half of the CPU/GPU gap.
class CudaLongPrompt : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaLongPrompt, GpuAndPromptOffloadMatchCpu) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string path = test::reference_path(GetParam());
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    const HParams hp = HParams::from_gguf(*gguf::File::open(path));
    std::vector<int32_t> ids;
    for (int i = 0; i < 256; ++i) ids.push_back(int32_t(100 + (i * 7919) % int(hp.n_vocab - 200)));
    ModelOptions opt = options(512);
    opt.n_batch = 256;
    auto last_rows = [&](Model& m) {
        Batch b;
        for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], int32_t(i), 0, i + 4 >= ids.size());
        std::vector<float> logits;
        m.forward(b, logits);
        return logits;
    };
    const std::vector<float> lc = last_rows(*Model::load(path, opt));
    double maxref = 0;
    for (float v : lc) maxref = std::max(maxref, double(std::fabs(v)));
    auto diff = [&](const std::vector<float>& l) {
        EXPECT_EQ(l.size(), lc.size());
        double d = 0;
        for (size_t i = 0; i < l.size() && i < lc.size(); ++i) d = std::max(d, double(std::fabs(l[i] - lc[i])));
        return d;
    };
    const std::vector<float> lg = last_rows(*load_gpu(path, opt));
    const double d_gpu = diff(lg);
    set_env("QINFER_CUDA_PREFILL", "mma");
    const double d_mma = diff(last_rows(*load_gpu(path, opt)));
    unset_env("QINFER_CUDA_PREFILL");

    // Every layer on the CPU, the prompt offloaded to the GPU.
    auto off = load_cpu_with_prompt_offload(path, opt);
    const std::vector<float> lo = last_rows(*off);
    EXPECT_EQ(off->offloaded_batches(), 1u) << off->backend_description();
    // The same placement of embedding and head (CPU), the layers on the GPU.
    Placement same;
    same.backends.push_back(make_cpu_backend(std::make_shared<ThreadPool>(2)));
    same.backends.push_back(make_cuda_backend(0));
    same.layer.assign(size_t(hp.n_layer), 1);
    const std::vector<float> ls = last_rows(*Model::load(path, opt, std::move(same)));
    double d_off_gpu = 0;
    for (size_t i = 0; i < ls.size() && i < lo.size(); ++i)
        d_off_gpu = std::max(d_off_gpu, double(std::fabs(ls[i] - lo[i])));
    std::printf("%s, 256-token prompt: max|cpu| %.3g, max|cpu-gpu| %.3g (int8 mma %.3g), prompt offload: "
                "max|cpu-offload| %.3g, max|gpu-offload| %.3g\n",
                GetParam().c_str(), maxref, d_gpu, d_mma, diff(lo), d_off_gpu);
    EXPECT_LE(d_mma, 6e-2 * maxref);
    EXPECT_LE(d_gpu, 1e-1 * maxref);
    // Offload runs the layers with the GPU's kernels, yet on two of the four
    // models its logits are not bit-identical to resident GPU layers (0.04 and
    // 0.1 on the H200; cause not established), and these tiny models amplify a
    // flipped activation rounding. So: the offloaded logits must be no further
    // from the GPU placement, nor from the CPU, than the two backends are from
    // each other (a broken upload is off by ~max|cpu|).
    EXPECT_LE(d_off_gpu, std::max(1e-3 * maxref, d_gpu));
    EXPECT_LE(diff(lo), std::max(1e-3 * maxref, 1.25 * d_gpu));
}

INSTANTIATE_TEST_SUITE_P(Reference, CudaLongPrompt,
                         ::testing::Values("tiny-qwen35.q8_0.gguf", "tiny-qwen35.q4_k_m.gguf", "tiny-qwen3.q4_k_m.gguf",
                                           "tiny-qwen2.q8_0.gguf"),
                         param_name);

// A q8_0 cache through prompt offload: the GPU runs the CPU-resident layers'
// attention on a copy of their cache rows (GGUF blocks on both backends) and
// writes the prompt's rows back, so the next token, decoded on the CPU from
// that cache, must agree with the all-CPU model as the prompt's own logits do
// (a wrong row layout moves them by the size of the logits).
TEST(CudaLongPromptQ8Cache, PromptOffloadFillsTheCpuCache) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string path = test::reference_path("tiny-qwen35.q8_0.gguf");
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    const HParams hp = HParams::from_gguf(*gguf::File::open(path));
    ModelOptions opt = options(512);
    opt.n_batch = 256;
    opt.kv_type = GgmlType::Q8_0;
    auto prompt_then_one = [&](Model& m) {
        Batch b;
        for (int i = 0; i < 256; ++i) b.add(int32_t(100 + (i * 7919) % int(hp.n_vocab - 200)), i, 0, i + 4 >= 256);
        std::vector<float> prompt, next;
        m.forward(b, prompt);
        Batch one;
        one.add(4242, 256, 0, true);
        m.forward(one, next);
        prompt.insert(prompt.end(), next.begin(), next.end());
        return prompt;
    };
    const std::vector<float> lc = prompt_then_one(*Model::load(path, opt));
    auto off = load_cpu_with_prompt_offload(path, opt);
    const std::vector<float> lo = prompt_then_one(*off);
    EXPECT_EQ(off->offloaded_batches(), 1u) << off->backend_description();
    ASSERT_EQ(lo.size(), lc.size());
    const size_t V = size_t(hp.n_vocab), next0 = lc.size() - V;
    double maxref = 0, d_prompt = 0, d_next = 0;
    for (size_t i = 0; i < lc.size(); ++i) {
        maxref = std::max(maxref, double(std::fabs(lc[i])));
        (i < next0 ? d_prompt : d_next) = std::max(i < next0 ? d_prompt : d_next, double(std::fabs(lc[i] - lo[i])));
    }
    std::printf("q8_0 cache, 256-token prompt offloaded: max|cpu| %.3g, prompt max|cpu-offload| %.3g, "
                "next token %.3g\n", maxref, d_prompt, d_next);
    EXPECT_LE(d_prompt, 1e-1 * maxref);
    EXPECT_LE(d_next, 1e-1 * maxref);
}

// Decode steps of several sequences (the server's batches) against the same
// sequences stepped one at a time. Up to 8 tokens a step runs the one-token
// product kernels, the split attention and the serial delta rule, whatever the
// batch: each row must be the same bits as the sequence alone. Larger steps
// take the tensor-core products, which round differently (the server's
// greedy completions then depend on batching): reported, and bounded as the
// long prompts are against the CPU (8-bit activation roundings flipped by
// float order, amplified over the layers of these tiny models).
class CudaBatchedDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaBatchedDecode, RowsMatchTheSequenceAlone) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string path = test::reference_path(GetParam());
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    const HParams hp = HParams::from_gguf(*gguf::File::open(path));
    constexpr int kSeqs = 16, kPrompt = 5;
    auto load = [&] {
        ModelOptions opt = options(64);
        opt.n_slots = kSeqs;
        auto m = load_gpu(path, opt);
        for (int s = 0; s < kSeqs; ++s) {  // a different prompt per sequence, one sequence per step
            Batch b;
            for (int i = 0; i < kPrompt; ++i)
                b.add(int32_t(100 + (s * 131 + i * 7919) % int(hp.n_vocab - 200)), i, s, i + 1 == kPrompt);
            std::vector<float> l;
            m->forward(b, l);
        }
        return m;
    };
    auto token = [&](int s) { return int32_t(300 + (s * 977) % int(hp.n_vocab - 400)); };
    // decode one token of every sequence, `per_step` sequences per step
    auto decode = [&](Model& m, int per_step) {
        std::vector<float> all, l;
        for (int s0 = 0; s0 < kSeqs; s0 += per_step) {
            Batch b;
            for (int s = s0; s < s0 + per_step; ++s) b.add(token(s), kPrompt, s, true);
            m.forward(b, l);
            all.insert(all.end(), l.begin(), l.end());
        }
        return all;
    };
    const std::vector<float> alone = decode(*load(), 1);
    double maxref = 0;
    for (float v : alone) maxref = std::max(maxref, double(std::fabs(v)));
    for (int per_step : {4, 8, 16}) {
        const std::vector<float> got = decode(*load(), per_step);
        ASSERT_EQ(got.size(), alone.size());
        double d = 0;
        for (size_t i = 0; i < got.size(); ++i) d = std::max(d, double(std::fabs(got[i] - alone[i])));
        const bool same = std::memcmp(got.data(), alone.data(), got.size() * 4) == 0;
        std::printf("%s, %d sequences per decode step: max|batch-alone| %.3g%s\n", GetParam().c_str(), per_step, d,
                    same ? " (bit-identical)" : "");
        if (per_step <= 8) {
            EXPECT_TRUE(same) << per_step << " sequences per step, max diff " << d;
        }
        EXPECT_LE(d, 6e-2 * maxref) << per_step << " sequences per step";
    }
}

INSTANTIATE_TEST_SUITE_P(Reference, CudaBatchedDecode,
                         ::testing::Values("tiny-qwen35.q4_k_m.gguf", "tiny-qwen35.q8_0.gguf", "tiny-qwen3.q4_k_m.gguf"),
                         param_name);

// Greedy continuation of the f16 / f32 models equals the reference ids up to the
// first step whose reference top-2 margin is too small to decide.
class CudaGreedy : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGreedy, EqualsReferenceIds) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string stem = GetParam();
    const std::string path = test::reference_path(stem + ".gguf");
    std::string jpath = test::reference_path(stem + ".s7.json");
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    if (!std::ifstream(jpath).good()) jpath = test::reference_path(stem.substr(stem.find('/') + 1) + ".s7.json");
    const nlohmann::json ref = nlohmann::json::parse(test::read_text(jpath));
    const std::vector<int32_t> greedy = ref["greedy"].get<std::vector<int32_t>>();
    // margin of greedy[0] is the last prompt row's; of greedy[i] the i-th decode step's
    std::vector<double> margin = {ref["top1_top2_margin"].get<std::vector<double>>().back()};
    for (double m : ref["greedy_top1_top2_margin"].get<std::vector<double>>()) margin.push_back(m);
    auto gpu = load_on(path, true, 64);
    const int64_t V = gpu->hparams().n_vocab;
    std::vector<float> logits = run_batch(*gpu, kS7);
    int next = argmax(&logits[(kS7.size() - 1) * size_t(V)], V);
    int pos = int(kS7.size());
    size_t checked = 0;
    for (size_t i = 0; i < greedy.size(); ++i) {
        if (i >= margin.size() || margin[i] < 0.05) break;  // undecidable at our tolerance
        ASSERT_EQ(next, greedy[i]) << "greedy step " << i;
        ++checked;
        Batch b;
        b.add(next, pos++, 0, true);
        gpu->forward(b, logits);
        next = argmax(logits.data(), V);
    }
    std::printf("%s: %zu greedy ids checked\n", stem.c_str(), checked);
}

INSTANTIATE_TEST_SUITE_P(Reference, CudaGreedy,
                         ::testing::Values("tiny-qwen35.f16", "large/tiny-qwen35.f32", "large/tiny-qwen3.f16",
                                           "large/tiny-qwen2.f16"),
                         param_name);

// Pipelined greedy decoding on the GPU: steps submitted one ahead, each fed the
// previous step's picks by a device copy inside the recorded input graph, give
// the ids of forward_argmax one step at a time (recorded and replayed step
// graphs on both sides), for one sequence and for two in one step.
class CudaPipelined : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaPipelined, ChainedStepsEqualForwardArgmax) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string path = test::reference_path(GetParam());
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    ModelOptions opt = options(64);
    opt.n_slots = 2;
    constexpr int kSteps = 12;
    for (int seqs : {1, 2}) {
        auto sync = load_gpu(path, opt), piped = load_gpu(path, opt);
        auto prompt = [&](Model& m) {
            Batch b;
            for (int s = 0; s < seqs; ++s)
                for (size_t i = 0; i < kS7.size(); ++i) b.add(kS7[(i + size_t(s)) % kS7.size()], int32_t(i), s, i + 1 == kS7.size());
            std::vector<int32_t> first;
            m.forward_argmax(b, first);
            return first;
        };
        const std::vector<int32_t> first = prompt(*sync);
        ASSERT_EQ(prompt(*piped), first);
        const int32_t p0 = int32_t(kS7.size());
        const auto want = test::greedy_steps(*sync, first, p0, kSteps, false);
        const auto got = test::greedy_steps(*piped, first, p0, kSteps, true);
        EXPECT_EQ(got, want) << seqs << " sequence(s)";
        EXPECT_EQ(piped->slot_length(0), p0 + kSteps);
    }
}

INSTANTIATE_TEST_SUITE_P(Reference, CudaPipelined,
                         ::testing::Values("tiny-qwen35.q4_k_m.gguf", "tiny-qwen3.q4_k_m.gguf"), param_name);

// forward_top on the GPU: each decode step's candidates (selected on the
// device, recorded in the step graph and replayed) are the best of the logits
// the same step gives on another slot, values bit for bit.
class CudaTop : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaTop, CandidatesAreTheBestLogits) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const std::string path = test::reference_path(GetParam());
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    ModelOptions opt = options(64);
    opt.n_slots = 2;
    auto gpu = load_gpu(path, opt);
    const int64_t V = gpu->hparams().n_vocab;
    std::vector<float> logits, top;
    std::vector<int32_t> ids;
    for (int n : {40, 256, 1}) {
        gpu->clear_slot(0);
        gpu->clear_slot(1);
        int32_t next = kS7[0];
        for (int pos = 0; pos < 10; ++pos) {  // token by token: the step graph records, then replays
            Batch b0, b1;
            b0.add(next, pos, 0, true);
            b1.add(next, pos, 1, true);
            gpu->forward(b0, logits);
            gpu->forward_top(b1, n, top, ids);
            ASSERT_EQ(ids.size(), size_t(n));
            const std::vector<int32_t> order = test::logit_order(logits.data(), V);
            for (int j = 0; j < n; ++j) {
                ASSERT_EQ(ids[size_t(j)], order[size_t(j)]) << "n " << n << " pos " << pos << " rank " << j;
                ASSERT_EQ(top[size_t(j)], logits[size_t(order[size_t(j)])]);
            }
            next = pos + 1 < int(kS7.size()) ? kS7[size_t(pos + 1)] : ids[0];
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Reference, CudaTop, ::testing::Values("tiny-qwen35.f16.gguf", "tiny-qwen3.q4_k_m.gguf"),
                         param_name);

}  // namespace
}  // namespace qinfer
