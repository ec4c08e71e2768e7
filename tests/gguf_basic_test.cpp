#include <gtest/gtest.h>

#include "common/error.h"
#include "gguf/gguf.h"
#include "testutil.h"

using namespace qinfer;

TEST(GgufBasic, OpensEveryReferenceModel) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    struct Case { const char* file; const char* arch; size_t n_tensors_min; };
    for (const char* name : {"tiny-qwen35.q4_k_m.gguf", "tiny-qwen35.q8_0.gguf", "tiny-qwen35.f16.gguf",
                             "tiny-qwen3.q4_k_m.gguf", "tiny-qwen2.q8_0.gguf"}) {
        auto f = gguf::File::open(test::reference_path(name));
        EXPECT_EQ(f->version(), 3u) << name;
        auto arch = f->require_string("general.architecture");
        EXPECT_TRUE(arch == "qwen35" || arch == "qwen3" || arch == "qwen2") << name;
        const auto* emb = f->find_tensor("token_embd.weight");
        ASSERT_NE(emb, nullptr) << name;
        EXPECT_EQ(emb->ne[0], 256);
        EXPECT_EQ(emb->ne[1], 8218);
        const auto* toks = f->get_string_array("tokenizer.ggml.tokens");
        ASSERT_NE(toks, nullptr);
        EXPECT_EQ(toks->size(), 8218u);
    }
}

TEST(GgufBasic, Qwen35TensorTypesMatchManifest) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    auto f = gguf::File::open(test::reference_path("tiny-qwen35.q4_k_m.gguf"));
    EXPECT_EQ(f->find_tensor("token_embd.weight")->type, GgmlType::Q6_K);
    EXPECT_EQ(f->find_tensor("blk.0.ssm_out.weight")->type, GgmlType::Q5_0);
    EXPECT_EQ(f->find_tensor("blk.0.ssm_conv1d.weight")->type, GgmlType::F32);
    EXPECT_EQ(f->find_tensor("blk.3.attn_q.weight")->ne[1], 512);
    EXPECT_EQ(f->require_uint("qwen35.block_count"), 8u);
}

TEST(GgufBasic, RejectsGarbage) {
    const uint8_t junk[32] = {'G', 'G', 'U', 'X'};
    EXPECT_THROW(gguf::File::parse_memory(junk, sizeof junk, "junk"), Error);
}
