// `qinfer convert` on small synthetic Hugging Face folders written by the test
// itself: tensor names and shapes, the stored transforms (+1 norms, ssm_a,
// V-head reorder), metadata, errors, and that the engine loads the result.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "common/error.h"
#include "convert/convert.h"
#include "convert/safetensors.h"
#include "convert/tensor_map.h"
#include "convert_util.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"
#include "testutil.h"

namespace fs = std::filesystem;
using namespace qinfer;
using namespace qinfer::test;
using nlohmann::json;

namespace {

// Tiny Qwen3.5 shapes: H_v = 4 > H_k = 2 so the V-head reorder is visible.
constexpr int64_t E = 64, L = 4, NH = 4, NKV = 2, HD = 16, F = 80, V = 1056;
constexpr int64_t HK = 2, HV = 4, DK = 8, KC = 4, DKT = HK * DK, DVT = HV * DK, C = 2 * DKT + DVT;

std::string tok_dir() { return source_dir() + "/tests/data/tokenizer-qwen3-1k"; }

std::string fresh_dir(const std::string& name) {
    std::string d = temp_dir() + "/" + name;
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

void copy_tokenizer(const std::string& dir) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
        fs::copy_file(tok_dir() + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
}

struct Hf {
    json config;
    std::vector<StEntry> tensors;
    StEntry* find(const std::string& n) {
        for (auto& t : tensors)
            if (t.name == n) return &t;
        return nullptr;
    }
    const std::vector<float>& values(const std::string& n) { return find(n)->values; }
};

void add(Hf& hf, const std::string& name, std::vector<int64_t> shape, const char* dtype = "F32", float scale = 0.1f,
         float offset = 0.f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v = rand_values(n, scale, std::hash<std::string>{}(name));
    for (float& x : v) {
        x += offset;
        // store exactly what the file will hold
        if (std::string(dtype) == "BF16") x = bf16_to_fp32(fp32_to_bf16(x));
        if (std::string(dtype) == "F16") x = fp16_to_fp32(fp32_to_fp16(x));
    }
    hf.tensors.push_back({name, dtype, std::move(shape), std::move(v)});
}

Hf qwen35_folder() {
    Hf hf;
    json text = {{"hidden_size", E},
                 {"num_hidden_layers", L},
                 {"num_attention_heads", NH},
                 {"num_key_value_heads", NKV},
                 {"head_dim", HD},
                 {"intermediate_size", F},
                 {"vocab_size", V},
                 {"rms_norm_eps", 1e-6},
                 {"max_position_embeddings", 8192},
                 {"layer_types", {"linear_attention", "linear_attention", "linear_attention", "full_attention"}},
                 {"linear_conv_kernel_dim", KC},
                 {"linear_key_head_dim", DK},
                 {"linear_value_head_dim", DK},
                 {"linear_num_key_heads", HK},
                 {"linear_num_value_heads", HV},
                 {"mtp_num_hidden_layers", 1},
                 {"model_type", "qwen3_5_text"},
                 {"rope_parameters",
                  {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25},
                   {"mrope_section", {1, 1, 0}}, {"mrope_interleaved", true}}}};
    hf.config = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                 {"model_type", "qwen3_5"},
                 {"tie_word_embeddings", true},
                 {"text_config", text},
                 {"vision_config", {{"depth", 1}}}};
    const std::string p = "model.language_model.";
    add(hf, p + "embed_tokens.weight", {V, E}, "BF16");
    add(hf, p + "norm.weight", {E});
    for (int64_t i = 0; i < L; ++i) {
        const std::string h = p + "layers." + std::to_string(i) + ".";
        add(hf, h + "input_layernorm.weight", {E});
        add(hf, h + "post_attention_layernorm.weight", {E});
        add(hf, h + "mlp.gate_proj.weight", {F, E}, "BF16");
        add(hf, h + "mlp.up_proj.weight", {F, E}, "BF16");
        add(hf, h + "mlp.down_proj.weight", {E, F}, "BF16");
        if (i == 3) {
            add(hf, h + "self_attn.q_proj.weight", {2 * NH * HD, E});
            add(hf, h + "self_attn.k_proj.weight", {NKV * HD, E});
            add(hf, h + "self_attn.v_proj.weight", {NKV * HD, E});
            add(hf, h + "self_attn.o_proj.weight", {E, NH * HD});
            add(hf, h + "self_attn.q_norm.weight", {HD});
            add(hf, h + "self_attn.k_norm.weight", {HD});
        } else {
            const std::string a = h + "linear_attn.";
            add(hf, a + "in_proj_qkv.weight", {C, E});
            add(hf, a + "in_proj_z.weight", {DVT, E});
            add(hf, a + "in_proj_b.weight", {HV, E});
            add(hf, a + "in_proj_a.weight", {HV, E});
            add(hf, a + "A_log", {HV}, "F32", 1.0f);
            add(hf, a + "dt_bias", {HV}, "F32", 0.25f, -1.0f);
            add(hf, a + "conv1d.weight", {C, 1, KC}, "F32", 0.3f);
            add(hf, a + "norm.weight", {DK}, "F32", 0.1f, 1.0f);
            add(hf, a + "out_proj.weight", {E, DVT});
        }
    }
    // Parts the converter skips with a note.
    add(hf, "model.visual.patch_embed.proj.weight", {8, 8});
    add(hf, "mtp.fc.weight", {E, 2 * E});
    return hf;
}

