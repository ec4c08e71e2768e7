// Random-weight models (`qinfer convert --random`) and the ftype type mix.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "convert/random_model.h"
#include "convert/type_mix.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace qinfer;
using namespace qinfer::test;

namespace {

// Replays the type mix over a reference file's tensors (in file order) and
// compares with the types llama-quantize chose.
void expect_mix_matches(const std::string& file, convert::Ftype ft) {
    auto f = gguf::File::open(reference_path(file));
    int64_t n_attn_v = 0;
    for (const auto& t : f->tensors())
        if (t.name.find("attn_v.weight") != std::string::npos || t.name.find("attn_qkv.weight") != std::string::npos)
            ++n_attn_v;
    convert::TypeMix mix(ft, int64_t(f->require_uint(std::string(f->require_string("general.architecture")) +
                                                     ".block_count")),
                         n_attn_v, f->find_tensor("output.weight") != nullptr);
    int checked = 0;
    for (const auto& t : f->tensors()) {
        GgmlType want = t.type;
        GgmlType got = mix.next(t.name, int(t.n_dims), t.ne[0]);
        EXPECT_EQ(type_name(got), std::string(type_name(want))) << file << ": " << t.name;
        ++checked;
    }
    EXPECT_GT(checked, 20);
}

float rms(const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return float(std::sqrt(s / double(v.size())));
}

std::vector<float> tensor_f32(const gguf::File& f, const std::string& name) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> v(size_t(t->n_elements()));
    dequantize_row(t->type, t->data, v.data(), t->n_elements());
    return v;
}

}  // namespace

TEST(ConvertTypeMix, ReproducesLlamaQuantizeChoices) {
    if (!reference_available()) GTEST_SKIP() << "reference data not found";
    expect_mix_matches("tiny-qwen35.q4_k_m.gguf", convert::Ftype::Q4_K_M);
    expect_mix_matches("tiny-qwen3.q4_k_m.gguf", convert::Ftype::Q4_K_M);
    expect_mix_matches("tiny-qwen35.q8_0.gguf", convert::Ftype::Q8_0);
    expect_mix_matches("tiny-qwen2.q8_0.gguf", convert::Ftype::Q8_0);
}

TEST(ConvertTypeMix, RulesAndNames) {
    EXPECT_EQ(convert::ftype_from_name("Q4_K_M"), convert::Ftype::Q4_K_M);
    EXPECT_FALSE(convert::ftype_from_name("q3_k_xl"));
    EXPECT_EQ(convert::llama_ftype(convert::Ftype::Q4_K_M), 15u);
    // 24 layers: use_more_bits promotes {0,1,2,5,8,11,14,17,20,21,22,23} (quants.md §9.2).
    convert::TypeMix mix(convert::Ftype::Q4_K_M, 24, 24, false);
    std::string got;
    for (int i = 0; i < 24; ++i)
        if (mix.next("blk." + std::to_string(i) + ".attn_v.weight", 2, 1024) == GgmlType::Q6_K)
            got += std::to_string(i) + " ";
    EXPECT_EQ(got, "0 1 2 5 8 11 14 17 20 21 22 23 ");
    EXPECT_EQ(mix.next("token_embd.weight", 2, 1024), GgmlType::Q6_K);  // tied head
    EXPECT_EQ(mix.next("blk.0.ssm_out.weight", 2, 4096), GgmlType::Q4_K);
    EXPECT_EQ(mix.next("blk.0.ssm_out.weight", 2, 128 + 32), GgmlType::Q5_0);  // not whole 256-blocks
    EXPECT_EQ(mix.next("blk.0.ssm_out.weight", 2, 48), GgmlType::F16);         // not whole 32-blocks
    EXPECT_EQ(mix.next("blk.0.ssm_conv1d.weight", 2, 4), GgmlType::F32);
    EXPECT_EQ(mix.next("blk.0.attn_norm.weight", 1, 1024), GgmlType::F32);
}

