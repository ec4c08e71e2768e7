// QINFER_DUMP writes the named intermediates of a forward pass, with their
// shapes, and the dumped values are the ones the model computes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "gguf/gguf.h"
#include "model/model.h"
#include "testutil.h"

namespace qinfer {
namespace {

TEST(ModelDump, WritesNamedIntermediates) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not available";
    const std::string model_path = test::reference_path("tiny-qwen35.f16.gguf");
    const std::string dir = test::temp_dir() + "/dump";
    test::set_env("QINFER_DUMP", dir.c_str());
    ModelOptions opt;
    opt.n_ctx = 16;
    opt.n_batch = 8;
    opt.n_threads = 1;
    auto m = Model::load(model_path, opt);
    test::unset_env("QINFER_DUMP");
    Batch b;
    for (int i = 0; i < 3; ++i) b.add(100 + i, i, 0, true);
    std::vector<float> logits;
    m->forward(b, logits);

    const std::string index = test::read_text(dir + "/index.txt");
    for (const char* line : {"0.0.linear_attn_qkv_mixed {256, 3}", "0.0.conv_output_silu {256, 3}",
                             "0.0.final_output {32, 4, 3}", "0.3.Qcur {64, 4, 3}", "0.3.attn_gated {64, 4, 3}",
                             "0.7.l_out {256, 3}", "0.head.result_norm {256, 3}"})
        EXPECT_NE(index.find(line), std::string::npos) << line << "\n" << index;

    // result_norm = RMSNorm(last layer output; output_norm).
    const std::vector<float> x = test::read_f32(dir + "/0.7.l_out.f32");
    const std::vector<float> y = test::read_f32(dir + "/0.head.result_norm.f32");
    ASSERT_EQ(x.size(), 3u * 256);
    ASSERT_EQ(y.size(), 3u * 256);
    auto f = gguf::File::open(model_path);
    const float* w = reinterpret_cast<const float*>(f->find_tensor("output_norm.weight")->data);
    for (int t = 0; t < 3; ++t) {
        double ss = 0;
        for (int i = 0; i < 256; ++i) ss += double(x[size_t(t * 256 + i)]) * x[size_t(t * 256 + i)];
        const double s = 1.0 / std::sqrt(ss / 256 + 1e-6);
        for (int i = 0; i < 256; ++i) ASSERT_NEAR(y[size_t(t * 256 + i)], x[size_t(t * 256 + i)] * s * w[i], 1e-4);
    }
}

}  // namespace
}  // namespace qinfer
