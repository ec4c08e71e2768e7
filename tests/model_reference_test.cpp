// Logits and greedy continuations of every tiny reference model against the
// llama.cpp reference files (reference/MANIFEST.md §4), two ways:
//
// 1. Against the same math in f32 activations ("exact"): the f32 model's own
//    files, the ".deqf32" files of the f16 models, and for the quantized models
//    the ".deqf32" files with our engine run on a dequantized F32 copy of the
//    GGUF. Tolerance 1e-3 of the largest logit, top-1 everywhere but near-ties,
//    greedy continuation up to the first near-tie.
// 2. Against the native files, which contain llama.cpp's activation rounding
//    (Q8 activations for quantized weights, f16 for F16 weights). Our CPU
//    kernels quantize activations the same way, but a single rounding flip
//    caused by a last-bit difference upstream (summation order, exp) moves the
//    logits by ~0.05 and the flips are chaotic, so we require 2e-2 of the
//    largest logit for f16 and 3e-2 for q8_0/q4_k_m (measured: up to 2.5e-2 on
//    tiny-qwen35.q4_k_m s64; llama.cpp's own native-vs-deqf32 gap is 2-12%),
//    plus top-1 agreement away from near-ties.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "model/model.h"
#include "quant/quant.h"
#include "testutil.h"

namespace qinfer {
namespace {

namespace fs = std::filesystem;
using test::reference_path;

enum class Kind { F32, F16, Quant };

struct Case {
    const char* model;  // file stem in reference/ or reference/large/
    Kind kind;
    const char* exact;  // stem of the f32-activation reference files
};

const Case kCases[] = {
    {"tiny-qwen35.f32", Kind::F32, "tiny-qwen35.f32"},
    {"tiny-qwen35.f16", Kind::F16, "tiny-qwen35.f32"},  // bit-identical weight values (MANIFEST §3.1)
    {"tiny-qwen35.q8_0", Kind::Quant, "tiny-qwen35.q8_0.deqf32"},
    {"tiny-qwen35.q4_k_m", Kind::Quant, "tiny-qwen35.q4_k_m.deqf32"},
    {"tiny-qwen3.f16", Kind::F16, "tiny-qwen3.f16.deqf32"},
    {"tiny-qwen3.q4_k_m", Kind::Quant, "tiny-qwen3.q4_k_m.deqf32"},
    {"tiny-qwen2.f16", Kind::F16, "tiny-qwen2.f16.deqf32"},
    {"tiny-qwen2.q8_0", Kind::Quant, "tiny-qwen2.q8_0.deqf32"},
};

// reference/<name> or reference/large/<name>; empty if neither exists.
std::string find_ref(const std::string& name) {
    for (const char* dir : {"", "large/"}) {
        std::string p = reference_path(dir + name);
        if (fs::exists(p)) return p;
    }
    return "";
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(test::read_text(path)); }

int argmax(const float* v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (v[i] > v[best]) best = i;
    return int(best);
}

struct Stats {
    double max_diff = 0, max_ref = 0;
    int compared = 0, agree = 0;
    std::string first_mismatch;
};

// Logit differences and top-1 agreement on positions whose reference margin
// is at least margin_skip.
Stats compare(const std::vector<float>& got, const std::vector<float>& ref, int64_t V, const nlohmann::json& j,
              double margin_skip) {
    Stats s;
    EXPECT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
        s.max_diff = std::max(s.max_diff, double(std::fabs(got[i] - ref[i])));
        s.max_ref = std::max(s.max_ref, double(std::fabs(ref[i])));
    }
    const auto& margins = j["top1_top2_margin"];
    const auto& am = j["argmax"];
    for (size_t t = 0; t < margins.size() && (t + 1) * size_t(V) <= got.size(); ++t) {
        if (margins[t].get<double>() < margin_skip) continue;
        ++s.compared;
        const int a = argmax(&got[t * size_t(V)], V);
        if (a == am[t].get<int>()) ++s.agree;
        else if (s.first_mismatch.empty())
            s.first_mismatch = "position " + std::to_string(t) + ": got " + std::to_string(a) + ", want " +
                               std::to_string(am[t].get<int>());
    }
    return s;
}

std::unique_ptr<Model> load(const std::string& path, GgmlType kv) {
    ModelOptions opt;
    opt.n_ctx = 96;
    opt.n_batch = 64;
    opt.n_threads = 1;  // CI runs tests in parallel on 2 cores
    opt.kv_type = kv;
    return Model::load(path, opt);
}

// Logits of every prompt position (one batch), then `n_greedy` greedy ids:
// the argmax of the last row, each next one from a 1-token decode.
struct RunResult {
    std::vector<float> logits;
    std::vector<int> greedy;
};
RunResult run(Model& m, const std::vector<int>& ids, size_t n_greedy) {
    RunResult r;
    Batch b;
    for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], int32_t(i), 0, true);
    m.forward(b, r.logits);
    const int64_t V = m.hparams().n_vocab;
    r.greedy.push_back(argmax(&r.logits[(ids.size() - 1) * size_t(V)], V));
    std::vector<float> lg;
    while (r.greedy.size() < n_greedy) {
        Batch d;
        d.add(r.greedy.back(), int32_t(ids.size() + r.greedy.size() - 1), 0, true);
        m.forward(d, lg);
        r.greedy.push_back(argmax(lg.data(), V));
    }
    return r;
}

