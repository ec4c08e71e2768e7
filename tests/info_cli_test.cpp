// `qinfer info` on every reference GGUF: the JSON report against values derived
// by hand from MANIFEST.md §3 (shapes -> parameter counts, per-type tensor
// counts, layer schedule, state sizes), the text form, --sha256 against the
// MANIFEST hashes, --check-tensors on good and damaged files, exit codes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "common/fp16.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "testutil.h"

using namespace qinfer;
using json = nlohmann::json;

namespace {

// Shell-quoted path, built with +=: GCC 12 warns falsely (-Wrestrict) on "'" + s + "'".
std::string q(const std::string& path) {
    std::string s = "'";
    s += path;
    s += "'";
    return s;
}

struct CliRun { int rc; std::string out; };
CliRun info(const std::string& args, bool merge_stderr = false) {
    CliRun r;
    r.rc = test::run_command(test::qinfer_binary() + " info " + args, &r.out, merge_stderr);
    return r;
}

json info_json(const std::string& path) {
    CliRun r = info(q(path) + " --json");
    EXPECT_EQ(r.rc, 0) << path;
    return json::parse(r.out);
}

// Parameter counts from the shapes in MANIFEST.md §3.3 (E = 256, vocab 8218, F = 512).
constexpr int64_t E = 256, V = 8218, F = 512;
constexpr int64_t kEmbd = E * V;
constexpr int64_t kFfn = 3 * E * F;
int64_t qwen35_params() {
    int64_t common = 2 * E + kFfn;                                         // attn_norm, post_attention_norm, ffn
    int64_t full = E * 512 + E * 128 + E * 128 + E * E + 64 + 64;          // q(+gate), k, v, output, q/k norms
    int64_t gdn = E * 256 + E * 128 + 4 * 256 + 4 + 4 + E * 4 + E * 4 + 32 + 128 * E;  // qkv gate conv dt a beta alpha norm out
    return kEmbd + E + 8 * common + 2 * full + 6 * gdn;
}
int64_t qwen3_params() {
    int64_t layer = E + E * E + E * 128 + E * 128 + E * E + 64 + 64 + E + kFfn;
    return kEmbd + E + 4 * layer;
}
int64_t qwen2_params() {
    int64_t layer = E + (E * E + E) + (E * 128 + 128) + (E * 128 + 128) + E * E + E + kFfn;
    return 2 * kEmbd + E + 4 * layer;  // output.weight is not tied
}

struct Expect {
    const char* file;
    const char* arch;
    int64_t params;
    std::map<std::string, uint64_t> types;
};

const Expect kModels[] = {
    {"tiny-qwen35.q4_k_m.gguf", "qwen35", qwen35_params(), {{"Q6_K", 9}, {"Q4_K", 48}, {"Q5_0", 6}, {"F32", 45}}},
    {"tiny-qwen35.q8_0.gguf", "qwen35", qwen35_params(), {{"Q8_0", 63}, {"F32", 45}}},
    {"tiny-qwen35.f16.gguf", "qwen35", qwen35_params(), {{"F16", 63}, {"F32", 45}}},
    {"large/tiny-qwen35.f32.gguf", "qwen35", qwen35_params(), {{"F32", 108}}},
    {"tiny-qwen3.q4_k_m.gguf", "qwen3", qwen3_params(), {{"Q6_K", 5}, {"Q4_K", 24}, {"F32", 17}}},
    {"large/tiny-qwen3.f16.gguf", "qwen3", qwen3_params(), {{"F16", 29}, {"F32", 17}}},
    {"tiny-qwen2.q8_0.gguf", "qwen2", qwen2_params(), {{"Q8_0", 30}, {"F32", 21}}},
    {"large/tiny-qwen2.f16.gguf", "qwen2", qwen2_params(), {{"F16", 30}, {"F32", 21}}},
};

}  // namespace

