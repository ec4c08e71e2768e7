// `qinfer run`, `chat` and `bench` end to end on the reference tiny models.
// Greedy ids must equal llama.cpp's ("greedy" in the .s7.json files).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "testutil.h"

using namespace qinfer::test;
namespace fs = std::filesystem;

namespace {

const char* kPromptIds = "8193,872,198,39,4791,1879,8194";

std::string model_path(const std::string& name) {
    for (const std::string& dir : {std::string(""), std::string("large/")}) {
        const std::string p = reference_path(dir + name);
        if (fs::exists(p)) return p;
    }
    return "";
}

#define REQUIRE_MODEL(var, name)                                                       \
    const std::string var = model_path(name);                                          \
    if (var.empty()) GTEST_SKIP() << "reference model " << name << " not found in " \
                                  << reference_dir();

std::string quote(const std::string& s) { return "'" + s + "'"; }

std::string run(const std::string& args, int* rc, std::string* err = nullptr) {
    const std::string errfile = temp_dir() + "/stderr.txt";
    std::string out;
    *rc = run_command(quote(qinfer_binary()) + " " + args + " 2>" + quote(errfile), &out);
    if (err) *err = read_text(errfile);
    return out;
}

std::string greedy_line(const std::string& json_name) {
    const auto j = nlohmann::json::parse(read_text(reference_path(json_name)));
    std::string line;
    for (int id : j.at("greedy")) line += (line.empty() ? "" : " ") + std::to_string(id);
    return line + "\n";
}

void expect_reference_greedy(const std::string& model, const std::string& json_name) {
    int rc = 0;
    std::string err;
    const std::string out =
        run("run -m " + quote(model) + " --ids " + kPromptIds + " -n 16 --temp 0 --print-ids", &rc, &err);
    ASSERT_EQ(rc, 0) << err;
    EXPECT_EQ(out, greedy_line(json_name)) << err;
}

}  // namespace

TEST(RunCli, GreedyIdsMatchReferenceF32) {
    REQUIRE_MODEL(m, "tiny-qwen35.f32.gguf");
    expect_reference_greedy(m, "tiny-qwen35.f32.s7.json");
}

TEST(RunCli, GreedyIdsMatchReferenceF16) {
    REQUIRE_MODEL(m, "tiny-qwen35.f16.gguf");
    expect_reference_greedy(m, "tiny-qwen35.f16.s7.json");
}

TEST(RunCli, SameSeedSameOutput) {
    REQUIRE_MODEL(m, "tiny-qwen35.f16.gguf");
    auto sample = [&](int seed) {
        int rc = 0;
        std::string err;
        std::string out = run("run -m " + quote(m) + " --ids " + kPromptIds + " -n 24 --temp 1.0 --top-k 0 --top-p 1 " +
                                  "--min-p 0 --ignore-eos --print-ids --seed " + std::to_string(seed),
                              &rc, &err);
        EXPECT_EQ(rc, 0) << err;
        return out;
    };
    const std::string a = sample(42);
    EXPECT_EQ(std::count(a.begin(), a.end(), ' '), 23) << a;
    EXPECT_EQ(a, sample(42));
    EXPECT_NE(a, sample(43));
}

TEST(RunCli, PromptTooLongFailsClearly) {
    REQUIRE_MODEL(m, "tiny-qwen35.f16.gguf");
    int rc = 0;
    std::string err;
    const std::string out = run("run -m " + quote(m) + " -c 8 --ids 1,2,3,4,5,6,7,8,9,10 -n 4 --temp 0", &rc, &err);
    EXPECT_NE(rc, 0);
    EXPECT_NE(err.find("context"), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), err.size() - 1) << "expected a one-line message: " << err;
    EXPECT_EQ(out, "");
}

TEST(RunCli, GenerationStopsAtContextEnd) {
    REQUIRE_MODEL(m, "tiny-qwen35.f16.gguf");
    int rc = 0;
    std::string err;
    // 7 prompt tokens in a context of 10: ids fed at positions 7, 8, 9 -> 4 generated.
    const std::string out =
        run("run -m " + quote(m) + " -c 10 --ids " + kPromptIds + " -n 100 --temp 0 --ignore-eos --print-ids", &rc, &err);
    ASSERT_EQ(rc, 0) << err;
    EXPECT_EQ(std::count(out.begin(), out.end(), ' '), 3) << out;
    EXPECT_NE(err.find("length"), std::string::npos) << err;
}

TEST(RunCli, TextPromptStreamsAndReportsTimings) {
    REQUIRE_MODEL(m, "tiny-qwen35.f16.gguf");
    int rc = 0;
    std::string err;
    run("run -m " + quote(m) + " -p 'Hello, world' -n 8 --temp 0", &rc, &err);
    ASSERT_EQ(rc, 0) << err;
    EXPECT_NE(err.find("prompt "), std::string::npos) << err;
    EXPECT_NE(err.find("ttft"), std::string::npos) << err;
    EXPECT_NE(err.find("t/s"), std::string::npos) << err;
}

