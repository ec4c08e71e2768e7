// Shape presets and the llama-quantize type mix: exact byte counts of
// spec/models.md §9.3-9.4 and quants.md §9, and tensor tables identical to the
// reference tiny GGUFs (which llama.cpp's quantizer wrote).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "common/error.h"
#include "gguf/gguf.h"
#include "plan/presets.h"
#include "testutil.h"

using namespace qinfer;

namespace {

uint64_t layer_bytes(const std::vector<TensorEntry>& ts, int64_t il) {
    uint64_t n = 0;
    for (const TensorEntry& t : ts)
        if (tensor_layer(t.name) == il) n += t.nbytes;
    return n;
}

uint64_t layers_total(const std::vector<TensorEntry>& ts) {
    uint64_t n = 0;
    for (const TensorEntry& t : ts)
        if (tensor_layer(t.name) >= 0) n += t.nbytes;
    return n;
}

uint64_t total(const std::vector<TensorEntry>& ts) {
    uint64_t n = 0;
    for (const TensorEntry& t : ts) n += t.nbytes;
    return n;
}

const TensorEntry& find(const std::vector<TensorEntry>& ts, const std::string& name) {
    for (const TensorEntry& t : ts)
        if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
}

}  // namespace

TEST(PlanPresets, Qwen35_4B_Q4KM_BytesOfSpec94) {
    ModelDesc m = preset_model("qwen35-4b-q4_k_m");
    EXPECT_EQ(m.name, "qwen35-4b-q4_k_m");
    EXPECT_EQ(m.hp.n_layer, 32);
    EXPECT_EQ(m.hp.n_attention_layers(), 8);
    EXPECT_EQ(m.total_bytes(), 2697836544ull);
    EXPECT_EQ(layers_total(m.tensors), 2176354304ull);
    EXPECT_EQ(find(m.tensors, "token_embd.weight").nbytes, 521472000ull);
    EXPECT_EQ(find(m.tensors, "token_embd.weight").type, GgmlType::Q6_K);
    EXPECT_EQ(find(m.tensors, "output_norm.weight").nbytes, 10240ull);
    EXPECT_EQ(m.find("output.weight"), nullptr);

    // Per layer: normal / more-bits, DeltaNet / attention (spec table §9.4).
    const std::set<int64_t> more_bits = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
    for (int64_t il = 0; il < 32; ++il) {
        const bool attn = (il + 1) % 4 == 0, more = more_bits.count(il) != 0;
        const uint64_t want = attn ? (more ? 67237888ull : 60479488ull) : (more ? 75139840ull : 63650560ull);
        EXPECT_EQ(layer_bytes(m.tensors, il), want) << "layer " << il;
        const std::string v = "blk." + std::to_string(il) + (attn ? ".attn_v.weight" : ".attn_qkv.weight");
        EXPECT_EQ(find(m.tensors, v).type, more ? GgmlType::Q6_K : GgmlType::Q4_K) << v;
    }
}

TEST(PlanPresets, Qwen3_4B_Q4KM_BytesOfSpec94) {
    ModelDesc m = preset_model("qwen3-4b");  // Q4_K_M is the default
    EXPECT_EQ(m.name, "qwen3-4b-q4_k_m");
    EXPECT_EQ(m.total_bytes(), 2491323904ull);
    EXPECT_EQ(layers_total(m.tensors), 2172248064ull);
    EXPECT_EQ(find(m.tensors, "token_embd.weight").nbytes, 319065600ull);
    const std::set<int64_t> more_bits = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35};
    for (int64_t il = 0; il < 36; ++il)
        EXPECT_EQ(layer_bytes(m.tensors, il), more_bits.count(il) ? 63888384ull : 56792064ull) << "layer " << il;
}

TEST(PlanPresets, Q8AndBf16LayerBytesOfSpec94) {
    ModelDesc q35 = preset_model("qwen35-4b-q8_0"), b35 = preset_model("qwen35-4b-bf16");
    EXPECT_EQ(layer_bytes(q35.tensors, 0), 120093440ull);
    EXPECT_EQ(layer_bytes(q35.tensors, 3), 114219008ull);
    EXPECT_EQ(layer_bytes(b35.tensors, 0), 225923840ull);
    EXPECT_EQ(layer_bytes(b35.tensors, 3), 214980608ull);
    ModelDesc q3 = preset_model("qwen3-4b-q8_0"), b3 = preset_model("QWEN3-4B-BF16");
    EXPECT_EQ(layer_bytes(q3.tensors, 7), 107254784ull);
    EXPECT_EQ(layer_bytes(b3.tensors, 7), 201872384ull);
}

TEST(PlanPresets, ParameterCountsOfSpec93) {
    auto params = [](const ModelDesc& m) {
        uint64_t n = 0;
        for (const TensorEntry& t : m.tensors) n += uint64_t(t.n_elements());
        return n;
    };
    EXPECT_EQ(params(preset_model("qwen35-4b-f16")), 4205751296ull);
    EXPECT_EQ(params(preset_model("qwen3-4b-f16")), 4022468096ull);
}

