// `qinfer plan`: JSON field names and types scripts depend on, the numbers
// they carry, and one-line errors for bad flags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "plan/gpus.h"
#include "plan/planner.h"
#include "testutil.h"

using namespace qinfer;

namespace {

struct Result {
    int rc;
    std::string out;
};

Result plan(const std::string& args, bool merge_stderr = false) {
    Result r;
    r.rc = test::run_command(test::qinfer_binary() + " plan " + args, &r.out, merge_stderr);
    return r;
}

nlohmann::json plan_json(const std::string& args) {
    Result r = plan(args + " --json");
    EXPECT_EQ(r.rc, 0) << args << "\n" << r.out;
    return nlohmann::json::parse(r.out);
}

const char* kRequired[] = {"kv_bytes_per_token", "recurrent_state_bytes_per_sequence", "weights_bytes_gpu",
                           "weights_bytes_host", "gpu_layers", "max_context", "total_bytes_gpu"};

}  // namespace

TEST(PlanCli, JsonFieldsQwen35Preset) {
    nlohmann::json j = plan_json("--arch-preset qwen35-4b-q4_k_m --vram 8GiB");
    ASSERT_TRUE(j.is_object());
    for (const char* k : kRequired) {
        ASSERT_TRUE(j.contains(k)) << k;
        EXPECT_TRUE(j[k].is_number_integer()) << k << " = " << j[k].dump();
    }
    EXPECT_EQ(j["kv_bytes_per_token"].get<uint64_t>(), 32768u);
    EXPECT_EQ(j["recurrent_state_bytes_per_sequence"].get<uint64_t>(), 52690944u);
    EXPECT_EQ(j["gpu_layers"].get<int>(), 33);  // 32 layers + embedding/head
    EXPECT_EQ(j["weights_bytes_gpu"].get<uint64_t>(), 2697836544ull);
    EXPECT_EQ(j["weights_bytes_host"].get<uint64_t>(), 0u);
    EXPECT_GT(j["total_bytes_gpu"].get<uint64_t>(), 2697836544ull + 4096ull * 32768 + 52690944ull);
    EXPECT_LE(j["total_bytes_gpu"].get<uint64_t>() + j["safety_margin_bytes"].get<uint64_t>(), 8 * kGiB);
    EXPECT_GT(j["max_context"].get<int64_t>(), 100000);
    EXPECT_EQ(j["max_context"].get<int64_t>() % 256, 0);
    EXPECT_EQ(j["gpu"]["total"], j["total_bytes_gpu"]);
    EXPECT_EQ(j["layers"].size(), 32u);
    EXPECT_EQ(j["n_recurrent_layers"].get<int>(), 24);
    // 2 bytes per element of every quantized layer matrix of 32+ rows: the CUDA
    // backend reported 6.65 GiB of copies (248 weights) for this shape on an H200.
    EXPECT_EQ(j["f16_copy_bytes_gpu"].get<uint64_t>(), 7138181120ull);
    EXPECT_EQ(plan_json("--arch-preset qwen35-4b-q4_k_m --vram 8GiB -ngl 0")["f16_copy_bytes_gpu"].get<uint64_t>(), 0u);
}

TEST(PlanCli, JsonQwen3PresetAndOptions) {
    nlohmann::json j = plan_json("--arch-preset qwen3-4b -c 32768 -np 2 --kv-type q8_0 --gpu rtx4090");
    EXPECT_EQ(j["kv_bytes_per_token"].get<uint64_t>(), 147456u / 2 / 32 * 34);
    EXPECT_EQ(j["recurrent_state_bytes_per_sequence"].get<uint64_t>(), 0u);
    EXPECT_EQ(j["n_slots"].get<int>(), 2);
    EXPECT_EQ(j["kv_type"], "q8_0");
    EXPECT_EQ(j["vram_bytes"].get<uint64_t>(), 24 * kGiB);
    EXPECT_EQ(j["gpu_layers"].get<int>(), 37);
    EXPECT_EQ(j["kv_bytes_gpu"].get<uint64_t>(), 2ull * 32768 * (147456u / 2 / 32 * 34));
    EXPECT_EQ(j["warnings"].size(), 0u) << j["warnings"];  // both backends run a q8_0 cache
    // A preset name and the same bytes give the same plan.
    nlohmann::json k = plan_json("--arch-preset qwen3-4b -c 32768 -np 2 --kv-type q8_0 --vram 24GiB");
    EXPECT_EQ(j["total_bytes_gpu"], k["total_bytes_gpu"]);
    EXPECT_EQ(j["max_context"], k["max_context"]);
}

TEST(PlanCli, TightCardOffloadsFewerLayers) {
    nlohmann::json j = plan_json("--arch-preset qwen3-4b -c 16384 --vram 2GiB");
    const int n = j["gpu_layers"].get<int>();
    EXPECT_GT(n, 0);
    EXPECT_LT(n, 36);
    EXPECT_GT(j["weights_bytes_host"].get<uint64_t>(), 0u);
    EXPECT_EQ(j["weights_bytes_gpu"].get<uint64_t>() + j["weights_bytes_host"].get<uint64_t>(), 2491323904ull);
    // An explicit -ngl is honoured and reported as not fitting.
    nlohmann::json all = plan_json("--arch-preset qwen3-4b -c 16384 --vram 2GiB -ngl 99");
    EXPECT_EQ(all["gpu_layers"].get<int>(), 37);  // as llama.cpp: beyond the layer count = everything
    EXPECT_FALSE(all["fits"].get<bool>());
}

