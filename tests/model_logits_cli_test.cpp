// `qinfer logits` writes [n_ids][n_vocab] float32 for the ids run as one
// prompt, and fails with a one-line error on bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "testutil.h"

namespace qinfer {
namespace {

const char* kIds = "8193,872,198,39,4791,1879,8194";  // reference sequence s7

TEST(LogitsCli, WritesEveryPositionLikeTheReference) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not available";
    const std::string out = test::temp_dir() + "/s7.logits.bin";
    std::string log;
    const int rc = test::run_command(test::qinfer_binary() + " logits -m " +
                                         test::reference_path("tiny-qwen3.q4_k_m.gguf") + " --ids " + kIds +
                                         " --out " + out + " -t 1 --kv-type f32",
                                     &log, true);
    ASSERT_EQ(rc, 0) << log;
    const std::vector<float> got = test::read_f32(out);
    const std::vector<float> ref = test::read_f32(test::reference_path("tiny-qwen3.q4_k_m.s7.logits.bin"));
    ASSERT_EQ(got.size(), ref.size());
    ASSERT_EQ(got.size(), 7u * 8218);
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        max_diff = std::max(max_diff, double(std::fabs(got[i] - ref[i])));
        max_ref = std::max(max_ref, double(std::fabs(ref[i])));
    }
    EXPECT_LE(max_diff, 3e-2 * max_ref);
}

TEST(LogitsCli, BadInputIsAOneLineError) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not available";
    const std::string model = test::reference_path("tiny-qwen3.q4_k_m.gguf");
    const std::string out = test::temp_dir() + "/bad.bin";
    for (const std::string& args : {std::string(" --ids 1,99999"), std::string(" --ids 1,x"),
                                    std::string(" --ids 1,2,3 -c 2")}) {
        std::string log;
        const int rc = test::run_command(test::qinfer_binary() + " logits -m " + model + args + " --out " + out, &log, true);
        EXPECT_NE(rc, 0) << args;
        EXPECT_NE(log.find("error:"), std::string::npos) << args << ": " << log;
        EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << args << ": " << log;
    }
}

}  // namespace
}  // namespace qinfer
