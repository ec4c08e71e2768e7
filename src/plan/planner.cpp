#include "plan/planner.h"

#include <algorithm>

#include "common/error.h"
#include "gguf/gguf.h"
#include "runtime/cuda/sizing.h"

namespace qinfer {

namespace {

// Bytes per batch token of the activation buffers a backend allocates
// (model.cpp alloc_scratch, model/layers.h Scratch), all f32.
// One entry per buffer (each its own allocation), in floats (or I32) per token.
struct ScratchWidths {
    std::vector<int64_t> base, attention, deltanet;
};
ScratchWidths scratch_widths(const HParams& hp) {
    const int64_t E = hp.n_embd, F = hp.n_ff, Q = hp.n_head * hp.head_dim, G = hp.n_head_kv * hp.head_dim;
    const bool q35 = hp.arch == Arch::Qwen35;
    ScratchWidths w;
    w.base = {E, E, E, F, F, 1, 1, 1, 4};  // x, h, mix, ffn_g, ffn_u; I32 pos, slot, ids, segments[4]
    w.attention = {q35 ? 2 * Q : Q, G, G, Q};  // q (qwen35: queries | gate), k, v, att
    if (q35) w.attention.push_back(Q);         // qn
    if (q35) {
        const int64_t C = hp.ssm_conv_channels(), Dv = hp.ssm_inner, Hv = hp.ssm_v_heads;
        w.deltanet = {C, C, Dv, Dv, Dv, Hv, Hv};  // qkv, conv, z, o, y, a, b
    }
    return w;
}

// Exact bytes and the GPU's allocation rounding of a set of [width, B] 4-byte buffers.
void buffer_set(const std::vector<int64_t>& widths, uint64_t B, const ComputeModel& cm, uint64_t* bytes,
                uint64_t* padding) {
    *bytes = *padding = 0;
    for (int64_t w : widths) {
        const uint64_t b = 4 * uint64_t(w) * B;
        *bytes += b;
        *padding += cm.gpu_alloc(b) - b;
    }
}

void check_options(const PlanOptions& o) {
    if (o.n_ctx < 1) fail(strfmt("plan: context size must be at least 1 (got %lld)", (long long)o.n_ctx));
    if (o.n_slots < 1) fail(strfmt("plan: number of slots must be at least 1 (got %d)", o.n_slots));
    if (o.n_batch < 1) fail(strfmt("plan: batch size must be at least 1 (got %d)", o.n_batch));
    if (o.kv_type != GgmlType::F16 && o.kv_type != GgmlType::F32 && o.kv_type != GgmlType::Q8_0)
        fail(strfmt("plan: KV cache type %s is not supported (f16, f32, q8_0)", type_name(o.kv_type)));
}

// Saturating arithmetic: an absurd context must read as "does not fit", not wrap.
uint64_t mul_sat(uint64_t a, uint64_t b) { return a != 0 && b > UINT64_MAX / a ? UINT64_MAX : a * b; }
uint64_t add_sat(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }

}  // namespace

uint64_t DeviceBytes::total() const {
    uint64_t t = 0;
    for (uint64_t b : {weights, kv_cache, recurrent_state, scratch, logits, workspace, runtime, offload, padding})
        t = add_sat(t, b);
    return t;
}

uint64_t ComputeModel::gpu_alloc(uint64_t bytes) const {
    if (alloc_granularity == 0 || bytes <= alloc_small_limit) return bytes;
    const uint64_t r = bytes % alloc_granularity;
    return r == 0 || bytes > UINT64_MAX - alloc_granularity ? bytes : bytes + (alloc_granularity - r);
}

uint64_t MemoryPlan::layer_weight_bytes() const {
    uint64_t n = 0;
    for (const LayerPlan& l : layers) n += l.weight_bytes;
    return n;
}

uint64_t MemoryPlan::weight_bytes() const {
    return layer_weight_bytes() + token_embd_bytes + output_bytes + output_norm_bytes;
}

MemoryPlan plan_memory(const ModelDesc& model, const PlanOptions& opt) {
    check_options(opt);
    const HParams& hp = model.hp;
    MemoryPlan p;
    p.model = model.name;
    p.hp = hp;
    p.opt = opt;

    // KV rows are head_dim elements; a block type must tile them.
    const TypeTraits& kt = traits(opt.kv_type);
    if (hp.head_dim % int64_t(kt.block_size) != 0)
        fail(strfmt("plan: %s: KV type %s needs a head size that is a multiple of %u (head size %lld)",
                    model.name.c_str(), kt.name, kt.block_size, (long long)hp.head_dim));
    const StateSizes ss = state_sizes(hp, opt.kv_type);

    p.layers.resize(size_t(hp.n_layer));
    for (int64_t i = 0; i < hp.n_layer; ++i) {
        LayerPlan& l = p.layers[size_t(i)];
        l.index = i;
        l.recurrent = hp.is_recurrent(i);
        if (l.recurrent) l.state_bytes_per_seq = ss.recurrent_bytes_per_seq_layer;
        else l.kv_bytes_per_token = ss.kv_bytes_per_token_layer;
    }
    bool have_embd = false;
    uint64_t f16_weight = 0, f16_input_k = 0;  // largest f16 weight chunk, widest K on that path
    for (const TensorEntry& t : model.tensors) {
        const int64_t il = tensor_layer(t.name);
        if (il >= 0 && il < hp.n_layer) {
            LayerPlan& l = p.layers[size_t(il)];
            l.weight_bytes += t.nbytes;
            l.weight_padding += opt.compute.gpu_alloc(t.nbytes) - t.nbytes;
            if (t.ne[1] > 1) l.widest_input = std::max(l.widest_input, t.ne[0]);
            if (is_quantized(t.type) && t.ne[1] >= cuda::kF16MinRows && t.ne[2] == 1) {  // the CUDA matmul's f16 path
                const uint64_t K = uint64_t(t.ne[0]);
                const uint64_t rows = std::min<uint64_t>(
                    uint64_t(t.ne[1]), std::max<uint64_t>(1, uint64_t(cuda::kF16WeightChunkBytes) / (2 * K)));
                f16_weight = std::max(f16_weight, 2 * rows * K);
                f16_input_k = std::max(f16_input_k, K);
                l.f16_copy_bytes += 2 * K * uint64_t(t.ne[1]);
            }
        } else if (t.name == "token_embd.weight") {
            p.token_embd_bytes = t.nbytes;
            p.head_padding += opt.compute.gpu_alloc(t.nbytes) - t.nbytes;
            have_embd = true;
        } else if (t.name == "output.weight") {
            p.output_bytes = t.nbytes;
            p.head_padding += opt.compute.gpu_alloc(t.nbytes) - t.nbytes;
        } else if (t.name == "output_norm.weight") {
            p.output_norm_bytes = t.nbytes;
        } else {
            p.unused_bytes += t.nbytes;  // MTP layers (il >= n_layer), vision tensors, classifier heads
            ++p.unused_tensors;
        }
    }
    if (!have_embd) fail(strfmt("plan: %s: tensor 'token_embd.weight' is missing", model.name.c_str()));

    p.kv_bytes_per_token = ss.kv_bytes_per_token;
    p.recurrent_bytes_per_seq = ss.recurrent_bytes_per_seq;
    const uint64_t B = uint64_t(opt.n_batch);
    const ComputeModel& cm = opt.compute;
    const ScratchWidths w = scratch_widths(hp);
    buffer_set(w.base, B, cm, &p.scratch_base_bytes, &p.scratch_base_padding);
    buffer_set(w.attention, B, cm, &p.scratch_attention_bytes, &p.scratch_attention_padding);
    buffer_set(w.deltanet, B, cm, &p.scratch_deltanet_bytes, &p.scratch_deltanet_padding);
    uint64_t head_pad = 0;
    buffer_set({hp.n_embd, hp.n_vocab}, uint64_t(cm.head_chunk_rows), cm, &p.head_buffer_bytes, &head_pad);
    p.head_padding += head_pad;
    const int64_t rows = opt.compute.logit_rows < 0 ? opt.n_slots : opt.compute.logit_rows;
    p.logit_bytes = 4 * uint64_t(hp.n_vocab) * uint64_t(rows);
    p.attention_split_bytes = p.attention_split_bytes_at(opt.n_ctx);
    int64_t widest = hp.n_embd;
    for (const LayerPlan& l : p.layers) widest = std::max(widest, l.widest_input);
    p.act_scratch_bytes = cm.act_scratch ? 2 * cm.gpu_alloc(2 * uint64_t(widest) * B) : 0;
    const auto scratch_alloc = [&](uint64_t b) { return cm.gpu_alloc((b + 255) & ~uint64_t(255)); };
    if (cm.f16_prefill_min_batch > 0 && int64_t(B) >= cm.f16_prefill_min_batch && f16_weight > 0)
        p.f16_prefill_bytes = scratch_alloc(f16_weight) + scratch_alloc(2 * f16_input_k * B);
    return p;
}

MemoryPlan plan_memory(const gguf::File& f, const HParams& hp, const PlanOptions& opt) {
    return plan_memory(describe_model(f, hp), opt);
}

// Decode attention (steps of up to 64 tokens, at most 4 per sequence) is split
// into one key range per 64 positions of the cache (at most 128), each leaving
// (d + 4) floats per head and token (cuda attention_work_bytes); 0 with one range.
uint64_t MemoryPlan::attention_split_bytes_at(int64_t n_ctx) const {
    const uint64_t tokens = uint64_t(
        std::clamp(std::min(opt.n_batch, cuda::kAttnSplitMaxSegment * opt.n_slots), 1, cuda::kAttnSplitMaxTokens));
    const uint64_t splits = uint64_t(std::clamp<int64_t>((n_ctx + cuda::kAttnSplitAlign - 1) / cuda::kAttnSplitAlign,
                                                         1, cuda::kAttnMaxSplits));
    if (splits == 1) return 0;
    return opt.compute.gpu_alloc(4 * tokens * uint64_t(hp.n_head) * splits *
                                 uint64_t(hp.head_dim + cuda::kAttnPartHeader));
}

Split MemoryPlan::split(int gpu_layers, int64_t n_ctx) const {
    const int64_t L = int64_t(layers.size());
    Split s;
    s.gpu_layers = int(std::clamp<int64_t>(gpu_layers, 0, L + 1));
    s.n_ctx = n_ctx;
    s.head_on_gpu = s.embed_on_gpu = head_on_gpu(L, s.gpu_layers);
    const uint64_t slots = uint64_t(opt.n_slots);

    const ComputeModel& cm = opt.compute;
    // K and V are one allocation each per attention layer; conv and S per DeltaNet layer.
    uint64_t kv_token_layer = 0;
    for (const LayerPlan& l : layers) kv_token_layer = std::max(kv_token_layer, l.kv_bytes_per_token);
    const uint64_t kv_half = mul_sat(mul_sat(kv_token_layer / 2, uint64_t(n_ctx)), slots);
    const uint64_t kv_pad = 2 * (cm.gpu_alloc(kv_half) - kv_half);
    const uint64_t conv_b = 4 * uint64_t(std::max<int64_t>(hp.ssm_conv_kernel - 1, 0) * hp.ssm_conv_channels()) * slots;
    const uint64_t S_b = 4 * uint64_t(hp.ssm_v_heads * hp.ssm_state * hp.ssm_state) * slots;
    const uint64_t rs_pad = (cm.gpu_alloc(conv_b) - conv_b) + (cm.gpu_alloc(S_b) - S_b);
    bool attn[2] = {false, false}, rec[2] = {false, false};  // [host, gpu]
    for (const LayerPlan& l : layers) {
        const bool g = layer_on_gpu(L, s.gpu_layers, l.index);
        DeviceBytes& d = g ? s.gpu : s.host;
        d.weights += l.weight_bytes;
        d.kv_cache = add_sat(d.kv_cache, mul_sat(mul_sat(l.kv_bytes_per_token, uint64_t(n_ctx)), slots));
        d.recurrent_state += l.state_bytes_per_seq * slots;
        (l.recurrent ? rec : attn)[g] = true;
        if (g) {
            s.gpu.padding = add_sat(s.gpu.padding, l.weight_padding + (l.recurrent ? rs_pad : kv_pad));
            (l.recurrent ? s.gpu_recurrent_layers : s.gpu_attention_layers) += 1;
            s.gpu_f16_copies += l.f16_copy_bytes;
        }
    }

    // Embedding and head live together; a tied matrix is one copy for both.
    DeviceBytes& head = s.head_on_gpu ? s.gpu : s.host;
    head.weights += token_embd_bytes + output_bytes + output_norm_bytes;
    head.logits += head_buffer_bytes;
    if (s.head_on_gpu) s.gpu.padding += head_padding;
    s.host.logits += logit_bytes;  // returned to the caller

    // Prompt offload (model/offload.cpp): the largest host layer twice (its
    // tensors at 256-byte offsets), one layer's DeltaNet state and KV for
    // min(4, slots) sequences, and the activation sets of what it streams.
    const bool offload = opt.op_offload && s.gpu_layers < L;
    if (offload) {
        const uint64_t seqs = uint64_t(std::min(4, opt.n_slots));
        uint64_t arena = 0;
        for (const LayerPlan& l : layers) {
            if (layer_on_gpu(L, s.gpu_layers, l.index)) continue;
            arena = std::max(arena, l.weight_bytes + 32 * 256);
            if (l.recurrent) rec[1] = true;
            else attn[1] = true;
        }
        s.gpu.offload = 2 * cm.gpu_alloc(arena);
        if (rec[0]) s.gpu.offload += cm.gpu_alloc(conv_b / slots * seqs) + cm.gpu_alloc(S_b / slots * seqs);
        if (attn[0]) {
            const uint64_t shadow_half = mul_sat(mul_sat(kv_token_layer / 2, uint64_t(n_ctx)), seqs);
            s.gpu.kv_cache = add_sat(s.gpu.kv_cache, 2 * shadow_half);
            s.gpu.padding = add_sat(s.gpu.padding, 2 * (cm.gpu_alloc(shadow_half) - shadow_half));
        }
    }

    // Every backend that runs a layer, the embedding or the head allocates the
    // base activation set, plus the sets of the layer kinds it runs.
    for (int g = 0; g < 2; ++g) {
        DeviceBytes& d = g ? s.gpu : s.host;
        const bool used = g ? s.gpu_layers > 0 || offload : (s.gpu_layers < L || !s.head_on_gpu);
        if (!used) continue;
        d.scratch += scratch_base_bytes + (attn[g] ? scratch_attention_bytes : 0) +
                     (rec[g] ? scratch_deltanet_bytes : 0);
        if (g)
            d.padding += scratch_base_padding + (attn[g] ? scratch_attention_padding : 0) +
                         (rec[g] ? scratch_deltanet_padding : 0);
    }
    if (s.gpu_layers > 0 || offload) {
        s.gpu.workspace =
            cm.cublas_bytes + (attn[1] ? attention_split_bytes_at(n_ctx) : 0) + act_scratch_bytes + f16_prefill_bytes;
        s.gpu.runtime = cm.cuda_context_bytes;
        s.host.runtime = cm.host_staging_bytes;
    }
    return s;
}

uint64_t default_safety_margin(uint64_t vram_bytes) { return std::max<uint64_t>(256 * kMiB, vram_bytes / 32); }

bool split_fits(const Split& s, uint64_t free_vram_bytes, uint64_t safety_margin, uint64_t host_bytes) {
    const uint64_t g = s.gpu.total();
    if (g > 0 && (free_vram_bytes < safety_margin || g > free_vram_bytes - safety_margin)) return false;
    if (host_bytes > 0 && s.host.total() > host_bytes) return false;
    return true;
}

int recommend_gpu_layers(const MemoryPlan& plan, uint64_t free_vram_bytes, uint64_t safety_margin,
                         uint64_t host_bytes) {
    int most_on_gpu = -1;  // the most layers the GPU alone can hold
    for (int n = plan.max_gpu_layers(); n >= 0; --n) {
        Split s = plan.split(n);
        if (!split_fits(s, free_vram_bytes, safety_margin, 0)) continue;
        if (most_on_gpu < 0) most_on_gpu = n;
        if (split_fits(s, free_vram_bytes, safety_margin, host_bytes)) return n;
    }
    Split s = plan.split(std::max(most_on_gpu, 0));
    fail(strfmt("plan: %s does not fit at context %lld x %d slot(s): with -ngl %d (the most the GPU's %.2f GiB "
                "hold) the host still needs %.2f GiB but the limit is %.2f GiB; reduce the context (-c) or "
                "slots (-np), use a smaller quantization, or a --kv-type of fewer bytes",
                plan.model.c_str(), (long long)plan.opt.n_ctx, plan.opt.n_slots, s.gpu_layers,
                double(free_vram_bytes) / double(kGiB), double(s.host.total()) / double(kGiB),
                double(host_bytes) / double(kGiB)));
}

int auto_gpu_layers(const gguf::File& f, const HParams& hp, int64_t n_ctx, int n_slots, int n_batch,
                    GgmlType kv_type, uint64_t free_vram_bytes, bool op_offload) {
    PlanOptions o;
    o.op_offload = op_offload;
    o.n_ctx = n_ctx;
    o.n_slots = n_slots;
    o.n_batch = n_batch;
    o.kv_type = kv_type;
    o.compute.cuda_context_bytes = 0;  // already out of the free memory
    const MemoryPlan plan = plan_memory(f, hp, o);
    return recommend_gpu_layers(plan, free_vram_bytes, default_safety_margin(free_vram_bytes));
}

ContextFit max_context_fit(const MemoryPlan& plan, int gpu_layers, uint64_t free_vram_bytes, uint64_t safety_margin,
                           uint64_t host_bytes) {
    const Split s0 = plan.split(gpu_layers, 0), s1 = plan.split(gpu_layers, 1);
    ContextFit fit;
    fit.n_ctx = plan.hp.n_ctx_train > 0 ? plan.hp.n_ctx_train : INT64_MAX;
    fit.limited_by = "trained context";
    // KV grows with the context linearly; the attention split buffer up to 32k
    // tokens (at most ~136 MB), which the step-back below absorbs.
    auto limit = [&](uint64_t fixed, uint64_t per_token, uint64_t avail, const char* who) {
        if (per_token == 0 && fixed <= avail) return;
        int64_t n = fixed > avail ? 0 : int64_t(std::min<uint64_t>((avail - fixed) / per_token, INT64_MAX));
        if (n < fit.n_ctx) {
            fit.n_ctx = n;
            fit.limited_by = who;
        }
    };
    if (s0.gpu.total() > 0) {
        uint64_t avail = free_vram_bytes > safety_margin ? free_vram_bytes - safety_margin : 0;
        limit(s0.gpu.total(), s1.gpu.kv_cache - s0.gpu.kv_cache, avail, "gpu");
    }
    if (host_bytes > 0) limit(s0.host.total(), s1.host.kv_cache - s0.host.kv_cache, host_bytes, "host");
    if (fit.limited_by[0] != 't') fit.n_ctx = fit.n_ctx / 256 * 256;  // llama.cpp's granularity
    // Allocation rounding makes KV slightly more than linear: step back until it fits.
    const uint64_t vram = s0.gpu.total() > 0 ? free_vram_bytes : UINT64_MAX;
    while (fit.n_ctx > 0 && !split_fits(plan.split(gpu_layers, fit.n_ctx), vram, safety_margin, host_bytes)) {
        fit.n_ctx = fit.n_ctx > 256 ? (fit.n_ctx - 1) / 256 * 256 : 0;
        if (fit.limited_by[0] == 't') fit.limited_by = s0.gpu.total() > 0 ? "gpu" : "host";
    }
    return fit;
}

}  // namespace qinfer
