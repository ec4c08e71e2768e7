// The memory planner: state sizes of spec/models.md §9.2, the split rule,
// -ngl recommendation and the largest context for given memory.
#include <gtest/gtest.h>

#include "common/error.h"
#include "gguf/gguf.h"
#include "plan/planner.h"
#include "plan/presets.h"
#include "testutil.h"

using namespace qinfer;

namespace {

MemoryPlan plan_preset(const char* name, int64_t n_ctx = 4096, GgmlType kv = GgmlType::F16, int slots = 1) {
    PlanOptions o;
    o.n_ctx = n_ctx;
    o.kv_type = kv;
    o.n_slots = slots;
    return plan_memory(preset_model(name), o);
}

}  // namespace

TEST(PlanPlanner, StateBytesOfSpec92) {
    MemoryPlan q35 = plan_preset("qwen35-4b-q4_k_m"), q3 = plan_preset("qwen3-4b-q4_k_m");
    EXPECT_EQ(q35.kv_bytes_per_token, 32768u);
    EXPECT_EQ(q35.recurrent_bytes_per_seq, 52690944u);
    EXPECT_EQ(q3.kv_bytes_per_token, 147456u);
    EXPECT_EQ(q3.recurrent_bytes_per_seq, 0u);
    // The table of §9.2: KV, and KV + recurrent, at three contexts (all layers on one device).
    struct Row { int64_t ctx; uint64_t q3_kv, q35_kv, q35_all; };
    for (const Row& r : {Row{4096, 603979776ull, 134217728ull, 186908672ull},
                         Row{32768, 4831838208ull, 1073741824ull, 1126432768ull},
                         Row{262144, 38654705664ull, 8589934592ull, 8642625536ull}}) {
        Split a = q35.split(33, r.ctx), b = q3.split(37, r.ctx), c = q35.split(0, r.ctx);
        EXPECT_EQ(b.gpu.kv_cache, r.q3_kv) << r.ctx;
        EXPECT_EQ(a.gpu.kv_cache, r.q35_kv) << r.ctx;
        EXPECT_EQ(a.gpu.kv_cache + a.gpu.recurrent_state, r.q35_all) << r.ctx;
        EXPECT_EQ(c.host.kv_cache + c.host.recurrent_state, r.q35_all) << r.ctx;
        EXPECT_EQ(c.gpu.total(), 0u);
    }
}

TEST(PlanPlanner, KvTypes) {
    // 8 layers x 2 x 4 kv heads x 256 = 16384 elements per token.
    EXPECT_EQ(plan_preset("qwen35-4b", 4096, GgmlType::F32).kv_bytes_per_token, 16384u * 4);
    EXPECT_EQ(plan_preset("qwen35-4b", 4096, GgmlType::Q8_0).kv_bytes_per_token, 16384u / 32 * 34);
    EXPECT_EQ(plan_preset("qwen3-4b", 4096, GgmlType::Q8_0).kv_bytes_per_token, 147456u / 2 / 32 * 34);
    EXPECT_THROW(plan_preset("qwen3-4b", 4096, GgmlType::Q4_0), Error);
    EXPECT_THROW(plan_preset("qwen3-4b", 4096, GgmlType::Q4_K), Error);
}

TEST(PlanPlanner, SlotsMultiplyState) {
    MemoryPlan p = plan_preset("qwen35-4b", 8192, GgmlType::F16, 3);
    Split s = p.split(33);
    EXPECT_EQ(s.gpu.kv_cache, 3ull * 8192 * 32768);
    EXPECT_EQ(s.gpu.recurrent_state, 3ull * 52690944);
}