Hf qwen2_folder() {
    Hf hf;
    hf.config = {{"architectures", {"Qwen2ForCausalLM"}}, {"model_type", "qwen2"}, {"hidden_size", E},
                 {"num_hidden_layers", 2}, {"num_attention_heads", NH}, {"num_key_value_heads", NKV},
                 {"intermediate_size", 96}, {"vocab_size", V}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1e6},
                 {"max_position_embeddings", 4096}, {"tie_word_embeddings", false}, {"bos_token_id", 1024},
                 {"eos_token_id", 1026}};
    const int64_t d = E / NH;
    add(hf, "model.embed_tokens.weight", {V, E}, "F16");
    add(hf, "lm_head.weight", {V, E}, "F16");
    add(hf, "model.norm.weight", {E}, "F32", 0.1f, 1.0f);
    for (int i = 0; i < 2; ++i) {
        const std::string h = "model.layers." + std::to_string(i) + ".";
        add(hf, h + "input_layernorm.weight", {E}, "F32", 0.1f, 1.0f);
        add(hf, h + "post_attention_layernorm.weight", {E}, "F32", 0.1f, 1.0f);
        add(hf, h + "self_attn.q_proj.weight", {E, E}, "F16");
        add(hf, h + "self_attn.q_proj.bias", {E}, "F16");
        add(hf, h + "self_attn.k_proj.weight", {NKV * d, E}, "F16");
        add(hf, h + "self_attn.k_proj.bias", {NKV * d}, "F16");
        add(hf, h + "self_attn.v_proj.weight", {NKV * d, E}, "F16");
        add(hf, h + "self_attn.v_proj.bias", {NKV * d}, "F16");
        add(hf, h + "self_attn.o_proj.weight", {E, E}, "F16");
        add(hf, h + "mlp.gate_proj.weight", {96, E}, "F16");
        add(hf, h + "mlp.up_proj.weight", {96, E}, "F16");
        add(hf, h + "mlp.down_proj.weight", {E, 96}, "F16");
    }
    return hf;
}

// Writes the folder; layers >= 2 go to a second shard named by an index file.
std::string write_folder(const Hf& hf, const std::string& name, bool sharded = true) {
    std::string d = fresh_dir(name);
    write_file(d + "/config.json", hf.config.dump(1));
    copy_tokenizer(d);
    if (!sharded) {
        write_file(d + "/model.safetensors", encode_st(hf.tensors));
        return d;
    }
    std::vector<StEntry> a, b;
    json wm = json::object();
    for (const StEntry& t : hf.tensors) {
        bool second = t.name.find("layers.2.") != std::string::npos || t.name.find("layers.3.") != std::string::npos;
        (second ? b : a).push_back(t);
        wm[t.name] = second ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    }
    write_file(d + "/model-00001-of-00002.safetensors", encode_st(a));
    write_file(d + "/model-00002-of-00002.safetensors", encode_st(b));
    write_file(d + "/model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", wm}}.dump());
    return d;
}

