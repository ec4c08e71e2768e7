// The independent oracle: tiny random Qwen2 / Qwen3 / Qwen3.5 models saved by
// Hugging Face transformers (tests/data/hf-tiny-*, made by tools/make_reference.py
// on the GPU machine) are converted with `qinfer convert --outtype f32`, and our
// CPU logits must match transformers' float32 logits:
// max |ours - ref| <= 2e-3 * max |ref| for every prompt.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace qinfer;
using namespace qinfer::test;

namespace {

class TinyLogits : public ::testing::TestWithParam<const char*> {};

std::string fixture(const std::string& model) { return source_dir() + "/tests/data/hf-tiny-" + model; }

}  // namespace

TEST_P(TinyLogits, MatchesTransformers) {
    const std::string model = GetParam();
    const std::string dir = fixture(model);
    if (!fs::exists(dir + "/ids.json"))
        GTEST_SKIP() << "fixture tests/data/hf-tiny-" << model
                     << " is missing: run `python3 tools/make_reference.py` on the GPU machine "
                        "(docs/model-tooling.md) and commit its output";
    nlohmann::json meta = nlohmann::json::parse(read_text(dir + "/ids.json"));
    const int64_t n_vocab = meta["n_vocab"].get<int64_t>();

    const std::string out = temp_dir() + "/tiny-" + model + ".f32.gguf";
    std::string log;
    ASSERT_EQ(run_command(qinfer_binary() + " convert " + dir + " " + out + " --outtype f32", &log, true), 0) << log;

    // The converted vocabulary tokenizes the chat prompt exactly as HF did.
    auto f = gguf::File::open(out);
    Tokenizer tok(*f);
    for (const auto& p : meta["prompts"]) {
        if (p["name"] != "chat") continue;
        auto ids = tok.encode("<|im_start|>user\nHello world, how are you?<|im_end|>\n<|im_start|>assistant\n");
        EXPECT_EQ(ids, p["ids"].get<std::vector<int32_t>>());
    }

    for (const auto& p : meta["prompts"]) {
        const std::string name = p["name"].get<std::string>();
        SCOPED_TRACE(model + "/" + name);
        const auto ids = p["ids"].get<std::vector<int32_t>>();
        std::string ids_str;
        for (int32_t id : ids) ids_str += (ids_str.empty() ? "" : ",") + std::to_string(id);
        const std::string lo = temp_dir() + "/tiny-" + model + "." + name + ".logits";
        ASSERT_EQ(run_command(qinfer_binary() + " logits -m " + out + " --ids " + ids_str + " -o " + lo +
                                  " --kv-type f32 -t 2",
                              &log, true),
                  0)
            << log;
        const std::vector<float> ours = read_f32(lo);
        const std::vector<float> ref = read_f32(dir + "/logits." + name + ".f32");
        ASSERT_EQ(ref.size(), ids.size() * size_t(n_vocab)) << "fixture logits file has the wrong size";
        ASSERT_EQ(ours.size(), ref.size());
        float max_ref = 0, max_diff = 0;
        size_t at = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
            max_ref = std::max(max_ref, std::fabs(ref[i]));
            const float d = std::fabs(ours[i] - ref[i]);
            if (!(d <= max_diff)) {  // also catches NaN
                max_diff = d;
                at = i;
            }
        }
        EXPECT_LE(max_diff, 2e-3f * max_ref) << "max |diff| " << max_diff << " at token " << at / size_t(n_vocab)
                                             << " logit " << at % size_t(n_vocab) << " (max |ref| " << max_ref << ")";
        std::printf("[ %s/%s ] %zu tokens: max|diff| %.3g, max|ref| %.3g, ratio %.2e\n", model.c_str(), name.c_str(),
                    ids.size(), max_diff, max_ref, max_diff / max_ref);
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TinyLogits, ::testing::Values("qwen2", "qwen3", "qwen35"));