TEST(PlanPresets, PublishedQwen3SizesOfQuants93) {
    // Tensor data in GB (1e9) as quants.md §9.3 gives them, to its rounding.
    struct Case { const char* preset; double gb, tol; };
    for (const Case& c : {Case{"qwen3-8b-q4_k_m", 5.022, 0.0006}, Case{"qwen3-14b-q4_k_m", 9.00, 0.006},
                          Case{"qwen3-32b-q4_k_m", 19.76, 0.006}, Case{"qwen3-4b-q4_k_m", 2.49, 0.006},
                          Case{"qwen3-0.6b-q8_0", 0.633, 0.0006}}) {
        double gb = double(preset_model(c.preset).total_bytes()) / 1e9;
        EXPECT_NEAR(gb, c.gb, c.tol) << c.preset;
    }
}

TEST(PlanPresets, UseMoreBitsSetsOfQuants92) {
    // ffn_down promotions at Q4_K_M for the layer counts in the table.
    std::map<int64_t, std::set<int64_t>> want = {
        {28, {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27}},
        {36, {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35}},
        {40, {0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 35, 36, 37, 38, 39}},
    };
    for (const auto& [name, n] : {std::pair<const char*, int64_t>{"qwen3-0.6b", 28}, {"qwen3-8b", 36},
                                  {"qwen3-14b", 40}}) {
        ModelDesc m = preset_model(name);
        std::set<int64_t> got;
        for (int64_t il = 0; il < n; ++il)
            if (find(m.tensors, "blk." + std::to_string(il) + ".ffn_down.weight").type == GgmlType::Q6_K)
                got.insert(il);
        EXPECT_EQ(got, want[n]) << name;
    }
}

TEST(PlanPresets, UnknownNamesAreClearErrors) {
    for (const char* bad : {"qwen9-4b", "qwen35-4b-q3_x", "", "-q4_k_m", "qwen35-4b-"}) {
        try {
            preset_model(bad);
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("unknown arch preset"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("qwen35-4b"), std::string::npos) << e.what();  // lists presets
        }
    }
}

// The synthesized table for a reference file's hyperparameters and file type
// must be exactly the file's tensor table: names, shapes, types and bytes.
TEST(PlanPresets, MixMatchesReferenceFiles) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    struct Case { const char* file; FileType ft; const char* shape; };
    for (const Case& c : {Case{"tiny-qwen35.q4_k_m.gguf", FileType::Q4_K_M, "qwen35-tiny"},
                          Case{"tiny-qwen35.q8_0.gguf", FileType::Q8_0, "qwen35-tiny"},
                          Case{"tiny-qwen35.f16.gguf", FileType::F16, "qwen35-tiny"},
                          Case{"tiny-qwen3.q4_k_m.gguf", FileType::Q4_K_M, "qwen3-tiny"},
                          Case{"tiny-qwen2.q8_0.gguf", FileType::Q8_0, "qwen2-tiny"}}) {
        SCOPED_TRACE(c.file);
        auto f = gguf::File::open(test::reference_path(c.file));
        const HParams hp = HParams::from_gguf(*f);
        const std::vector<TensorEntry> got = synthesize_tensors(hp, c.ft);
        ASSERT_EQ(got.size(), f->tensors().size());
        for (const TensorEntry& t : got) {
            const gguf::TensorInfo* ti = f->find_tensor(t.name);
            ASSERT_NE(ti, nullptr) << t.name;
            EXPECT_EQ(t.type, ti->type) << t.name << ": " << type_name(t.type) << " vs " << type_name(ti->type);
            for (int i = 0; i < 4; ++i) EXPECT_EQ(t.ne[i], ti->ne[i]) << t.name;
            EXPECT_EQ(t.nbytes, ti->nbytes) << t.name;
        }
        // The named shape preset has the file's hyperparameters.
        ModelDesc p = preset_model(std::string(c.shape) + "-" + file_type_name(c.ft));
        EXPECT_EQ(p.total_bytes(), total(got));
        EXPECT_EQ(p.hp.n_embd, hp.n_embd);
        EXPECT_EQ(p.hp.n_layer, hp.n_layer);
        EXPECT_EQ(p.hp.n_head, hp.n_head);
        EXPECT_EQ(p.hp.n_head_kv, hp.n_head_kv);
        EXPECT_EQ(p.hp.head_dim, hp.head_dim);
        EXPECT_EQ(p.hp.n_rot, hp.n_rot);
        EXPECT_EQ(p.hp.n_ff, hp.n_ff);
        EXPECT_EQ(p.hp.n_vocab, hp.n_vocab);
        EXPECT_EQ(p.hp.tied_output, hp.tied_output);
        EXPECT_EQ(p.hp.recurrent, hp.recurrent);
        EXPECT_EQ(p.hp.ssm_inner, hp.ssm_inner);
        EXPECT_EQ(p.hp.ssm_conv_channels(), hp.ssm_conv_channels());
        EXPECT_EQ(p.hp.n_ctx_train, hp.n_ctx_train);
    }
}

TEST(PlanPresets, TensorLayerParsing) {
    EXPECT_EQ(tensor_layer("blk.0.attn_q.weight"), 0);
    EXPECT_EQ(tensor_layer("blk.31.ffn_down.weight"), 31);
    EXPECT_EQ(tensor_layer("token_embd.weight"), -1);
    EXPECT_EQ(tensor_layer("blk..x"), -1);
    EXPECT_EQ(tensor_layer("blk.12"), -1);
    EXPECT_EQ(tensor_layer("blk.99999999999999999999.x"), -1);
}