std::vector<float> gguf_f32(const gguf::File& f, const std::string& name) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    if (!t) return {};
    std::vector<float> v(size_t(t->n_elements()));
    dequantize_row(t->type, t->data, v.data(), t->n_elements());
    return v;
}

std::string convert_error(const std::string& dir) {
    try {
        convert::ConvertOptions o;
        convert::convert_hf(dir, dir + "/out.gguf", o);
    } catch (const Error& e) {
        EXPECT_FALSE(fs::exists(dir + "/out.gguf")) << "a failed conversion left a file behind";
        return e.what();
    }
    return "";
}

}  // namespace

TEST(ConvertSafetensors, ReadsDtypesAndRejectsBadHeaders) {
    std::vector<StEntry> ts = {{"a", "F32", {2, 3}, {1, 2, 3, 4, 5, 6}},
                               {"b", "BF16", {4}, {1.5f, -2.f, 0.25f, 3.f}},
                               {"c", "F16", {2}, {0.5f, -0.125f}}};
    auto bytes = encode_st(ts);
    convert::SafetensorsFile f(bytes.data(), bytes.size(), "mem");
    ASSERT_EQ(f.tensors().size(), 3u);
    float buf[6];
    convert::st_read_f32(f.tensors()[0], 0, 6, buf);
    EXPECT_EQ(buf[5], 6.f);
    convert::st_read_f32(f.tensors()[1], 1, 3, buf);
    EXPECT_EQ(buf[0], -2.f);
    EXPECT_EQ(buf[2], 3.f);
    convert::st_read_f32(f.tensors()[2], 0, 2, buf);
    EXPECT_EQ(buf[1], -0.125f);
    EXPECT_THROW(convert::st_read_f32(f.tensors()[0], 4, 3, buf), Error);

    auto expect_bad = [](std::vector<uint8_t> b, const char* what) {
        try {
            convert::SafetensorsFile g(b.data(), b.size(), "bad");
            ADD_FAILURE() << "accepted: " << what;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    expect_bad(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 5), "too small");
    auto trunc = bytes;
    trunc.resize(trunc.size() - 3);
    expect_bad(trunc, "outside the data section");
    auto huge = bytes;
    huge[6] = 0x7f;
    expect_bad(huge, "exceeds the file size");
    auto text = [](const std::string& hdr) {
        std::vector<uint8_t> b(8);
        for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(uint64_t(hdr.size()) >> (8 * i));
        b.insert(b.end(), hdr.begin(), hdr.end());
        b.resize(b.size() + 16, 0);
        return b;
    };
    expect_bad(text("{\"x\": 1"), "not valid JSON");
    expect_bad(text(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})"), "need 12");
    expect_bad(text(R"({"x": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}})"), "unknown dtype");
    expect_bad(text(R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})"), "non-negative");
    expect_bad(text(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                        "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})"),
               "overlap");
}

// Corrupted files must fail with Error (never crash or read out of bounds):
// random byte flips over the header and data, and every truncation.
TEST(ConvertSafetensors, CorruptedFilesFailCleanly) {
    std::vector<StEntry> ts = {{"model.a", "F32", {4, 8}, rand_values(32, 1.f, 1)},
                               {"model.b", "BF16", {16}, rand_values(16, 1.f, 2)}};
    const auto good = encode_st(ts);
    uint64_t s = 12345;
    int ok = 0, rejected = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        auto b = good;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int flips = 1 + int((s >> 60) & 3);
        for (int k = 0; k < flips; ++k) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            b[size_t((s >> 33) % b.size())] = uint8_t(s >> 20);
        }
        if (iter % 3 == 0) b.resize(size_t((s >> 40) % b.size()));
        try {
            convert::SafetensorsFile f(b.data(), b.size(), "fuzz");
            float buf[32];
            for (const auto& t : f.tensors())
                if (convert::st_is_float(t.dtype) && t.n_elements() <= 32) convert::st_read_f32(t, 0, t.n_elements(), buf);
            ++ok;
        } catch (const Error&) {
            ++rejected;
        }
    }
    EXPECT_GT(rejected, 1000);
    EXPECT_GT(ok, 10);
}