TEST(InfoCli, EveryReferenceModel) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    for (const Expect& e : kModels) {
        std::string path = test::reference_path(e.file);
        if (!std::filesystem::exists(path)) {
            ADD_FAILURE() << "missing reference file " << path;
            continue;
        }
        SCOPED_TRACE(e.file);
        json r = info_json(path);
        EXPECT_EQ(r["version"], 3);
        EXPECT_EQ(r["alignment"], 32);
        EXPECT_EQ(r["file_bytes"].get<uint64_t>(), std::filesystem::file_size(path));
        const bool q35 = std::string(e.arch) == "qwen35";

        const json& t = r["tensors"];
        uint64_t n = 0, bytes = 0;
        for (const auto& [k, v] : e.types) n += v;
        EXPECT_EQ(t["count"].get<uint64_t>(), n);
        EXPECT_EQ(t["parameters"].get<int64_t>(), e.params);
        ASSERT_EQ(t["by_type"].size(), e.types.size()) << t["by_type"].dump();
        for (const auto& [type, count] : e.types) {
            EXPECT_EQ(t["by_type"][type]["count"].get<uint64_t>(), count) << type;
            bytes += t["by_type"][type]["bytes"].get<uint64_t>();
        }
        EXPECT_EQ(t["bytes"].get<uint64_t>(), bytes);
        EXPECT_EQ(t["by_type"]["F32"]["bytes"].get<uint64_t>(), 4 * t["by_type"]["F32"]["parameters"].get<uint64_t>());
        EXPECT_NEAR(t["bits_per_weight"].get<double>(), 8.0 * double(bytes) / double(e.params), 1e-9);

        const json& a = r["architecture"];
        ASSERT_TRUE(a.is_object()) << r.value("architecture_note", "");
        EXPECT_EQ(a["name"], e.arch);
        EXPECT_EQ(a["layers"], q35 ? 8 : 4);
        if (q35) {
            EXPECT_EQ(a["full_attention_layers"], json::parse("[3, 7]"));
            EXPECT_EQ(a["recurrent_layers"], json::parse("[0, 1, 2, 4, 5, 6]"));
            EXPECT_EQ(a["ssm"]["conv_kernel"], 4);
            EXPECT_EQ(a["ssm"]["state_size"], 32);
            EXPECT_EQ(a["ssm"]["k_heads"], 2);
            EXPECT_EQ(a["ssm"]["v_heads"], 4);
            EXPECT_EQ(a["ssm"]["inner_size"], 128);
        } else {
            EXPECT_EQ(a["full_attention_layers"], json::parse("[0, 1, 2, 3]"));
            EXPECT_EQ(a["recurrent_layers"], json::array());
        }
        EXPECT_EQ(a["embedding_length"], 256);
        EXPECT_EQ(a["feed_forward_length"], 512);
        EXPECT_EQ(a["head_count"], 4);
        EXPECT_EQ(a["head_count_kv"], 2);
        EXPECT_EQ(a["head_dim"], 64);
        EXPECT_EQ(a["n_rot"], q35 ? 16 : 64);
        EXPECT_EQ(a["context_length"], 4096);
        EXPECT_EQ(a["rope_base"].get<double>(), q35 ? 1e7 : 1e6);
        EXPECT_NEAR(a["rms_eps"].get<double>(), 1e-6, 1e-12);
        EXPECT_EQ(a["vocab_size"], 8218);
        EXPECT_EQ(a["tied_output"], std::string(e.arch) != "qwen2");
        EXPECT_EQ(a["qkv_bias"], std::string(e.arch) == "qwen2");

        // KV: K and V, n_kv 2 x head dim 64 per attention layer; recurrent (spec/models.md §9):
        // f32 conv state (K-1) x channels (2*2*32 + 128) plus S = v_heads x 32 x 32, per DeltaNet layer.
        const json& s = r["state"];
        uint64_t attn_layers = q35 ? 2 : 4;
        EXPECT_EQ(s["kv_bytes_per_token_f16"].get<uint64_t>(), attn_layers * 2 * 2 * 64 * 2);
        EXPECT_EQ(s["kv_bytes_per_token_f32"].get<uint64_t>(), attn_layers * 2 * 2 * 64 * 4);
        uint64_t rec_layer = q35 ? 4 * (3 * 256 + 4 * 32 * 32) : 0;
        EXPECT_EQ(s["recurrent_bytes_per_sequence_layer"].get<uint64_t>(), rec_layer);
        EXPECT_EQ(s["recurrent_bytes_per_sequence"].get<uint64_t>(), 6 * rec_layer);

        const json& tok = r["tokenizer"];
        EXPECT_EQ(tok["model"], "gpt2");
        EXPECT_EQ(tok["pre"], q35 ? "qwen35" : "qwen2");
        EXPECT_EQ(tok["tokens"], 8218);
        EXPECT_EQ(tok["merges"], 7936);
        EXPECT_EQ(tok["special"]["bos"], json::parse(R"({"id": 8192, "text": "<|endoftext|>"})"));
        EXPECT_EQ(tok["special"]["eos"], json::parse(R"({"id": 8194, "text": "<|im_end|>"})"));
        EXPECT_EQ(tok["special"]["eot"]["id"], 8194);
        EXPECT_EQ(tok["special"]["pad"]["id"], 8192);
        EXPECT_EQ(tok["add_bos"], false);
        EXPECT_GT(tok["chat_template_bytes"].get<uint64_t>(), 1000u);

        // Long arrays are abbreviated: first elements plus the count.
        for (const auto& m : r["metadata"])
            if (m["key"] == "tokenizer.ggml.tokens") {
                EXPECT_EQ(m["count"], 8218);
                EXPECT_EQ(m["head"].size(), 8u);
                EXPECT_EQ(m["head"][0], "!");
            }
    }
}