// KV bytes per token worked out by hand from each reference file's metadata
// (not through HParams): sum over attention layers of 2 * n_kv * head_dim * 2.
TEST(PlanPlanner, ReferenceFilesStateByHand) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    for (const char* name : {"tiny-qwen35.q4_k_m.gguf", "tiny-qwen35.q8_0.gguf", "tiny-qwen35.f16.gguf",
                             "tiny-qwen3.q4_k_m.gguf", "tiny-qwen2.q8_0.gguf"}) {
        SCOPED_TRACE(name);
        auto f = gguf::File::open(test::reference_path(name));
        const std::string a = std::string(f->require_string("general.architecture"));
        const uint64_t layers = f->require_uint(a + ".block_count");
        const uint64_t n_head = f->require_uint(a + ".attention.head_count");
        const uint64_t n_kv = f->require_uint(a + ".attention.head_count_kv");
        const uint64_t d = f->get_uint(a + ".attention.key_length").value_or(f->require_uint(a + ".embedding_length") / n_head);
        uint64_t attn_layers = layers, rec_bytes = 0;
        if (a == "qwen35") {
            const uint64_t interval = f->require_uint("qwen35.full_attention_interval");
            attn_layers = layers / interval;
            const uint64_t K = f->require_uint("qwen35.ssm.conv_kernel"), ds = f->require_uint("qwen35.ssm.state_size");
            const uint64_t hk = f->require_uint("qwen35.ssm.group_count"), hv = f->require_uint("qwen35.ssm.time_step_rank");
            const uint64_t conv = (K - 1) * (2 * hk * ds + hv * ds), S = hv * ds * ds;
            rec_bytes = (layers - attn_layers) * 4 * (conv + S);
            EXPECT_EQ(rec_bytes, 6u * 4 * (3 * 256 + 4 * 32 * 32));  // 116736, from MANIFEST §3.2 shapes
        }
        const uint64_t kv = attn_layers * 2 * n_kv * d * 2;
        EXPECT_EQ(kv, a == "qwen35" ? 2u * 2 * 2 * 64 * 2 : 4u * 2 * 2 * 64 * 2);

        HParams hp = HParams::from_gguf(*f);
        PlanOptions o;
        MemoryPlan p = plan_memory(*f, hp, o);
        EXPECT_EQ(p.kv_bytes_per_token, kv);
        EXPECT_EQ(p.recurrent_bytes_per_seq, rec_bytes);
        // Every tensor of the file is loaded: the plan's weights are the file's tensor bytes.
        uint64_t file_bytes = 0;
        for (const gguf::TensorInfo& t : f->tensors()) file_bytes += t.nbytes;
        EXPECT_EQ(p.weight_bytes(), file_bytes);
        EXPECT_EQ(p.unused_tensors, 0);
        for (int n = 0; n <= p.max_gpu_layers(); ++n) {
            Split s = p.split(n);
            EXPECT_EQ(s.gpu.weights + s.host.weights, file_bytes) << "-ngl " << n;
        }
    }
}

TEST(PlanPlanner, SplitRuleLastLayersThenHead) {
    MemoryPlan p = plan_preset("qwen35-4b");
    EXPECT_EQ(p.max_gpu_layers(), 33);
    // -ngl 1: the last layer (31, attention) only; head and embeddings stay on the host.
    Split s1 = p.split(1);
    EXPECT_EQ(s1.gpu_attention_layers, 1);
    EXPECT_EQ(s1.gpu_recurrent_layers, 0);
    EXPECT_FALSE(s1.head_on_gpu);
    EXPECT_EQ(s1.gpu.weights, p.layers[31].weight_bytes);
    EXPECT_EQ(s1.gpu.kv_cache, 4096u * 4096);  // one attention layer: 4 KiB per token
    EXPECT_EQ(s1.gpu.logits, 0u);
    EXPECT_EQ(s1.gpu.scratch, p.scratch_base_bytes + p.scratch_attention_bytes);  // no DeltaNet buffers
    // -ngl 4: layers 28..31 = 3 DeltaNet + 1 attention.
    Split s4 = p.split(4);
    EXPECT_EQ(s4.gpu_attention_layers, 1);
    EXPECT_EQ(s4.gpu_recurrent_layers, 3);
    EXPECT_EQ(s4.gpu.recurrent_state, 3u * 2195456);
    // -ngl 32: every layer, but embedding and head (the tied matrix) on the host.
    Split s32 = p.split(32);
    EXPECT_FALSE(s32.head_on_gpu);
    EXPECT_EQ(s32.gpu.weights, p.layer_weight_bytes());
    EXPECT_EQ(s32.host.weights, p.token_embd_bytes + p.output_norm_bytes);
    EXPECT_EQ(s32.host.kv_cache + s32.host.recurrent_state, 0u);
    // -ngl 33: everything; the tied matrix serves lookup and head on the GPU.
    Split all = p.split(33);
    EXPECT_TRUE(all.head_on_gpu);
    EXPECT_TRUE(all.embed_on_gpu);
    EXPECT_EQ(all.gpu.weights, 2697836544ull);
    EXPECT_EQ(all.host.weights, 0u);
    EXPECT_EQ(all.host.scratch, 0u);  // the CPU backend runs nothing
    EXPECT_EQ(all.gpu.logits, p.head_buffer_bytes);
    EXPECT_EQ(all.host.logits, p.logit_bytes);
    // Out-of-range values clamp (-ngl 99 means everything, as in llama.cpp).
    EXPECT_EQ(p.split(99).gpu_layers, 33);
    EXPECT_EQ(p.split(-3).gpu_layers, 0);
    // GPU bytes grow with every layer moved over.
    for (int n = 1; n <= 33; ++n) EXPECT_GT(p.split(n).gpu.total(), p.split(n - 1).gpu.total()) << n;
}