TEST(RunCli, StopStringCutsOutput) {
    REQUIRE_MODEL(m, "tiny-qwen35.f16.gguf");
    int rc = 0;
    std::string err;
    const std::string base = "run -m " + quote(m) + " -p 'Once upon a time' -n 24 --temp 0 --ignore-eos";
    std::string full = run(base, &rc, &err);
    ASSERT_EQ(rc, 0) << err;
    ASSERT_GT(full.size(), 12u);
    full.pop_back();  // trailing newline printed after generation
    // Stop at a piece from the middle of the text; only printable ASCII keeps the shell quoting simple.
    size_t at = std::string::npos;
    for (size_t i = 4; i + 3 < full.size(); i++) {
        bool ok = true;
        for (size_t k = 0; k < 3; k++) ok = ok && full[i + k] > 32 && full[i + k] < 127 && full[i + k] != '\'';
        if (ok) {
            at = i;
            break;
        }
    }
    if (at == std::string::npos) GTEST_SKIP() << "no printable ASCII run in the output: " << full;
    const std::string stop = full.substr(at, 3);
    const std::string cut = run(base + " --stop '" + stop + "'", &rc, &err);
    ASSERT_EQ(rc, 0) << err;
    EXPECT_EQ(cut, full.substr(0, full.find(stop)) + "\n");
}

TEST(RunCli, ChatChineseAndEnglish) {
    REQUIRE_MODEL(m, "tiny-qwen35.q8_0.gguf");
    int rc = 0;
    std::string err;
    run("run -m " + quote(m) + " --chat -sys 'You are helpful.' -p '你好，请介绍一下你自己。' -n 12 --seed 1", &rc, &err);
    EXPECT_EQ(rc, 0) << err;
    run("run -m " + quote(m) + " --chat --no-think -p 'Hello! How are you?' -n 12 --seed 1", &rc, &err);
    EXPECT_EQ(rc, 0) << err;
    // Interactive chat: three turns from stdin, then /exit.
    const std::string input = temp_dir() + "/chat_in.txt";
    {
        std::ofstream f(input);
        f << "Hello there\n你好，世界！\n/reset\nWhat is 2+2?\n/exit\n";
    }
    std::string out;
    rc = run_command(quote(qinfer_binary()) + " chat -m " + quote(m) + " -n 10 --seed 3 < " + quote(input), &out, true);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("(conversation cleared)"), std::string::npos) << out;
}

TEST(RunCli, BenchJson) {
    REQUIRE_MODEL(m, "tiny-qwen35.q8_0.gguf");
    int rc = 0;
    std::string err;
    const std::string out = run("bench -m " + quote(m) + " -p 16 -n 4,8 -r 2 -t 1 -o json", &rc, &err);
    ASSERT_EQ(rc, 0) << err;
    const auto j = nlohmann::json::parse(out);
    ASSERT_EQ(j.size(), 3u);
    EXPECT_EQ(j[0]["test"], "pp16");
    EXPECT_EQ(j[1]["test"], "tg4");
    EXPECT_EQ(j[2]["test"], "tg8");
    for (const auto& r : j) {
        EXPECT_GT(r["avg_ts"].get<double>(), 0.0);
        EXPECT_EQ(r["samples_ts"].size(), 2u);
    }
    EXPECT_GT(j[0]["avg_ttft_ms"].get<double>(), 0.0);
    const std::string md = run("bench -m " + quote(m) + " -p 8 -n 2 -r 1 -t 1 --depth 4", &rc, &err);
    ASSERT_EQ(rc, 0) << err;
    EXPECT_NE(md.find("| model"), std::string::npos) << md;
    EXPECT_NE(md.find("pp8 @ d4"), std::string::npos) << md;
    EXPECT_NE(md.find("tg2 @ d4"), std::string::npos) << md;
    EXPECT_NE(md.find("TTFT"), std::string::npos) << md;
}