TEST(ConvertHf, Qwen35LayoutTransformsAndLoad) {
    Hf hf = qwen35_folder();
    std::string dir = write_folder(hf, "q35");
    std::string out = dir + "/model.gguf";
    std::string log;
    int rc = run_command(qinfer_binary() + " convert " + dir + " " + out + " --outtype f32", &log, true);
    ASSERT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("vision"), std::string::npos) << "no note about the skipped vision tower: " << log;
    EXPECT_NE(log.find("MTP"), std::string::npos) << log;

    auto f = gguf::File::open(out);
    EXPECT_EQ(f->require_string("general.architecture"), "qwen35");
    EXPECT_EQ(f->require_uint("qwen35.block_count"), uint64_t(L));
    EXPECT_EQ(f->require_uint("qwen35.embedding_length"), uint64_t(E));
    EXPECT_EQ(f->require_uint("qwen35.attention.key_length"), uint64_t(HD));
    EXPECT_EQ(f->require_uint("qwen35.rope.dimension_count"), uint64_t(HD / 4));
    EXPECT_EQ(f->require_uint("qwen35.ssm.group_count"), uint64_t(HK));
    EXPECT_EQ(f->require_uint("qwen35.ssm.time_step_rank"), uint64_t(HV));
    EXPECT_EQ(f->require_uint("qwen35.ssm.state_size"), uint64_t(DK));
    EXPECT_EQ(f->require_uint("qwen35.ssm.inner_size"), uint64_t(DVT));
    EXPECT_EQ(f->require_uint("qwen35.ssm.conv_kernel"), uint64_t(KC));
    EXPECT_EQ(f->require_uint("qwen35.full_attention_interval"), 4u);
    EXPECT_FLOAT_EQ(float(f->require_float("qwen35.rope.freq_base")), 1e7f);
    const gguf::Value* sec = f->find("qwen35.rope.dimension_sections");
    ASSERT_TRUE(sec && sec->is_array() && sec->count == 4);
    EXPECT_EQ(sec->int_at(0), 1);
    EXPECT_EQ(sec->int_at(2), 0);
    EXPECT_EQ(sec->int_at(3), 0);
    EXPECT_EQ(f->require_string("tokenizer.ggml.pre"), "qwen35");
    const auto* toks = f->get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(toks);
    ASSERT_EQ(toks->size(), size_t(V));
    EXPECT_EQ((*toks)[1050], "[PAD1050]");
    EXPECT_EQ((*toks)[1026], "<|im_end|>");

    // Exactly the expected tensors, with GGUF shapes.
    std::map<std::string, std::vector<int64_t>> want = {{"token_embd.weight", {E, V}}, {"output_norm.weight", {E}}};
    for (int64_t i = 0; i < L; ++i) {
        std::string b = "blk." + std::to_string(i) + ".";
        want[b + "attn_norm.weight"] = {E};
        want[b + "post_attention_norm.weight"] = {E};
        want[b + "ffn_gate.weight"] = {E, F};
        want[b + "ffn_up.weight"] = {E, F};
        want[b + "ffn_down.weight"] = {F, E};
        if (i == 3) {
            want[b + "attn_q.weight"] = {E, 2 * NH * HD};
            want[b + "attn_k.weight"] = {E, NKV * HD};
            want[b + "attn_v.weight"] = {E, NKV * HD};
            want[b + "attn_output.weight"] = {NH * HD, E};
            want[b + "attn_q_norm.weight"] = {HD};
            want[b + "attn_k_norm.weight"] = {HD};
        } else {
            want[b + "attn_qkv.weight"] = {E, C};
            want[b + "attn_gate.weight"] = {E, DVT};
            want[b + "ssm_beta.weight"] = {E, HV};
            want[b + "ssm_alpha.weight"] = {E, HV};
            want[b + "ssm_a"] = {HV};
            want[b + "ssm_dt.bias"] = {HV};
            want[b + "ssm_conv1d.weight"] = {KC, C};
            want[b + "ssm_norm.weight"] = {DK};
            want[b + "ssm_out.weight"] = {DVT, E};
        }
    }
    ASSERT_EQ(f->tensors().size(), want.size());
    for (const auto& t : f->tensors()) {
        ASSERT_TRUE(want.count(t.name)) << "unexpected tensor " << t.name;
        std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
        EXPECT_EQ(ne, want[t.name]) << t.name;
        EXPECT_EQ(t.type, GgmlType::F32) << t.name;
    }

    const std::string p = "model.language_model.";
    auto hv = [](int64_t j) { return convert::hf_value_head(j, HK, HV); };
    // §6.3 with r = 2: GGUF heads 0,1,2,3 <- HF heads 0,2,1,3.
    EXPECT_EQ(hv(0), 0);
    EXPECT_EQ(hv(1), 2);
    EXPECT_EQ(hv(2), 1);
    EXPECT_EQ(hv(3), 3);

    // Zero-centred norms get +1; ssm_norm does not.
    auto on = gguf_f32(*f, "output_norm.weight");
    auto hn = hf.values(p + "norm.weight");
    for (int64_t i = 0; i < E; ++i) EXPECT_FLOAT_EQ(on[size_t(i)], hn[size_t(i)] + 1.f);
    auto qn = gguf_f32(*f, "blk.3.attn_q_norm.weight");
    EXPECT_FLOAT_EQ(qn[5], hf.values(p + "layers.3.self_attn.q_norm.weight")[5] + 1.f);
    auto pan = gguf_f32(*f, "blk.1.post_attention_norm.weight");
    EXPECT_FLOAT_EQ(pan[7], hf.values(p + "layers.1.post_attention_layernorm.weight")[7] + 1.f);
    auto sn = gguf_f32(*f, "blk.0.ssm_norm.weight");
    EXPECT_EQ(sn, hf.values(p + "layers.0.linear_attn.norm.weight"));

    const std::string a = p + "layers.2.linear_attn.";
    auto ssm_a = gguf_f32(*f, "blk.2.ssm_a");
    auto dt = gguf_f32(*f, "blk.2.ssm_dt.bias");
    for (int64_t j = 0; j < HV; ++j) {
        EXPECT_FLOAT_EQ(ssm_a[size_t(j)], -std::exp(hf.values(a + "A_log")[size_t(hv(j))])) << j;
        EXPECT_LT(ssm_a[size_t(j)], 0.f);
        EXPECT_EQ(dt[size_t(j)], hf.values(a + "dt_bias")[size_t(hv(j))]) << j;
    }
    // attn_qkv: q and k rows in place, value rows reordered by head.
    auto qkv = gguf_f32(*f, "blk.2.attn_qkv.weight");
    const auto& hq = hf.values(a + "in_proj_qkv.weight");
    auto row_eq = [&](const std::vector<float>& g, int64_t gr, const std::vector<float>& h, int64_t hr, int64_t n) {
        return std::equal(g.begin() + gr * n, g.begin() + (gr + 1) * n, h.begin() + hr * n);
    };
    for (int64_t r = 0; r < 2 * DKT; ++r) EXPECT_TRUE(row_eq(qkv, r, hq, r, E)) << r;
    for (int64_t j = 0; j < HV; ++j)
        for (int64_t e = 0; e < DK; ++e)
            EXPECT_TRUE(row_eq(qkv, 2 * DKT + j * DK + e, hq, 2 * DKT + hv(j) * DK + e, E)) << j << "," << e;
    auto z = gguf_f32(*f, "blk.2.attn_gate.weight");
    for (int64_t j = 0; j < HV; ++j)
        EXPECT_TRUE(row_eq(z, j * DK + 3, hf.values(a + "in_proj_z.weight"), hv(j) * DK + 3, E)) << j;
    auto alpha = gguf_f32(*f, "blk.2.ssm_alpha.weight");
    auto beta = gguf_f32(*f, "blk.2.ssm_beta.weight");
    for (int64_t j = 0; j < HV; ++j) {
        EXPECT_TRUE(row_eq(alpha, j, hf.values(a + "in_proj_a.weight"), hv(j), E)) << j;
        EXPECT_TRUE(row_eq(beta, j, hf.values(a + "in_proj_b.weight"), hv(j), E)) << j;
    }
    // conv1d [C,1,K] -> {K, C}: channel rows, value channels reordered like attn_qkv rows.
    auto conv = gguf_f32(*f, "blk.2.ssm_conv1d.weight");
    const auto& hc = hf.values(a + "conv1d.weight");
    EXPECT_TRUE(row_eq(conv, 5, hc, 5, KC));
    EXPECT_TRUE(row_eq(conv, DKT + 2, hc, DKT + 2, KC));
    EXPECT_TRUE(row_eq(conv, 2 * DKT + 1 * DK + 4, hc, 2 * DKT + 2 * DK + 4, KC));
    // out_proj [E, D_v]: input columns reordered in blocks of d_v.
    auto so = gguf_f32(*f, "blk.2.ssm_out.weight");
    const auto& ho = hf.values(a + "out_proj.weight");
    for (int64_t r : {0, 17, 63})
        for (int64_t j = 0; j < HV; ++j)
            for (int64_t e = 0; e < DK; ++e)
                EXPECT_EQ(so[size_t(r * DVT + j * DK + e)], ho[size_t(r * DVT + hv(j) * DK + e)]);
    // Plain copies: attn_q keeps its per-head [query | gate] interleave; bf16 source exact.
    EXPECT_EQ(gguf_f32(*f, "blk.3.attn_q.weight"), hf.values(p + "layers.3.self_attn.q_proj.weight"));
    EXPECT_EQ(gguf_f32(*f, "token_embd.weight"), hf.values(p + "embed_tokens.weight"));
    EXPECT_EQ(gguf_f32(*f, "blk.0.ffn_down.weight"), hf.values(p + "layers.0.mlp.down_proj.weight"));

    // The engine loads the file and produces finite logits.
    ModelOptions mo;
    mo.n_ctx = 64;
    mo.n_threads = 2;
    auto model = Model::load(out, mo);
    EXPECT_EQ(model->hparams().n_vocab, V);
    EXPECT_EQ(model->hparams().n_attention_layers(), 1);
    Batch batch;
    for (int i = 0; i < 5; ++i) batch.add(int32_t(10 + 97 * i), i, 0, true);
    std::vector<float> logits;
    model->forward(batch, logits);
    ASSERT_EQ(logits.size(), size_t(5 * V));
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

