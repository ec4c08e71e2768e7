// `qinfer quantize` against llama-quantize's files for the tiny reference
// models: same per-tensor types, same bytes, and per-tensor RMS error vs the
// f32/f16 source within 5% of the reference file's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "testutil.h"

using namespace qinfer;

namespace {

bool exists(const std::string& name) { return std::filesystem::exists(test::reference_path(name)); }

std::vector<float> to_f32(const gguf::TensorInfo& t) {
    std::vector<float> v(size_t(t.n_elements()));
    const size_t rb = row_bytes(t.type, t.ne[0]);
    for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.type, t.data + size_t(r) * rb, v.data() + r * t.ne[0], t.ne[0]);
    return v;
}

double rms_error(const gguf::TensorInfo& q, const std::vector<float>& ref) {
    const std::vector<float> v = to_f32(q);
    double se = 0;
    for (size_t i = 0; i < v.size(); ++i) se += (double(v[i]) - ref[i]) * (double(v[i]) - ref[i]);
    return std::sqrt(se / double(v.size()));
}

std::string quantize(const std::string& src, const std::string& type, const std::string& out_name) {
    const std::string out = test::temp_dir() + "/" + out_name;
    std::string log;
    const int rc = test::run_command(test::qinfer_binary() + " quantize " + test::reference_path(src) + " " + out +
                                         " " + type + " -t 2",
                                     &log, true);
    EXPECT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("bits per weight"), std::string::npos) << log;
    return out;
}

}  // namespace

TEST(CliQuantize, MatchesLlamaQuantize) {
    struct Case { const char* src; const char* type; const char* ref; };
    int ran = 0;
    for (Case c : {Case{"large/tiny-qwen35.f32.gguf", "q4_k_m", "tiny-qwen35.q4_k_m.gguf"},
                   Case{"large/tiny-qwen35.f32.gguf", "q8_0", "tiny-qwen35.q8_0.gguf"},
                   Case{"tiny-qwen35.f16.gguf", "q4_k_m", "tiny-qwen35.q4_k_m.gguf"},
                   Case{"large/tiny-qwen3.f16.gguf", "q4_k_m", "tiny-qwen3.q4_k_m.gguf"},
                   Case{"large/tiny-qwen2.f16.gguf", "q8_0", "tiny-qwen2.q8_0.gguf"}}) {
        if (!exists(c.src) || !exists(c.ref)) continue;
        SCOPED_TRACE(std::string(c.src) + " " + c.type);
        ++ran;
        const std::string out = quantize(c.src, c.type, "out.gguf");
        auto src = gguf::File::open(test::reference_path(c.src));
        auto got = gguf::File::open(out);
        auto ref = gguf::File::open(test::reference_path(c.ref));
        ASSERT_EQ(got->tensors().size(), ref->tensors().size());
        int identical = 0;
        for (size_t i = 0; i < ref->tensors().size(); ++i) {
            const auto& g = got->tensors()[i];
            const auto& r = ref->tensors()[i];
            ASSERT_EQ(g.name, r.name);
            EXPECT_EQ(type_name(g.type), std::string(type_name(r.type))) << g.name;
            if (g.type != r.type || g.nbytes != r.nbytes) continue;
            identical += std::memcmp(g.data, r.data, g.nbytes) == 0;
            if (!is_quantized(g.type)) continue;
            const std::vector<float> x = to_f32(*src->find_tensor(g.name));
            EXPECT_LE(rms_error(g, x), 1.05 * rms_error(r, x)) << g.name;
        }
        // Reference quantizers without an importance matrix: llama-quantize's exact bytes.
        EXPECT_EQ(identical, int(ref->tensors().size()));
        EXPECT_EQ(got->require_uint("general.file_type"), ref->require_uint("general.file_type"));
    }
    if (!ran) GTEST_SKIP() << "reference data not found";
}