TEST(ConvertRandom, TinyQwen35Q4KMLoadsAndRuns) {
    const std::string out = temp_dir() + "/rand-tiny.q4_k_m.gguf";
    std::string log;
    ASSERT_EQ(run_command(qinfer_binary() + " convert --random tiny-qwen35 --outtype q4_k_m --seed 3 -t 2 " + out,
                          &log, true),
              0)
        << log;
    auto f = gguf::File::open(out);
    EXPECT_EQ(f->require_string("general.architecture"), "qwen35");
    EXPECT_EQ(f->require_uint("general.file_type"), 15u);
    EXPECT_EQ(f->find_tensor("token_embd.weight")->type, GgmlType::Q6_K);
    EXPECT_EQ(f->find_tensor("blk.0.attn_qkv.weight")->type, GgmlType::Q6_K);
    EXPECT_EQ(f->find_tensor("blk.1.attn_qkv.weight")->type, GgmlType::Q4_K);
    EXPECT_EQ(f->find_tensor("blk.0.ssm_out.weight")->type, GgmlType::Q5_0);
    EXPECT_EQ(f->find_tensor("blk.0.ssm_conv1d.weight")->type, GgmlType::F32);
    // Same shapes and tensor set as the reference tiny model of MANIFEST §3.
    if (reference_available()) {
        auto ref = gguf::File::open(reference_path("tiny-qwen35.q4_k_m.gguf"));
        ASSERT_EQ(f->tensors().size(), ref->tensors().size());
        for (const auto& t : ref->tensors()) {
            const gguf::TensorInfo* m = f->find_tensor(t.name);
            ASSERT_NE(m, nullptr) << t.name;
            for (int d = 0; d < 4; ++d) EXPECT_EQ(m->ne[d], t.ne[d]) << t.name;
            EXPECT_EQ(m->type, t.type) << t.name;
        }
    }
    // Weight statistics as designed: matrices ~N(0, 1/n_in), norms ~1, ssm_a < 0, dt bias ~ -1.
    EXPECT_NEAR(rms(tensor_f32(*f, "blk.0.ffn_up.weight")), 1.f / 16.f, 0.01f);
    EXPECT_NEAR(rms(tensor_f32(*f, "blk.0.ffn_down.weight")), 1.f / std::sqrt(512.f), 0.01f);
    auto a = tensor_f32(*f, "blk.0.ssm_a");
    for (float x : a) EXPECT_TRUE(x <= -1.f && x >= -16.f) << x;
    auto n = tensor_f32(*f, "blk.0.attn_norm.weight");
    for (float x : n) EXPECT_NEAR(x, 1.f, 0.6f);
    // DeltaNet key rows lean on the query rows: correlation ~0.9 (quantized).
    auto qkv = tensor_f32(*f, "blk.1.attn_qkv.weight");
    const int64_t Dk = 2 * 32, E = 256;
    double qk = 0, qq = 0, kk = 0, qo = 0;
    for (int64_t r = 0; r < Dk; ++r)
        for (int64_t c = 0; c < E; ++c) {
            double q = qkv[size_t(r * E + c)], k = qkv[size_t((r + Dk) * E + c)], o = qkv[size_t((r + 2 * Dk) * E + c)];
            qk += q * k;
            qq += q * q;
            kk += k * k;
            qo += q * o;
        }
    EXPECT_NEAR(qk / std::sqrt(qq * kk), 0.9, 0.05);
    EXPECT_NEAR(qo / std::sqrt(qq * kk), 0.0, 0.1);

    // The synthetic vocabulary loads and round-trips bytes.
    Tokenizer tok(*f);
    EXPECT_EQ(tok.decode(tok.encode("Hello, wörld!")), "Hello, wörld!");
    EXPECT_EQ(tok.find_token("<|im_end|>"), tok.eos_id());

    ModelOptions mo;
    mo.n_ctx = 64;
    mo.n_threads = 2;
    auto model = Model::load(out, mo);
    Batch b;
    for (int i = 0; i < 8; ++i) b.add(int32_t(100 + 13 * i), i, 0, i == 7);
    std::vector<float> logits;
    model->forward(b, logits);
    ASSERT_EQ(logits.size(), size_t(8218));
    EXPECT_GT(rms(logits), 0.05f);
    EXPECT_LT(rms(logits), 20.f);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

TEST(ConvertRandom, DeterministicPerSeed) {
    auto make = [](uint64_t seed, int threads, const std::string& name) {
        convert::RandomModelOptions o;
        o.preset = "tiny-qwen35";
        o.ftype = convert::Ftype::F16;
        o.seed = seed;
        o.n_threads = threads;
        const std::string p = temp_dir() + "/" + name;
        convert::write_random_model(p, o);
        return read_bytes(p);
    };
    auto a = make(7, 1, "r7a.gguf"), b = make(7, 2, "r7b.gguf"), c = make(8, 2, "r8.gguf");
    EXPECT_EQ(a, b) << "output depends on the thread count";
    EXPECT_NE(a, c);
    auto q = [](int threads, const std::string& name) {
        convert::RandomModelOptions o;
        o.preset = "tiny-qwen35";
        o.ftype = convert::Ftype::Q4_K_M;
        o.seed = 5;
        o.n_threads = threads;
        convert::write_random_model(temp_dir() + "/" + name, o);
        return read_bytes(temp_dir() + "/" + name);
    };
    EXPECT_EQ(q(1, "q5a.gguf"), q(2, "q5b.gguf")) << "quantized output depends on the thread count";
    EXPECT_THROW(convert::random_preset("qwen9-99b"), Error);
    for (const std::string& p : convert::random_presets()) {
        convert::HfConfig c2 = convert::random_preset(p);
        EXPECT_GT(c2.n_layer, 0) << p;
    }
    convert::HfConfig q4 = convert::random_preset("qwen35-4b");
    EXPECT_EQ(q4.n_embd, 2560);
    EXPECT_EQ(q4.ssm_v_heads, 32);
    EXPECT_EQ(q4.vocab_size, 248320);
}