TEST(ConvertHf, Qwen35Q8_0TypesAndLayerSchedule) {
    Hf hf = qwen35_folder();
    std::string dir = write_folder(hf, "q35q8", false);
    convert::ConvertOptions o;
    o.outtype = GgmlType::Q8_0;
    auto r = convert::convert_hf(dir, dir + "/q8.gguf", o);
    EXPECT_EQ(r.arch, "qwen35");
    auto f = gguf::File::open(dir + "/q8.gguf");
    EXPECT_EQ(f->find_tensor("blk.0.attn_qkv.weight")->type, GgmlType::Q8_0);
    EXPECT_EQ(f->find_tensor("token_embd.weight")->type, GgmlType::Q8_0);
    EXPECT_EQ(f->find_tensor("blk.0.ssm_conv1d.weight")->type, GgmlType::F32);
    EXPECT_EQ(f->find_tensor("blk.0.ssm_a")->type, GgmlType::F32);
    EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight")->type, GgmlType::F32);
    // ffn_down rows have 80 elements: not whole Q8_0 blocks -> F16, like llama.cpp.
    EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->type, GgmlType::F16);
    EXPECT_EQ(f->require_uint("general.file_type"), 7u);
    EXPECT_EQ(f->require_uint("general.quantization_version"), 2u);

    // A schedule no interval describes (layers 0 and 3 attention) is written as
    // attention.recurrent_layers; layer 0 gets a copy of layer 3's attention weights.
    std::string dir2 = fresh_dir("q35odd");
    Hf hf2 = qwen35_folder();
    hf2.config["text_config"]["layer_types"] = {"full_attention", "linear_attention", "linear_attention",
                                                "full_attention"};
    std::vector<StEntry> ts;
    for (auto t : hf2.tensors) {
        if (t.name.find("layers.0.linear_attn") != std::string::npos) continue;
        ts.push_back(t);
        if (t.name.find("layers.3.self_attn") != std::string::npos) {
            t.name.replace(t.name.find("layers.3."), 9, "layers.0.");
            ts.push_back(t);
        }
    }
    write_file(dir2 + "/config.json", hf2.config.dump());
    copy_tokenizer(dir2);
    write_file(dir2 + "/model.safetensors", encode_st(ts));
    convert::convert_hf(dir2, dir2 + "/m.gguf", {});
    auto g = gguf::File::open(dir2 + "/m.gguf");
    EXPECT_FALSE(g->has("qwen35.full_attention_interval"));
    const gguf::Value* rl = g->find("qwen35.attention.recurrent_layers");
    ASSERT_TRUE(rl && rl->is_array() && rl->count == 4);
    EXPECT_EQ(rl->int_at(0), 0);
    EXPECT_EQ(rl->int_at(1), 1);
    EXPECT_EQ(rl->int_at(3), 0);
    ModelOptions mo;
    mo.n_ctx = 16;
    mo.n_threads = 1;
    auto model = Model::load(dir2 + "/m.gguf", mo);
    EXPECT_FALSE(model->hparams().is_recurrent(0));
    EXPECT_TRUE(model->hparams().is_recurrent(1));
}