TEST(InfoCli, VocabOnlyFiles) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    for (const char* name : {"vocab-qwen3.gguf", "vocab-qwen35.gguf"}) {
        SCOPED_TRACE(name);
        json r = info_json(test::reference_path(name));
        EXPECT_TRUE(r["architecture"].is_null());
        EXPECT_NE(r["architecture_note"].get<std::string>().find("vocab-only"), std::string::npos);
        EXPECT_EQ(r["tensors"]["count"], 0);
        EXPECT_EQ(r["tokenizer"]["tokens"], 151936);
        EXPECT_EQ(r["tokenizer"]["merges"], 151387);
        EXPECT_EQ(r["tokenizer"]["special"]["bos"], json::parse(R"({"id": 151643, "text": "<|endoftext|>"})"));
        EXPECT_EQ(r["tokenizer"]["special"]["eos"], json::parse(R"({"id": 151645, "text": "<|im_end|>"})"));
        EXPECT_EQ(r["tokenizer"]["pre"], std::string(name) == "vocab-qwen35.gguf" ? "qwen35" : "qwen2");
        CliRun t = info(q(test::reference_path(name)));
        EXPECT_EQ(t.rc, 0);
        EXPECT_NE(t.out.find("vocab-only"), std::string::npos);
        EXPECT_NE(t.out.find("151936"), std::string::npos);
    }
}

TEST(InfoCli, TextReport) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    CliRun r = info(q(test::reference_path("tiny-qwen35.q4_k_m.gguf")));
    ASSERT_EQ(r.rc, 0) << r.out;
    for (const char* want : {"version 3, alignment 32", "full attention    3 7", "recurrent         0 1 2 4 5 6",
                             "qwen35.block_count", "u32      8", "[string x 8218] [\"!\", \"\\\"\", \"#\"",
                             "... (8210 more)]", "parameters          6,583,536", "Q5_0         6 tensors",
                             "bos                 8192 \"<|endoftext|>\"", "heads               4 (kv 2), head dim 64, rotary dims 16",
                             "recurrent state     116,736 B"})
        EXPECT_NE(r.out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << r.out;
}

