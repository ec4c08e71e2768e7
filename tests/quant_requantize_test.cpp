// requantize_file against llama-quantize's output for the tiny reference
// models: same tensor order, same types, and (reference quantizers, no
// importance matrix) the same bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "common/error.h"
#include "gguf/gguf.h"
#include "quant/requantize.h"
#include "testutil.h"

using namespace qinfer;

namespace {

bool exists(const std::string& name) { return std::filesystem::exists(test::reference_path(name)); }

// The Q8_0 ftype mix: every quantizable matrix becomes Q8_0 (spec/quants.md §9.1).
GgmlType q8_0_policy(const gguf::TensorInfo& t) {
    const bool matrix = t.n_dims >= 2 && t.ne[1] > 1;
    const bool eligible = matrix && t.name.size() >= 6 && t.name.compare(t.name.size() - 6, 6, "weight") == 0 &&
                          t.name.find("_norm.weight") == std::string::npos &&
                          t.name.find("ssm_conv1d") == std::string::npos;
    return eligible ? GgmlType::Q8_0 : t.type;
}

void expect_same_tensors(const gguf::File& got, const gguf::File& want) {
    ASSERT_EQ(got.tensors().size(), want.tensors().size());
    for (size_t i = 0; i < got.tensors().size(); ++i) {
        const auto& g = got.tensors()[i];
        const auto& w = want.tensors()[i];
        ASSERT_EQ(g.name, w.name) << "tensor " << i;
        EXPECT_EQ(g.type, w.type) << g.name;
        ASSERT_EQ(g.nbytes, w.nbytes) << g.name;
        EXPECT_EQ(std::memcmp(g.data, w.data, g.nbytes), 0) << g.name << ": data differs";
    }
}

}  // namespace

TEST(QuantRequantize, VisitOrderIsLlamaCpps) {
    if (!exists("tiny-qwen35.q4_k_m.gguf")) GTEST_SKIP() << "reference data not found";
    // The F16 file is in converter order; the quantized one in llama-quantize's.
    auto src = gguf::File::open(test::reference_path("tiny-qwen35.f16.gguf"));
    auto ref = gguf::File::open(test::reference_path("tiny-qwen35.q4_k_m.gguf"));
    const auto order = tensor_visit_order(*src);
    ASSERT_EQ(order.size(), ref->tensors().size());
    for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i]->name, ref->tensors()[i].name) << i;
    EXPECT_NE(src->tensors()[0].name, ref->tensors()[0].name);  // the test is not vacuous
}

TEST(QuantRequantize, Q8_0MatchesLlamaQuantizeByteForByte) {
    struct Case { const char* src; const char* ref; };
    for (Case c : {Case{"tiny-qwen35.f16.gguf", "tiny-qwen35.q8_0.gguf"},
                   Case{"large/tiny-qwen2.f16.gguf", "tiny-qwen2.q8_0.gguf"}}) {
        if (!exists(c.src) || !exists(c.ref)) {
            std::printf("skipping %s (reference data not found)\n", c.src);
            continue;
        }
        SCOPED_TRACE(c.src);
        auto src = gguf::File::open(test::reference_path(c.src));
        const std::string out = test::temp_dir() + "/q8_0.gguf";
        RequantizeOptions o;
        o.n_threads = 2;
        o.file_type = 7;  // LLAMA_FTYPE_MOSTLY_Q8_0
        o.choose_type = q8_0_policy;
        const RequantizeStats st = requantize_file(*src, out, o);
        auto got = gguf::File::open(out);
        auto ref = gguf::File::open(test::reference_path(c.ref));
        expect_same_tensors(*got, *ref);
        EXPECT_EQ(got->require_uint("general.file_type"), 7u);
        EXPECT_EQ(got->require_uint("general.quantization_version"), 2u);
        EXPECT_EQ(st.out_file_bytes, got->total_file_bytes());
        EXPECT_GT(st.n_converted, 10);
        EXPECT_NEAR(st.bits_per_weight(), 8.5, 0.3);  // almost everything is Q8_0
    }
}

TEST(QuantRequantize, RowsThatDoNotFitTheBlockAreAnError) {
    if (!exists("tiny-qwen35.f16.gguf")) GTEST_SKIP() << "reference data not found";
    auto src = gguf::File::open(test::reference_path("tiny-qwen35.f16.gguf"));
    RequantizeOptions o;
    o.choose_type = [](const gguf::TensorInfo& t) { return t.n_dims >= 2 ? GgmlType::Q4_K : t.type; };
    try {
        requantize_file(*src, test::temp_dir() + "/bad.gguf", o);
        FAIL() << "no error";
    } catch (const Error& e) {
        // ssm_out has 128 columns (and ssm_conv1d 4): not a multiple of 256.
        EXPECT_NE(std::string(e.what()).find("not a multiple of the Q4_K block size"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(test::temp_dir() + "/bad.gguf"));
}