TEST(PlanPlanner, UntiedHeadAndEmbeddingMoveTogether) {
    MemoryPlan p = plan_preset("qwen3-8b");  // separate output.weight
    ASSERT_GT(p.output_bytes, 0u);
    Split s36 = p.split(36), all = p.split(37);
    EXPECT_EQ(s36.host.weights, p.token_embd_bytes + p.output_bytes + p.output_norm_bytes);
    EXPECT_TRUE(all.head_on_gpu);
    EXPECT_TRUE(all.embed_on_gpu);
    EXPECT_EQ(all.host.weights, 0u);
    EXPECT_EQ(all.gpu.weights, p.weight_bytes());
}

TEST(PlanPlanner, ScratchFollowsLayerBuffers) {
    PlanOptions o;
    o.n_batch = 100;
    // qwen3-4b per token: base x,h,mix 3*2560 + ffn 2*9728 + 7 I32 step fields;
    // attention q 4096 + k,v 2*1024 + att 4096.
    MemoryPlan q3 = plan_memory(preset_model("qwen3-4b"), o);
    EXPECT_EQ(q3.scratch_base_bytes, (7680u + 19456 + 7) * 4 * 100);
    EXPECT_EQ(q3.scratch_attention_bytes, (4096u + 2048 + 4096) * 4 * 100);
    EXPECT_EQ(q3.scratch_deltanet_bytes, 0u);
    // qwen35-4b: base 7680 + 18432 + 7; attention q|gate 8192 + qn 4096 + k,v 2048 + att 4096;
    // DeltaNet qkv,conv 2*8192 + z,o,y 3*4096 + a,b 2*32.
    MemoryPlan q35 = plan_memory(preset_model("qwen35-4b"), o);
    EXPECT_EQ(q35.scratch_base_bytes, (7680u + 18432 + 7) * 4 * 100);
    EXPECT_EQ(q35.scratch_attention_bytes, (8192u + 4096 + 2048 + 4096) * 4 * 100);
    EXPECT_EQ(q35.scratch_deltanet_bytes, (16384u + 12288 + 64) * 4 * 100);
    // Head: [E + V, 32] f32.
    EXPECT_EQ(q35.head_buffer_bytes, (2560u + 248320) * 64 * 4);
}

TEST(PlanPlanner, RecommendsAllLayersOnCommonCards) {
    for (const char* name : {"qwen35-4b-q4_k_m", "qwen3-4b-q4_k_m"}) {
        MemoryPlan p = plan_preset(name);
        for (uint64_t gib : {8, 12, 24, 141}) {
            const uint64_t vram = gib * kGiB;
            EXPECT_EQ(recommend_gpu_layers(p, vram, default_safety_margin(vram)), p.max_gpu_layers())
                << name << " " << gib;
            EXPECT_TRUE(split_fits(p.split(p.max_gpu_layers()), vram, default_safety_margin(vram)));
        }
    }
}

TEST(PlanPlanner, FewerLayersWhenTight) {
    MemoryPlan p = plan_preset("qwen3-4b-q4_k_m", 16384);
    const uint64_t vram = 2 * kGiB, margin = 256 * kMiB;
    int n = recommend_gpu_layers(p, vram, margin);
    EXPECT_GT(n, 0);
    EXPECT_LT(n, p.n_layer());
    EXPECT_TRUE(split_fits(p.split(n), vram, margin));
    EXPECT_FALSE(split_fits(p.split(n + 1), vram, margin));
    EXPECT_LE(p.split(n).gpu.total() + margin, vram);
    // Less than a CUDA context: nothing goes to the GPU.
    EXPECT_EQ(recommend_gpu_layers(p, 512 * kMiB, margin), 0);
    EXPECT_EQ(recommend_gpu_layers(p, 0, 0), 0);
}

