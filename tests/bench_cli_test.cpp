// `qinfer bench` bandwidth report: the weight bytes a decode step reads
// (cross-checked against the GGUF's tensor table), the measured read
// bandwidth, and the derived decode GB/s and fraction, in json, csv and md.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "gguf/gguf.h"
#include "testutil.h"

using namespace qinfer;
using namespace qinfer::test;

namespace {

std::string quote(const std::string& s) { return "'" + s + "'"; }

std::string run(const std::string& args, int* rc) {
    std::string out;
    *rc = run_command(quote(qinfer_binary()) + " " + args + " 2>/dev/null", &out);
    return out;
}

// Independent count (models without MTP layers): every tensor, except that a
// model with its own output.weight reads one row of the token embedding only.
uint64_t expected_decode_bytes(const std::string& path, bool want_tied) {
    auto f = gguf::File::open(path);
    bool has_output = false;
    for (const gguf::TensorInfo& t : f->tensors()) has_output |= t.name == "output.weight";
    EXPECT_EQ(!has_output, want_tied) << path;
    uint64_t total = 0;
    for (const gguf::TensorInfo& t : f->tensors())
        total += t.name == "token_embd.weight" && has_output ? t.nbytes / uint64_t(t.ne[1]) : t.nbytes;
    return total;
}

}  // namespace

TEST(BenchCli, BandwidthFieldsInJsonCsvAndMarkdown) {
    if (!reference_available()) GTEST_SKIP() << "reference models not available";
    const std::string m = reference_path("tiny-qwen2.q8_0.gguf");  // own output.weight
    const uint64_t want_bytes = expected_decode_bytes(m, false);
    int rc = 0;
    const std::string out = run("bench -m " + quote(m) + " -p 8 -n 8 -r 2 -t 1 -o json", &rc);
    ASSERT_EQ(rc, 0) << out;
    const auto j = nlohmann::json::parse(out);
    ASSERT_EQ(j.size(), 2u);
    EXPECT_FALSE(j[0].contains("mem_bw_gbs")) << "pp rows carry no decode bandwidth";
    const auto& tg = j[1];
    ASSERT_EQ(tg["test"], "tg8");
    EXPECT_EQ(tg["decode_bytes_per_token"].get<uint64_t>(), want_bytes);
    const double bw = tg["mem_bw_gbs"].get<double>(), dec = tg["decode_gbs"].get<double>(),
                 frac = tg["bw_fraction"].get<double>(), ts = tg["avg_ts"].get<double>();
    EXPECT_GT(bw, 0.1);    // any machine reads more than 100 MB/s
    EXPECT_LT(bw, 10000);  // and less than 10 TB/s
    EXPECT_NEAR(dec, ts * double(want_bytes) / 1e9, 1e-6 * dec);
    EXPECT_NEAR(frac, dec / bw, 1e-9 + 1e-6 * frac);

    const std::string m2 = reference_path("tiny-qwen3.q4_k_m.gguf");  // head tied to the embedding
    const uint64_t want_tied = expected_decode_bytes(m2, true);
    const std::string csv = run("bench -m " + quote(m2) + " -p 0 -n 4 -r 1 -t 1 -o csv", &rc);
    ASSERT_EQ(rc, 0) << csv;
    std::istringstream lines(csv);
    std::string header, row;
    std::getline(lines, header);
    std::getline(lines, row);
    EXPECT_NE(header.find("decode_bytes_per_token,decode_gbs,mem_bw_gbs,bw_fraction"), std::string::npos) << header;
    EXPECT_NE(row.find("," + std::to_string(want_tied) + ","), std::string::npos) << row;

    const std::string md = run("bench -m " + quote(m2) + " -p 0 -n 4 -r 1 -t 1", &rc);
    ASSERT_EQ(rc, 0) << md;
    EXPECT_NE(md.find("memory read bandwidth (threads 1):"), std::string::npos) << md;
    EXPECT_NE(md.find("of the measured bandwidth"), std::string::npos) << md;
}