TEST(CliQuantize, OtherMixesFollowTheRules) {
    if (!exists("tiny-qwen35.f16.gguf")) GTEST_SKIP() << "reference data not found";
    auto src = gguf::File::open(test::reference_path("tiny-qwen35.f16.gguf"));
    std::map<std::string, double> rms_by_type;
    for (const char* type : {"q4_k_s", "q5_k_m", "q6_k", "q4_0"}) {
        SCOPED_TRACE(type);
        auto f = gguf::File::open(quantize("tiny-qwen35.f16.gguf", type, std::string(type) + ".gguf"));
        auto type_of = [&](const char* name) { return std::string(type_name(f->find_tensor(name)->type)); };
        // Never quantized: norms, ssm_conv1d, ssm_a.
        EXPECT_EQ(type_of("blk.0.attn_norm.weight"), "F32");
        EXPECT_EQ(type_of("blk.0.ssm_conv1d.weight"), "F32");
        EXPECT_EQ(type_of("blk.0.ssm_a"), "F32");
        // Tied embeddings are the LM head: Q6_K for every mix here.
        EXPECT_EQ(type_of("token_embd.weight"), "Q6_K");
        const std::string t(type);
        if (t == "q4_k_s") {
            EXPECT_EQ(type_of("blk.0.attn_qkv.weight"), "Q5_K");  // first 4 attn_v-like tensors
            EXPECT_EQ(type_of("blk.3.attn_v.weight"), "Q5_K");
            EXPECT_EQ(type_of("blk.4.attn_qkv.weight"), "Q4_K");
            EXPECT_EQ(type_of("blk.0.ffn_down.weight"), "Q5_K");  // layers < n_layer / 8
            EXPECT_EQ(type_of("blk.1.ffn_down.weight"), "Q4_K");
            EXPECT_EQ(type_of("blk.0.ssm_out.weight"), "Q5_0");  // 128 columns: Q4_K falls back
        } else if (t == "q5_k_m") {
            EXPECT_EQ(type_of("blk.0.attn_qkv.weight"), "Q6_K");
            EXPECT_EQ(type_of("blk.1.attn_qkv.weight"), "Q5_K");
            EXPECT_EQ(type_of("blk.7.ffn_down.weight"), "Q6_K");
            EXPECT_EQ(type_of("blk.0.ssm_out.weight"), "Q5_1");  // Q5_K falls back
        } else if (t == "q6_k") {
            EXPECT_EQ(type_of("blk.1.ffn_up.weight"), "Q6_K");
            EXPECT_EQ(type_of("blk.0.ssm_out.weight"), "Q8_0");  // Q6_K falls back
        } else {
            EXPECT_EQ(type_of("blk.1.ffn_up.weight"), "Q4_0");
            EXPECT_EQ(type_of("blk.0.ssm_out.weight"), "Q4_0");
        }
        EXPECT_EQ(f->require_uint("general.quantization_version"), 2u);
        const auto& q = *f->find_tensor("blk.1.ffn_up.weight");
        rms_by_type[t] = rms_error(q, to_f32(*src->find_tensor(q.name)));
    }
    // More bits, less error.
    EXPECT_LT(rms_by_type["q6_k"], rms_by_type["q5_k_m"]);
    EXPECT_LT(rms_by_type["q5_k_m"], rms_by_type["q4_k_s"]);
    EXPECT_LT(rms_by_type["q4_k_s"], rms_by_type["q4_0"]);
}

TEST(CliQuantize, BadArgumentsGiveAMessage) {
    std::string log;
    EXPECT_NE(test::run_command(test::qinfer_binary() + " quantize in.gguf out.gguf q9_9", &log, true), 0);
    EXPECT_NE(log.find("unknown type 'q9_9'"), std::string::npos) << log;
    log.clear();
    EXPECT_NE(test::run_command(test::qinfer_binary() + " quantize /nonexistent.gguf " + test::temp_dir() +
                                    "/x.gguf q8_0",
                                &log, true),
              0);
    EXPECT_NE(log.find("nonexistent.gguf"), std::string::npos) << log;
}