TEST(RunCli, BadInputGivesErrors) {
    REQUIRE_MODEL(m, "tiny-qwen35.q8_0.gguf");
    int rc = 0;
    std::string err;
    run("run -m " + quote(m) + " --ids 1,x,3 -n 2", &rc, &err);
    EXPECT_NE(rc, 0);
    EXPECT_NE(err.find("--ids"), std::string::npos) << err;
    run("run -m " + quote(m) + " --ids 999999 -n 2", &rc, &err);
    EXPECT_NE(rc, 0);
    EXPECT_NE(err.find("vocabulary"), std::string::npos) << err;
    run("run -m " + quote(m) + " -n 2", &rc, &err);
    EXPECT_NE(rc, 0);
    run("run -m /nonexistent.gguf -p hi", &rc, &err);
    EXPECT_NE(rc, 0);
    EXPECT_NE(err.find("nonexistent"), std::string::npos) << err;
    run("bench -m " + quote(m) + " -p 0 -n 0", &rc, &err);
    EXPECT_NE(rc, 0);
    // -b has no "automatic" value to type: 0 and negatives are refused by name
    for (const char* b : {"0", "-5"}) {
        run("run -m " + quote(m) + " --ids 1,2 -n 1 -b " + b, &rc, &err);
        EXPECT_NE(rc, 0) << b;
        EXPECT_NE(err.find("batch-size"), std::string::npos) << b << ": " << err;
    }
}

TEST(RunCli, KvCacheTypeFlags) {
    // -ctk / --kv-type sets the type of K and V; -ctv may repeat it but not
    // differ. q8_0 (CPU backend) runs; unknown types are refused by name.
    REQUIRE_MODEL(m, "tiny-qwen35.f16.gguf");
    int rc = 0;
    std::string err;
    const std::string base = "run -m " + quote(m) + " --ids " + kPromptIds + " -n 4 --temp 0 --print-ids -ngl 0 ";
    for (const char* flags : {"", "-ctk f16 -ctv f16", "--kv-type f32", "-ctk q8_0 -ctv q8_0", "--cache-type-k q8_0"}) {
        const std::string out = run(base + flags, &rc, &err);
        EXPECT_EQ(rc, 0) << flags << ": " << err;
        EXPECT_EQ(std::count(out.begin(), out.end(), ' '), 3) << flags << ": " << out;  // 4 ids
    }
    const std::pair<const char*, const char*> bad_flags[] = {
        {"-ctk q4_0", "--kv-type"}, {"-ctk q8_0 -ctv f16", "--cache-type-v"}, {"-ctv bf16", "--cache-type-v"}};
    for (const auto& [flag, named] : bad_flags) {
        run(base + flag, &rc, &err);
        EXPECT_NE(rc, 0) << flag;
        EXPECT_NE(err.find(named), std::string::npos) << flag << ": " << err;
    }
}

TEST(RunCli, GpuLayersFlag) {
    // auto (the default), all and N are accepted; without a GPU they all run on
    // the CPU, and the greedy ids do not change. Anything else is a clear error.
    REQUIRE_MODEL(m, "tiny-qwen35.f16.gguf");
    int rc = 0;
    std::string err;
    for (const char* ngl : {"auto", "all", "0", "3"}) {
        const std::string out = run("run -m " + quote(m) + " --ids " + kPromptIds + " -n 16 --temp 0 --print-ids -ngl " +
                                        ngl + " --vram-limit 1GiB",
                                    &rc, &err);
        EXPECT_EQ(rc, 0) << ngl << ": " << err;
        EXPECT_EQ(out, greedy_line("tiny-qwen35.f16.s7.json")) << ngl;
    }
    const std::pair<const char*, const char*> bad_flags[] = {
        {"-ngl lots", "--gpu-layers"}, {"-ngl -3", "--gpu-layers"}, {"--vram-limit 12parsecs", "--vram-limit"}};
    for (const auto& [flag, named] : bad_flags) {
        run("run -m " + quote(m) + " --ids " + kPromptIds + " -n 2 " + flag, &rc, &err);
        EXPECT_NE(rc, 0) << flag;
        EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << flag << ": " << err;
        EXPECT_NE(err.find(named), std::string::npos) << flag << ": " << err;
    }
}

TEST(RunCli, PromptFileWithByteOrderMarkEqualsPrompt) {
    // A UTF-8 byte-order mark (Windows editors) is not part of the prompt.
    REQUIRE_MODEL(m, "tiny-qwen35.f16.gguf");
    const std::string plain = temp_dir() + "/prompt-plain.txt", bom = temp_dir() + "/prompt-bom.txt";
    std::ofstream(plain, std::ios::binary) << "你好, world";
    std::ofstream(bom, std::ios::binary) << "\xEF\xBB\xBF你好, world";
    int rc = 0;
    std::string err;
    const std::string a = run("run -m " + quote(m) + " -f " + quote(plain) + " -n 8 --temp 0", &rc, &err);
    ASSERT_EQ(rc, 0) << err;
    const std::string b = run("run -m " + quote(m) + " -f " + quote(bom) + " -n 8 --temp 0", &rc, &err);
    ASSERT_EQ(rc, 0) << err;
    EXPECT_EQ(a, b);
    const std::string c = run("run -m " + quote(m) + " -p '你好, world' -n 8 --temp 0", &rc, &err);
    EXPECT_EQ(a, c);
}