TEST(InfoCli, Sha256) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    const std::string path = q(test::reference_path("tiny-qwen35.q4_k_m.gguf"));
    const std::string good = "aa6c7a1a97e390751c23377e56c45a7ec843a7654a961533a18c7b9f63a7b1b0";  // MANIFEST.md
    CliRun r = info(path + " --sha256 " + good);
    EXPECT_EQ(r.rc, 0);
    EXPECT_NE(r.out.find(good + "  (matches)"), std::string::npos) << r.out;
    std::string upper = good;
    for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(info(path + " --sha256 " + upper).rc, 0);
    std::string bad = good;
    bad[10] = bad[10] == '0' ? '1' : '0';
    r = info(path + " --sha256 " + bad, true);
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.out.find("sha256 mismatch"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("MISMATCH"), std::string::npos) << r.out;
    r = info(path + " --sha256 " + bad + " --json");
    EXPECT_EQ(r.rc, 1);
    EXPECT_EQ(json::parse(r.out)["sha256_match"], false);
    EXPECT_EQ(json::parse(r.out)["sha256"], good);
    EXPECT_EQ(info(path + " --sha256 xyz", true).rc, 2);
    r = info(path + " --sha256 --json");  // no value: just compute and print
    EXPECT_EQ(r.rc, 0);
    EXPECT_EQ(json::parse(r.out)["sha256"], good);
    r = info(q(test::reference_path("large/tiny-qwen35.f32.gguf")) +
             " --json --sha256 5ad245a00ad0348644367a698c4fd89261337103dfa46f71dd7f8045456f593e");
    EXPECT_EQ(r.rc, 0);
}

TEST(InfoCli, CheckTensors) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    CliRun r = info(q(test::reference_path("tiny-qwen35.q4_k_m.gguf")) + " --check-tensors --json");
    ASSERT_EQ(r.rc, 0);
    json c = json::parse(r.out)["check_tensors"];
    EXPECT_EQ(c["checked"], 108);
    EXPECT_TRUE(c["bad"].empty());

    // A file with a NaN in an F16 tensor and an infinite scale in the third Q8_0 block.
    std::vector<uint16_t> h(64, fp32_to_fp16(1.0f));
    h[37] = 0x7E00;  // NaN
    std::vector<uint8_t> q8(4 * 34, 0);
    uint16_t inf = 0x7C00;
    std::memcpy(&q8[2 * 34], &inf, 2);
    std::vector<float> ok(8, 1.f);
    std::vector<uint8_t> iq(66, 0);
    gguf::Writer w;
    w.set_string("general.architecture", "test");
    w.add_tensor("good", GgmlType::F32, {8}, ok.data());
    w.add_tensor("half", GgmlType::F16, {32, 2}, h.data());
    w.add_tensor("q8", GgmlType::Q8_0, {64, 2}, q8.data());
    w.add_tensor("iq", GgmlType::IQ2_XXS, {256}, iq.data());  // not checkable: reported as skipped
    std::string p = test::temp_dir() + "/nan.gguf";
    w.write(p);
    r = info(q(p) + " --check-tensors --json");
    EXPECT_EQ(r.rc, 1);
    c = json::parse(r.out)["check_tensors"];
    ASSERT_EQ(c["bad"].size(), 2u) << c.dump();
    EXPECT_EQ(c["bad"][0]["tensor"], "half");
    EXPECT_EQ(c["bad"][0]["row"], 1);
    EXPECT_EQ(c["bad"][0]["element"], 5);
    EXPECT_EQ(c["bad"][0]["block"], 37);
    EXPECT_EQ(c["bad"][1]["tensor"], "q8");
    EXPECT_EQ(c["bad"][1]["block"], 2);
    EXPECT_EQ(c["bad"][1]["value"], "nan");  // inf scale * 0 quants
    EXPECT_EQ(c["skipped"].size(), 1u);
    EXPECT_EQ(c["checked"], 3);
    // The file itself is fine without --check-tensors.
    EXPECT_EQ(info(q(p)).rc, 0);
}

TEST(InfoCli, BadInput) {
    CliRun r = info("", true);
    EXPECT_EQ(r.rc, 2);
    std::string junk = test::temp_dir() + "/junk.gguf";
    FILE* f = std::fopen(junk.c_str(), "wb");
    std::fputs("GGUF\x03\0\0\0 truncated", f);
    std::fclose(f);
    r = info(q(junk), true);
    EXPECT_EQ(r.rc, 1);
    EXPECT_EQ(r.out.rfind("error: gguf: ", 0), 0u) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    r = info(q(test::temp_dir() + "/missing.gguf"), true);
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.out.find("cannot open file"), std::string::npos) << r.out;
}