TEST(PlanCli, ReferenceFile) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    nlohmann::json j = plan_json("-m " + test::reference_path("tiny-qwen35.q4_k_m.gguf") + " --vram 1GiB");
    EXPECT_EQ(j["kv_bytes_per_token"].get<uint64_t>(), 2u * 2 * 2 * 64 * 2);
    EXPECT_EQ(j["recurrent_state_bytes_per_sequence"].get<uint64_t>(), 116736u);
    EXPECT_EQ(j["gpu_layers"].get<int>(), 9);
    EXPECT_EQ(j["weights_bytes_gpu"].get<uint64_t>(), 4493844u);  // sum of the file's tensor bytes
    EXPECT_EQ(j["max_context"].get<int64_t>(), 4096);              // trained context
    EXPECT_EQ(j["max_context_limited_by"], "trained context");
}

TEST(PlanCli, TextReport) {
    Result r = plan("--arch-preset qwen35-4b --gpu rtx4070-laptop --layers");
    ASSERT_EQ(r.rc, 0) << r.out;
    for (const char* s : {"DeltaNet layer", "attention layer", "KV cache per token", "32.00 KiB",
                          "50.25 MiB", "recommended", "largest context", "-ngl 33 (all + head)", "CUDA context"})
        EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(PlanCli, ListsPresets) {
    Result r = plan("--list-presets");
    ASSERT_EQ(r.rc, 0);
    for (const char* s : {"qwen35-4b", "qwen3-4b", "rtx4070-laptop", "rtx3060", "rtx4090", "a100-80g", "h200"})
        EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST(PlanCli, BadFlagsAreOneLineErrors) {
    struct Case { const char* args; int rc; const char* msg; };
    for (const Case& c : {
             Case{"--arch-preset qwen3-4b --bogus", 2, "--bogus"},
             Case{"", 1, "--arch-preset"},
             Case{"--arch-preset qwen3-4b --kv-type q4_0", 1, "--kv-type"},
             Case{"--arch-preset qwen3-4b --vram 8XB", 1, "not a byte size"},
             Case{"--arch-preset qwen3-4b --gpu rtx9999", 1, "not a known card"},
             Case{"--arch-preset qwen3-4b --vram 8GiB --gpu rtx4090", 2, "excludes"},
             Case{"--arch-preset qwen3-4b -c 0", 1, "context size"},
             Case{"--arch-preset qwen3-4b -c abc", 2, "abc"},
             Case{"--arch-preset qwen3-4b -np 0", 1, "slots"},
             Case{"--arch-preset qwen3-4b -ngl x", 1, "-ngl"},
             Case{"--arch-preset qwen9-4b", 1, "unknown arch preset"},
             Case{"-m /nonexistent/model.gguf", 1, "/nonexistent/model.gguf"},
             Case{"--arch-preset qwen3-4b -c 32768 --vram 0 --ram 2GiB", 1, "does not fit"},
         }) {
        Result r = plan(c.args, true);
        EXPECT_EQ(r.rc, c.rc) << c.args << "\n" << r.out;
        EXPECT_NE(r.out.find(c.msg), std::string::npos) << c.args << "\n" << r.out;
        EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "not one line: " << c.args << "\n" << r.out;
    }
}

TEST(PlanCli, GpuAutoWithoutCuda) {
#if defined(QINFER_HAVE_CUDA)
    GTEST_SKIP() << "CUDA build: --gpu auto queries the device";
#else
    Result r = plan("--arch-preset qwen3-4b --gpu auto", true);
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.out.find("no CUDA support"), std::string::npos) << r.out;
#endif
}

TEST(PlanGpus, ParseBytes) {
    EXPECT_EQ(parse_bytes("8GiB", "t"), 8 * kGiB);
    EXPECT_EQ(parse_bytes("8G", "t"), 8 * kGiB);
    EXPECT_EQ(parse_bytes("8gb", "t"), 8000000000ull);
    EXPECT_EQ(parse_bytes("7.5GiB", "t"), 7 * kGiB + kGiB / 2);
    EXPECT_EQ(parse_bytes("512MiB", "t"), 512 * kMiB);
    EXPECT_EQ(parse_bytes("8589934592", "t"), 8589934592ull);
    EXPECT_EQ(parse_bytes("0", "t"), 0u);
    for (const char* bad : {"", "GiB", "8XB", "1.2.3G", "-8G", "1.5", "8 G B", "99999999999T"})
        EXPECT_THROW(parse_bytes(bad, "--vram"), Error) << bad;
    EXPECT_EQ(gpu_preset_bytes("RTX4090").value_or(0), 24 * kGiB);
    EXPECT_FALSE(gpu_preset_bytes("rtx9999").has_value());
    EXPECT_EQ(format_bytes(32768), "32.00 KiB");
    EXPECT_EQ(format_bytes(52690944), "50.25 MiB");
    EXPECT_EQ(format_bytes(100), "100 B");
}