// Greedy ids up to the first step whose reference margin is below margin_skip.
void expect_greedy(const std::vector<int>& have, const nlohmann::json& j, double margin_skip, const std::string& what) {
    const std::vector<int> want = j["greedy"].get<std::vector<int>>();
    const std::vector<double> gm = j["greedy_top1_top2_margin"].get<std::vector<double>>();  // steps 2..n
    size_t n = 1;
    while (n < want.size() && n - 1 < gm.size() && gm[n - 1] >= margin_skip) ++n;
    ASSERT_GE(have.size(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(have[i], want[i]) << what << " greedy step " << i;
    std::printf("[ %s ] greedy: %zu of %zu steps compared\n", what.c_str(), n, want.size());
}

// An F32 copy of a GGUF (every quantized tensor dequantized), as llama.cpp's
// llama_model_quantize(..., F32) made for the ".deqf32" references.
std::string dequantized_copy(const std::string& src) {
    static std::map<std::string, std::string> made;
    if (auto it = made.find(src); it != made.end()) return it->second;
    auto f = gguf::File::open(src);
    gguf::Writer w;
    w.copy_metadata(*f);
    w.set_u32("general.file_type", 0);
    for (const gguf::TensorInfo& ti : f->tensors()) {
        std::vector<int64_t> ne(ti.ne, ti.ne + ti.n_dims);
        if (ti.type == GgmlType::F32) {
            w.add_tensor(ti.name, ti.type, ne, ti.data);
            continue;
        }
        const gguf::TensorInfo* info = &ti;
        w.add_tensor(ti.name, GgmlType::F32, ne, [info](const gguf::ByteSink& out) {
            std::vector<float> row(static_cast<size_t>(info->ne[0]));
            const size_t rb = row_bytes(info->type, info->ne[0]);
            for (int64_t r = 0; r < info->rows(); ++r) {
                dequantize_row(info->type, info->data + size_t(r) * rb, row.data(), info->ne[0]);
                out(row.data(), row.size() * 4);
            }
        });
    }
    std::string path = test::temp_dir() + "/" + fs::path(src).stem().string() + ".deqf32.gguf";
    w.write(path);
    return made[src] = path;
}

class ReferenceTest : public ::testing::TestWithParam<std::tuple<Case, const char*>> {};

TEST_P(ReferenceTest, ExactMath) {
    const Case c = std::get<0>(GetParam());
    const std::string seq = std::get<1>(GetParam());
    const std::string model_path = find_ref(std::string(c.model) + ".gguf");
    const std::string json_path = find_ref(std::string(c.exact) + "." + seq + ".json");
    if (model_path.empty() || json_path.empty()) GTEST_SKIP() << c.model << ": reference files not available";
    const nlohmann::json j = read_json(json_path);
    const std::vector<float> ref = test::read_f32(find_ref(std::string(c.exact) + "." + seq + ".logits.bin"));

    // F32 and F16 weights run with f32 activations; quantized weights would not,
    // so those run from a dequantized copy.
    auto m = load(c.kind == Kind::Quant ? dequantized_copy(model_path) : model_path, GgmlType::F32);
    const RunResult r = run(*m, j["ids"].get<std::vector<int>>(), 16);
    const Stats s = compare(r.logits, ref, m->hparams().n_vocab, j, 2e-3);
    std::printf("[ %s %s ] vs %s: max|diff| %.3g (%.3g of max|ref| %.3g), top-1 %d/%d\n", c.model, seq.c_str(),
                c.exact, s.max_diff, s.max_diff / s.max_ref, s.max_ref, s.agree, s.compared);
    EXPECT_LE(s.max_diff, 1e-3 * s.max_ref);
    EXPECT_EQ(s.agree, s.compared) << s.first_mismatch;
    expect_greedy(r.greedy, j, 2e-3, std::string(c.model) + " " + seq + " vs " + c.exact);
}

TEST_P(ReferenceTest, NativeLogits) {
    const Case c = std::get<0>(GetParam());
    const std::string seq = std::get<1>(GetParam());
    const std::string model_path = find_ref(std::string(c.model) + ".gguf");
    const std::string json_path = find_ref(std::string(c.model) + "." + seq + ".json");
    if (model_path.empty() || json_path.empty()) GTEST_SKIP() << c.model << ": reference files not available";
    const nlohmann::json j = read_json(json_path);
    const std::vector<float> ref = test::read_f32(find_ref(std::string(c.model) + "." + seq + ".logits.bin"));

    // The references ran with an f32 KV cache.
    auto m = load(model_path, GgmlType::F32);
    const RunResult r = run(*m, j["ids"].get<std::vector<int>>(), c.kind == Kind::Quant ? 1 : 16);
    const double rel_tol = c.kind == Kind::F32 ? 1e-3 : c.kind == Kind::F16 ? 2e-2 : 3e-2;
    // Positions whose reference margin is within twice the noise are near-ties.
    const double margin_skip = c.kind == Kind::F32 ? 2e-3 : c.kind == Kind::F16 ? 0.04 : 0.3;
    const Stats s = compare(r.logits, ref, m->hparams().n_vocab, j, margin_skip);
    std::printf("[ %s %s ] native: max|diff| %.3g (%.3g of max|ref| %.3g), top-1 %d/%d\n", c.model, seq.c_str(),
                s.max_diff, s.max_diff / s.max_ref, s.max_ref, s.agree, s.compared);
    EXPECT_LE(s.max_diff, rel_tol * s.max_ref);
    EXPECT_GE(s.agree, int(std::ceil(0.99 * s.compared))) << s.first_mismatch;
    if (c.kind != Kind::Quant) expect_greedy(r.greedy, j, margin_skip, std::string(c.model) + " " + seq);
}

TEST(ReferenceF16Cache, StaysWithinTolerance) {
    // The default f16 KV cache on the hybrid model: same bounds as the native f16 test.
    const std::string model_path = find_ref("tiny-qwen35.f16.gguf");
    if (model_path.empty()) GTEST_SKIP() << "reference files not available";
    const nlohmann::json j = read_json(find_ref("tiny-qwen35.f16.s64.json"));
    const std::vector<float> ref = test::read_f32(find_ref("tiny-qwen35.f16.s64.logits.bin"));
    auto m = load(model_path, GgmlType::F16);
    const RunResult r = run(*m, j["ids"].get<std::vector<int>>(), 1);
    const Stats s = compare(r.logits, ref, m->hparams().n_vocab, j, 0.04);
    std::printf("[ tiny-qwen35.f16 s64 f16 KV ] max|diff| %.3g (%.3g of max|ref|), top-1 %d/%d\n", s.max_diff,
                s.max_diff / s.max_ref, s.agree, s.compared);
    EXPECT_LE(s.max_diff, 2e-2 * s.max_ref);
    EXPECT_EQ(s.agree, s.compared) << s.first_mismatch;
}

// A q8_0 KV cache (CPU backend) on the three architectures: K and V rows
// rounded to 8 bits per element move these tiny random models' logits by up to
// 4.1% of the largest (tiny-qwen3.q4_k_m s64; 0.4% for the f16 model), so the
// bound is 6% and top-1 agreement on 90% of the positions away from near-ties
// (the quantized models' 0.3 margin). Also: its snapshots restore the same
// state (the server's prompt cache copies q8_0 rows as bytes).
TEST(ReferenceQ8Cache, StaysWithinTolerance) {
    for (const char* stem : {"tiny-qwen35.q4_k_m", "tiny-qwen35.f16", "tiny-qwen3.q4_k_m", "tiny-qwen2.q8_0"}) {
        const std::string model_path = find_ref(std::string(stem) + ".gguf");
        const std::string json_path = find_ref(std::string(stem) + ".s64.json");
        if (model_path.empty() || json_path.empty()) GTEST_SKIP() << stem << ": reference files not available";
        const nlohmann::json j = read_json(json_path);
        const std::vector<float> ref = test::read_f32(find_ref(std::string(stem) + ".s64.logits.bin"));
        auto m = load(model_path, GgmlType::Q8_0);
        const std::vector<int> ids = j["ids"].get<std::vector<int>>();
        const RunResult r = run(*m, ids, 1);
        const Stats s = compare(r.logits, ref, m->hparams().n_vocab, j, 0.3);
        std::printf("[ %s s64 q8_0 KV ] max|diff| %.3g (%.3g of max|ref|), top-1 %d/%d\n", stem, s.max_diff,
                    s.max_diff / s.max_ref, s.agree, s.compared);
        EXPECT_LE(s.max_diff, 6e-2 * s.max_ref) << stem;
        EXPECT_GE(s.agree, int(std::ceil(0.9 * s.compared))) << stem << ": " << s.first_mismatch;

        // snapshot after the prompt, one more token, restore, the same token again: the same logits
        const int64_t V = m->hparams().n_vocab;
        const auto snap = m->save_slot(0);
        std::vector<float> a, b;
        Batch d;
        d.add(r.greedy[0], int32_t(ids.size()), 0, true);
        m->forward(d, a);
        m->restore_slot(0, *snap);
        m->forward(d, b);
        ASSERT_EQ(a.size(), size_t(V));
        EXPECT_EQ(a, b) << stem << ": the restored q8_0 cache gave other logits";
    }
}

std::string case_name(const ::testing::TestParamInfo<ReferenceTest::ParamType>& info) {
    std::string s = std::string(std::get<0>(info.param).model) + "_" + std::get<1>(info.param);
    for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return s;
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ReferenceTest,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values("s7", "s64")), case_name);

}  // namespace
}  // namespace qinfer