TEST(BenchCli, ParallelDecodeRows) {
    if (!reference_available()) GTEST_SKIP() << "reference models not available";
    const std::string m = reference_path("tiny-qwen35.q8_0.gguf");
    const uint64_t bytes = expected_decode_bytes(m, true);
    int rc = 0;
    const std::string out = run("bench -m " + quote(m) + " -p 0 -n 6 -np 1,3 -r 1 -t 1 -o json", &rc);
    ASSERT_EQ(rc, 0) << out;
    const auto j = nlohmann::json::parse(out);
    ASSERT_EQ(j.size(), 2u);
    EXPECT_EQ(j[0]["test"], "tg6");
    EXPECT_EQ(j[1]["test"], "tg6 x3");
    EXPECT_EQ(j[1]["n_parallel"], 3);
    const double ts = j[1]["avg_ts"].get<double>();
    EXPECT_GT(ts, 0.0);
    // Three sequences share each step's weight reads.
    EXPECT_NEAR(j[1]["decode_gbs"].get<double>(), ts / 3 * double(bytes) / 1e9, 1e-6 * ts);
    // Zero sequences is a usage error with the flag named.
    std::string bad;
    rc = run_command(quote(qinfer_binary()) + " bench -m " + quote(m) + " -p 0 -n 4 -np 0 -r 1 -t 1 2>&1", &bad);
    EXPECT_NE(rc, 0);
    EXPECT_NE(bad.find("-np: '0' is not a valid value"), std::string::npos) << bad;
}

// Prompt offload flags: a negative batch size is refused with the flag named;
// --no-op-offload and 0 are accepted (no GPU here: nothing is offloaded either way).
TEST(BenchCli, OpOffloadFlags) {
    if (!reference_available()) GTEST_SKIP() << "reference models not available";
    const std::string m = reference_path("tiny-qwen35.q8_0.gguf");
    std::string out;
    int rc = run_command(quote(qinfer_binary()) + " bench -m " + quote(m) +
                             " -p 8 -n 0 -r 1 -t 1 --op-offload-min-batch -4 2>&1", &out);
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find("--op-offload-min-batch"), std::string::npos) << out;
    for (const char* flag : {"--no-op-offload", "--op-offload-min-batch 0"}) {
        out.clear();
        rc = run_command(quote(qinfer_binary()) + " bench -m " + quote(m) + " -p 8 -n 0 -r 1 -t 1 -o json " + flag +
                             " 2>/dev/null", &out);
        ASSERT_EQ(rc, 0) << flag << ": " << out;
        const auto j = nlohmann::json::parse(out);
        EXPECT_EQ(j[0]["placement"].get<std::string>().find("prompts of"), std::string::npos) << flag;
    }
}

// QINFER_CPU_PROFILE=1: the CPU backend prints its per-op table when the model
// is released, with the decode products under their type and shape.
TEST(BenchCli, CpuOpProfile) {
    if (!reference_available()) GTEST_SKIP() << "reference models not available";
    const std::string m = reference_path("tiny-qwen35.q8_0.gguf");
    set_env("QINFER_CPU_PROFILE", "1");
    std::string out;
    const int rc = run_command(quote(qinfer_binary()) + " bench -m " + quote(m) + " -p 0 -n 4 -r 1 -t 2 -ngl 0 2>&1",
                               &out);
    unset_env("QINFER_CPU_PROFILE");
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("CPU op profile"), std::string::npos) << out;
    EXPECT_NE(out.find("matmul T=1 Q8_0"), std::string::npos) << out;
    EXPECT_NE(out.find("gated_delta_rule"), std::string::npos) << out;
    // and nothing of it without the switch
    out.clear();
    ASSERT_EQ(run_command(quote(qinfer_binary()) + " bench -m " + quote(m) + " -p 0 -n 4 -r 1 -t 2 -ngl 0 2>&1", &out), 0);
    EXPECT_EQ(out.find("CPU op profile"), std::string::npos) << out;
}