TEST(PlanPlanner, ErrorWhenNothingFits) {
    MemoryPlan p = plan_preset("qwen3-4b-q4_k_m", 32768);
    // No GPU and 2 GiB of host memory: weights alone are 2.3 GiB.
    try {
        recommend_gpu_layers(p, 0, 0, 2 * kGiB);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        std::string m = e.what();
        EXPECT_NE(m.find("does not fit"), std::string::npos) << m;
        EXPECT_NE(m.find("-ngl 0"), std::string::npos) << m;
    }
    // A GPU that holds some layers but not enough to relieve the host.
    EXPECT_THROW(recommend_gpu_layers(p, 3 * kGiB, 256 * kMiB, 2 * kGiB), Error);
    // Enough host memory once layers move to the GPU: fewer than all, more than none.
    int n = recommend_gpu_layers(p, 6 * kGiB, 256 * kMiB, 5 * kGiB);
    EXPECT_GT(n, 0);
    EXPECT_LE(p.split(n).host.total(), 5 * kGiB);
}

TEST(PlanPlanner, MaxContext) {
    const uint64_t vram = 8 * kGiB, margin = default_safety_margin(vram);
    MemoryPlan q35 = plan_preset("qwen35-4b-q4_k_m"), q3 = plan_preset("qwen3-4b-q4_k_m");
    ContextFit a = max_context_fit(q35, 33, vram, margin), b = max_context_fit(q3, 37, vram, margin);
    EXPECT_STREQ(a.limited_by, "gpu");
    EXPECT_STREQ(b.limited_by, "gpu");
    EXPECT_EQ(a.n_ctx % 256, 0);
    // The hybrid model holds several times the context of the dense one on the same card.
    EXPECT_GT(a.n_ctx, 100000);
    EXPECT_LT(b.n_ctx, 40960);
    EXPECT_GT(a.n_ctx, 3 * b.n_ctx);
    for (const MemoryPlan* p : {&q35, &q3}) {
        const int all = p->max_gpu_layers();
        const int64_t n = max_context(*p, all, vram, margin);
        EXPECT_TRUE(split_fits(p->split(all, n), vram, margin));
        EXPECT_FALSE(split_fits(p->split(all, n + 256), vram, margin));
    }
    // A big card: the trained context is the limit.
    ContextFit big = max_context_fit(q35, 33, 141 * kGiB, default_safety_margin(141 * kGiB));
    EXPECT_EQ(big.n_ctx, 262144);
    EXPECT_STREQ(big.limited_by, "trained context");
    // CPU only, with a host limit: the host bounds it.
    ContextFit host = max_context_fit(q3, 0, 0, 0, 4 * kGiB);
    EXPECT_STREQ(host.limited_by, "host");
    EXPECT_GT(host.n_ctx, 0);
    EXPECT_TRUE(split_fits(q3.split(0, host.n_ctx), 0, 0, 4 * kGiB));
    // Nothing fits: 0.
    EXPECT_EQ(max_context(q3, 37, 2 * kGiB, 256 * kMiB), 0);
}

TEST(PlanPlanner, AbsurdSizesDoNotWrap) {
    MemoryPlan p = plan_preset("qwen3-4b");
    Split s = p.split(37, int64_t(1) << 60);
    EXPECT_EQ(s.gpu.kv_cache, UINT64_MAX);
    EXPECT_EQ(s.gpu.total(), UINT64_MAX);
    EXPECT_FALSE(split_fits(s, 141 * kGiB, 0));
}

TEST(PlanPlanner, BadOptions) {
    PlanOptions o;
    o.n_ctx = 0;
    EXPECT_THROW(plan_memory(preset_model("qwen3-4b"), o), Error);
    o = PlanOptions{};
    o.n_slots = 0;
    EXPECT_THROW(plan_memory(preset_model("qwen3-4b"), o), Error);
    o = PlanOptions{};
    o.n_batch = -1;
    EXPECT_THROW(plan_memory(preset_model("qwen3-4b"), o), Error);
}