TEST(ConvertHf, Qwen2BiasesUntiedHead) {
    Hf hf = qwen2_folder();
    std::string dir = write_folder(hf, "q2", false);
    convert::ConvertOptions o;
    o.outtype = GgmlType::BF16;
    convert::convert_hf(dir, dir + "/m.gguf", o);
    auto f = gguf::File::open(dir + "/m.gguf");
    EXPECT_EQ(f->require_string("general.architecture"), "qwen2");
    EXPECT_EQ(f->require_string("tokenizer.ggml.pre"), "qwen2");
    EXPECT_FALSE(f->has("qwen2.attention.key_length"));  // derived from E / n_head
    EXPECT_EQ(f->require_uint("general.file_type"), 32u);
    ASSERT_NE(f->find_tensor("output.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("output.weight")->type, GgmlType::BF16);
    EXPECT_EQ(f->find_tensor("blk.1.attn_k.bias")->type, GgmlType::F32);
    EXPECT_EQ(f->find_tensor("blk.1.attn_k.bias")->ne[0], 2 * E / NH);
    ASSERT_NE(f->find_tensor("blk.0.ffn_norm.weight"), nullptr);
    // qwen2 norms are stored as-is (no +1).
    EXPECT_EQ(gguf_f32(*f, "blk.0.ffn_norm.weight"), hf.values("model.layers.0.post_attention_layernorm.weight"));
    EXPECT_EQ(gguf_f32(*f, "blk.1.attn_v.bias"), hf.values("model.layers.1.self_attn.v_proj.bias"));
    EXPECT_EQ(f->require_uint("tokenizer.ggml.bos_token_id"), 1024u);  // config.json fallback
    EXPECT_EQ(f->require_uint("tokenizer.ggml.eos_token_id"), 1026u);  // tokenizer_config.json eos_token
    ModelOptions mo;
    mo.n_ctx = 16;
    mo.n_threads = 1;
    auto model = Model::load(dir + "/m.gguf", mo);
    EXPECT_FALSE(model->hparams().tied_output);
    EXPECT_TRUE(model->hparams().has_qkv_bias);
}

TEST(ConvertHf, ClearErrors) {
    {  // unsupported architecture
        Hf hf = qwen2_folder();
        hf.config["architectures"] = {"LlamaForCausalLM"};
        std::string e = convert_error(write_folder(hf, "e_arch", false));
        EXPECT_NE(e.find("unsupported architecture 'LlamaForCausalLM'"), std::string::npos) << e;
    }
    {  // missing shard
        Hf hf = qwen35_folder();
        std::string d = write_folder(hf, "e_shard");
        fs::remove(d + "/model-00002-of-00002.safetensors");
        std::string e = convert_error(d);
        EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;
        EXPECT_NE(e.find("missing"), std::string::npos) << e;
    }
    {  // non-float dtype
        Hf hf = qwen2_folder();
        hf.find("model.layers.1.self_attn.q_proj.weight")->dtype = "I32";
        std::string e = convert_error(write_folder(hf, "e_dtype", false));
        EXPECT_NE(e.find("model.layers.1.self_attn.q_proj.weight"), std::string::npos) << e;
        EXPECT_NE(e.find("dtype I32"), std::string::npos) << e;
    }
    {  // shape mismatch against config.json
        Hf hf = qwen2_folder();
        hf.config["intermediate_size"] = 128;
        std::string e = convert_error(write_folder(hf, "e_shape", false));
        EXPECT_NE(e.find("mlp.gate_proj.weight' has shape [96, 64] but config.json implies [128, 64]"),
                  std::string::npos)
            << e;
    }
    {  // missing tensor
        Hf hf = qwen2_folder();
        hf.tensors.erase(hf.tensors.begin() + 5);
        std::string e = convert_error(write_folder(hf, "e_missing", false));
        EXPECT_NE(e.find("is missing from the checkpoint"), std::string::npos) << e;
    }
    {  // leftover tensor: config has fewer layers than the weights
        Hf hf = qwen2_folder();
        hf.config["num_hidden_layers"] = 1;
        std::string e = convert_error(write_folder(hf, "e_extra", false));
        EXPECT_NE(e.find("model.layers.1."), std::string::npos) << e;
        EXPECT_NE(e.find("not used"), std::string::npos) << e;
    }
    {  // tokenizer larger than the embedding
        Hf hf = qwen2_folder();
        hf.config["vocab_size"] = 1000;
        for (auto& t : hf.tensors)
            if (t.shape[0] == V) {
                t.shape[0] = 1000;
                t.values.resize(size_t(1000 * E));
            }
        std::string e = convert_error(write_folder(hf, "e_vocab", false));
        EXPECT_NE(e.find("vocab_size is 1000"), std::string::npos) << e;
    }
    {  // no config.json / no weights
        std::string d = fresh_dir("e_empty");
        EXPECT_NE(convert_error(d).find("config.json"), std::string::npos);
        write_file(d + "/config.json", qwen2_folder().config.dump());
        EXPECT_NE(convert_error(d).find("no model.safetensors.index.json and no *.safetensors"), std::string::npos);
    }
    // The CLI prints one line and exits non-zero.
    std::string out;
    int rc = run_command(qinfer_binary() + " convert " + temp_dir() + "/e_arch " + temp_dir() + "/x.gguf", &out, true);
    EXPECT_EQ(rc, 1);
    EXPECT_EQ(out.rfind("error: convert: ", 0), 0u) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    rc = run_command(qinfer_binary() + " convert a b --outtype q4_k_m", &out, true);
    EXPECT_NE(rc, 0);
}