TEST(PlanPlanner, AutoGpuLayersForModelLoad) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    auto f = gguf::File::open(test::reference_path("tiny-qwen35.q4_k_m.gguf"));
    const HParams hp = HParams::from_gguf(*f);
    EXPECT_EQ(auto_gpu_layers(*f, hp, 4096, 1, 512, GgmlType::F16, 8 * kGiB), 9);  // everything
    EXPECT_EQ(auto_gpu_layers(*f, hp, 4096, 1, 512, GgmlType::F16, 0), 0);
    // The context is not counted again: with the 256 MiB margin, 400 MiB free
    // leave 144 MiB for the tiny model's 120 MiB (cuBLAS 100 MiB of it); 300 MiB
    // free leave 44 MiB, less than cuBLAS alone.
    EXPECT_EQ(auto_gpu_layers(*f, hp, 4096, 1, 512, GgmlType::F16, 400 * kMiB), 9);
    EXPECT_EQ(auto_gpu_layers(*f, hp, 4096, 1, 512, GgmlType::F16, 300 * kMiB), 0);
}

// Prompt offload: the GPU holds two arenas of the largest host layer, one
// layer's DeltaNet state and KV (the shadow) for min(4, slots) sequences; with
// every layer on the GPU nothing changes.
TEST(PlanPlanner, PromptOffloadBuffers) {
    PlanOptions o;
    o.n_ctx = 8192;
    o.n_slots = 2;
    const ModelDesc d = preset_model("qwen35-4b-q4_k_m");
    const MemoryPlan off_plan = [&] { PlanOptions x = o; x.op_offload = true; return plan_memory(d, x); }();
    const MemoryPlan plain = plan_memory(d, o);
    uint64_t largest = 0;
    for (const LayerPlan& l : plain.layers) largest = std::max(largest, l.weight_bytes);
    for (int ngl : {0, 8, 24}) {
        const Split a = plain.split(ngl), b = off_plan.split(ngl);
        EXPECT_GE(b.gpu.offload, 2 * largest) << ngl;
        EXPECT_LE(b.gpu.offload, 2 * largest + 64 * kMiB) << ngl;
        // KV shadow: one attention layer, 2 sequences, the whole context (f16 K and V).
        EXPECT_EQ(b.gpu.kv_cache - a.gpu.kv_cache, 2ull * 8192 * 4 * 256 * 2 * 2) << ngl;
        EXPECT_EQ(b.host.total(), a.host.total() + (ngl == 0 ? o.compute.host_staging_bytes : 0)) << ngl;
        EXPECT_GT(b.gpu.total(), a.gpu.total()) << ngl;
    }
    // The GPU does work at -ngl 0 now: CUDA context and both activation sets.
    EXPECT_EQ(plain.split(0).gpu.total(), 0u);
    EXPECT_EQ(off_plan.split(0).gpu.runtime, o.compute.cuda_context_bytes);
    for (int ngl : {32, 33}) EXPECT_EQ(off_plan.split(ngl).gpu.total(), plain.split(ngl).gpu.total()) << ngl;
    // The recommendation leaves room for the buffers: fewer or equal layers.
    const uint64_t vram = 3 * kGiB;
    EXPECT_LE(recommend_gpu_layers(off_plan, vram, default_safety_margin(vram)),
              recommend_gpu_layers(plain, vram, default_safety_margin(vram)));
}

// Prompt steps of 128+ tokens on the GPU dequantize each quantized weight to an
// f16 scratch for cuBLAS (at most 64 MiB, in row chunks beyond) and copy the
// input to f16: for the 4B shape the largest weight is ffn 2560 x 9216 (47.2 MB)
// and the widest input 9216 elements. Counted in the GPU workspace at -b 512,
// not at -b 64 (never that path), and not on the host.
TEST(PlanPlanner, F16PrefillScratch) {
    const ModelDesc d = preset_model("qwen35-4b-q4_k_m");
    PlanOptions o;
    o.n_batch = 512;
    const MemoryPlan p = plan_memory(d, o);
    const uint64_t weight = o.compute.gpu_alloc(2ull * 2560 * 9216), input = o.compute.gpu_alloc(2ull * 9216 * 512);
    EXPECT_EQ(p.f16_prefill_bytes, weight + input);
    PlanOptions small = o;
    small.n_batch = 64;
    const MemoryPlan q = plan_memory(d, small);
    EXPECT_EQ(q.f16_prefill_bytes, 0u);
    const Split a = p.split(33), b = q.split(33);
    EXPECT_EQ(a.host.workspace, 0u);
    EXPECT_GE(a.gpu.workspace - b.gpu.workspace, p.f16_prefill_bytes);
    EXPECT_EQ(p.split(0).gpu.workspace, 0u);  // nothing on the GPU
}
