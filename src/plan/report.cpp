#include "plan/report.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "common/error.h"
#include "plan/gpus.h"

namespace qinfer {

PlanReport make_report(const MemoryPlan& plan, const PlanLimits& limits) {
    PlanReport r;
    r.plan = plan;
    r.limits = limits;
    if (limits.gpu_layers >= 0) {
        // As llama.cpp: any N beyond the layer count means everything (-ngl 99).
        r.gpu_layers = std::min(limits.gpu_layers, plan.max_gpu_layers());
    } else {
        r.gpu_layers = recommend_gpu_layers(plan, limits.vram_bytes, limits.safety_margin, limits.host_bytes);
        r.recommended = true;
    }
    r.split = plan.split(r.gpu_layers);
    const bool gpu_unbounded = limits.vram_bytes == 0 && r.gpu_layers > 0;  // -ngl N without --vram: no GPU check
    const uint64_t vram = gpu_unbounded ? UINT64_MAX : limits.vram_bytes;
    r.fits = split_fits(r.split, vram, limits.safety_margin, limits.host_bytes);
    r.max_ctx = max_context_fit(plan, r.gpu_layers, vram, limits.safety_margin, limits.host_bytes);
    if (plan.hp.n_ctx_train > 0 && plan.opt.n_ctx > plan.hp.n_ctx_train)
        r.warnings.push_back(strfmt("context %lld is beyond the trained context %lld: quality needs rope scaling",
                                    (long long)plan.opt.n_ctx, (long long)plan.hp.n_ctx_train));
    if (!r.fits)
        r.warnings.push_back(strfmt("-ngl %d does not fit the given memory at context %lld", r.gpu_layers,
                                    (long long)plan.opt.n_ctx));
    return r;
}

// ------------------------------------------------------------------ JSON

namespace {

std::string lower_type(GgmlType t) {
    std::string n = type_name(t);
    for (char& c : n) c = char(std::tolower(static_cast<unsigned char>(c)));
    return n;
}

nlohmann::ordered_json device_json(const DeviceBytes& d) {
    return {{"weights", d.weights},     {"kv_cache", d.kv_cache}, {"recurrent_state", d.recurrent_state},
            {"scratch", d.scratch},     {"logits", d.logits},     {"workspace", d.workspace},
            {"runtime", d.runtime},     {"prompt_offload", d.offload}, {"alloc_padding", d.padding},
            {"total", d.total()}};
}

struct KindStats {
    int64_t count = 0;
    uint64_t min = UINT64_MAX, max = 0, total = 0;
    void add(uint64_t b) {
        ++count;
        min = std::min(min, b);
        max = std::max(max, b);
        total += b;
    }
};

}  // namespace

nlohmann::ordered_json report_json(const PlanReport& r) {
    const MemoryPlan& p = r.plan;
    const Split& s = r.split;
    KindStats att, rec;
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const LayerPlan& l : p.layers) {
        (l.recurrent ? rec : att).add(l.weight_bytes);
        layers.push_back({{"index", l.index},
                          {"kind", l.recurrent ? "deltanet" : "attention"},
                          {"weight_bytes", l.weight_bytes},
                          {"kv_bytes_per_token", l.kv_bytes_per_token},
                          {"state_bytes_per_sequence", l.state_bytes_per_seq},
                          {"device", layer_on_gpu(p.n_layer(), s.gpu_layers, l.index) ? "gpu" : "host"}});
    }
    auto kind = [](const KindStats& k) {
        return nlohmann::ordered_json{{"count", k.count},
                              {"bytes_min", k.count ? k.min : 0},
                              {"bytes_max", k.max},
                              {"bytes_total", k.total}};
    };
    const int64_t logit_rows = p.opt.compute.logit_rows < 0 ? p.opt.n_slots : p.opt.compute.logit_rows;
    nlohmann::ordered_json j = {
        // the fields scripts depend on (docs/memory-planning.md)
        {"kv_bytes_per_token", p.kv_bytes_per_token},
        {"recurrent_state_bytes_per_sequence", p.recurrent_bytes_per_seq},
        {"weights_bytes_gpu", s.gpu.weights},
        {"weights_bytes_host", s.host.weights},
        {"gpu_layers", s.gpu_layers},
        {"max_context", r.max_ctx.n_ctx},
        {"total_bytes_gpu", s.gpu.total()},
        // everything else
        {"total_bytes_host", s.host.total()},
        {"model", p.model},
        {"arch", p.hp.arch_str},
        {"n_layer", p.n_layer()},
        {"n_attention_layers", att.count},
        {"n_recurrent_layers", rec.count},
        {"n_ctx", p.opt.n_ctx},
        {"n_ctx_train", p.hp.n_ctx_train},
        {"n_slots", p.opt.n_slots},
        {"n_batch", p.opt.n_batch},
        {"kv_type", lower_type(p.opt.kv_type)},
        {"gpu_layers_recommended", r.recommended},
        {"fits", r.fits},
        {"max_context_limited_by", r.max_ctx.limited_by},
        {"head_on_gpu", s.head_on_gpu},
        {"embed_on_gpu", s.embed_on_gpu},
        {"vram_bytes", r.limits.vram_bytes},
        {"vram_source", r.limits.vram_source},
        {"safety_margin_bytes", r.limits.safety_margin},
        {"host_limit_bytes", r.limits.host_bytes},
        {"weights_bytes_total", p.weight_bytes()},
        {"kv_bytes_gpu", s.gpu.kv_cache},
        {"kv_bytes_host", s.host.kv_cache},
        {"recurrent_state_bytes_gpu", s.gpu.recurrent_state},
        {"recurrent_state_bytes_host", s.host.recurrent_state},
        {"f16_copy_bytes_gpu", s.gpu_f16_copies},
        {"gpu", device_json(s.gpu)},
        {"host", device_json(s.host)},
        {"weights",
         {{"token_embd", p.token_embd_bytes},
          {"output", p.output_bytes},
          {"output_norm", p.output_norm_bytes},
          {"tied_output", p.hp.tied_output},
          {"layers_total", p.layer_weight_bytes()},
          {"attention_layers", kind(att)},
          {"deltanet_layers", kind(rec)},
          {"unused_bytes", p.unused_bytes},
          {"unused_tensors", p.unused_tensors}}},
        {"compute",
         {{"scratch_base_bytes", p.scratch_base_bytes},
          {"scratch_attention_bytes", p.scratch_attention_bytes},
          {"scratch_deltanet_bytes", p.scratch_deltanet_bytes},
          {"head_buffer_bytes", p.head_buffer_bytes},
          {"head_chunk_rows", p.opt.compute.head_chunk_rows},
          {"logit_rows", logit_rows},
          {"logits_bytes", p.logit_bytes},
          {"attention_split_bytes", p.attention_split_bytes},
          {"cublas_bytes", p.opt.compute.cublas_bytes},
          {"act_scratch", p.opt.compute.act_scratch},
          {"cuda_context_bytes", p.opt.compute.cuda_context_bytes},
          {"host_staging_bytes", p.opt.compute.host_staging_bytes},
          {"alloc_granularity", p.opt.compute.alloc_granularity},
          {"alloc_small_limit", p.opt.compute.alloc_small_limit}}},
        {"warnings", r.warnings},
        {"layers", layers},
    };
    return j;
}

// ------------------------------------------------------------------ text

namespace {

std::string range(const KindStats& k) {
    if (k.min == k.max) return format_bytes(k.max);
    return format_bytes(k.min) + " - " + format_bytes(k.max);
}

void line(std::string& out, const char* what, const std::string& each, const std::string& count,
          const std::string& total) {
    out += strfmt("  %-38s %24s %8s %13s\n", what, each.c_str(), count.c_str(), total.c_str());
}

std::string ngl_label(int n, int n_layer) {
    if (n == 0) return "-ngl 0 (weights on the CPU)";
    if (n > n_layer) return strfmt("-ngl %d (all + head)", n);
    return strfmt("-ngl %d (layers %d-%d)", n, n_layer - n, n_layer - 1);
}

}  // namespace

std::string report_text(const PlanReport& r, bool per_layer) {
    const MemoryPlan& p = r.plan;
    const HParams& hp = p.hp;
    const Split& s = r.split;
    const int L = p.n_layer();
    KindStats att, rec;
    for (const LayerPlan& l : p.layers) (l.recurrent ? rec : att).add(l.weight_bytes);

    std::string o;
    o += strfmt("model     %s\n", p.model.c_str());
    o += strfmt("          %s, %d layers", hp.arch_str.c_str(), L);
    if (rec.count) o += strfmt(" (%lld Gated DeltaNet + %lld attention)", (long long)rec.count, (long long)att.count);
    o += strfmt(", %s head, vocab %lld, trained context %lld\n", hp.tied_output ? "tied" : "separate",
                (long long)hp.n_vocab, (long long)hp.n_ctx_train);
    o += strfmt("settings  context %lld per slot x %d slot(s), batch %d, KV cache %s\n", (long long)p.opt.n_ctx,
                p.opt.n_slots, p.opt.n_batch, lower_type(p.opt.kv_type).c_str());
    if (r.limits.vram_bytes > 0)
        o += strfmt("GPU       %s (%s), safety margin %s\n", format_bytes(r.limits.vram_bytes).c_str(),
                    r.limits.vram_source.c_str(), format_bytes(r.limits.safety_margin).c_str());
    else
        o += "GPU       none given (--vram BYTES or --gpu NAME|auto)\n";
    if (r.limits.host_bytes > 0) o += strfmt("host      %s\n", format_bytes(r.limits.host_bytes).c_str());

    o += "\ncomponents\n";
    line(o, "", "each", "count", "total");
    if (rec.count) line(o, "weights: DeltaNet layer", range(rec), std::to_string(rec.count), format_bytes(rec.total));
    if (att.count) line(o, "weights: attention layer", range(att), std::to_string(att.count), format_bytes(att.total));
    line(o, hp.tied_output ? "weights: token embedding = LM head" : "weights: token embedding",
         format_bytes(p.token_embd_bytes), "1", format_bytes(p.token_embd_bytes));
    if (!hp.tied_output) line(o, "weights: LM head (output)", format_bytes(p.output_bytes), "1", format_bytes(p.output_bytes));
    line(o, "weights: output norm", format_bytes(p.output_norm_bytes), "1", format_bytes(p.output_norm_bytes));
    if (p.unused_tensors)
        line(o, "not loaded (MTP, vision, ...)", "", std::to_string(p.unused_tensors), format_bytes(p.unused_bytes));
    const uint64_t slots = uint64_t(p.opt.n_slots);
    if (att.count) {
        const uint64_t per_layer_tok = p.kv_bytes_per_token / uint64_t(att.count);
        line(o, strfmt("KV cache per token (%s)", lower_type(p.opt.kv_type).c_str()).c_str(),
             format_bytes(per_layer_tok) + "/layer", std::to_string(att.count), format_bytes(p.kv_bytes_per_token));
        line(o, strfmt("KV cache at %lld x %d", (long long)p.opt.n_ctx, p.opt.n_slots).c_str(), "", "",
             format_bytes(p.kv_bytes_per_token * uint64_t(p.opt.n_ctx) * slots));
    }
    if (rec.count) {
        line(o, "DeltaNet conv + S per sequence (f32)",
             format_bytes(p.recurrent_bytes_per_seq / uint64_t(rec.count)) + "/layer", std::to_string(rec.count),
             format_bytes(p.recurrent_bytes_per_seq));
        if (slots > 1)
            line(o, strfmt("DeltaNet state x %d slots", p.opt.n_slots).c_str(), "", "",
                 format_bytes(p.recurrent_bytes_per_seq * slots));
    }
    line(o, strfmt("activation buffers, batch %d", p.opt.n_batch).c_str(), "base", "per device",
         format_bytes(p.scratch_base_bytes));
    line(o, "  + where attention layers run", "", "", format_bytes(p.scratch_attention_bytes));
    if (rec.count) line(o, "  + where DeltaNet layers run", "", "", format_bytes(p.scratch_deltanet_bytes));
    line(o, strfmt("head buffers (%lld rows at a time)", (long long)p.opt.compute.head_chunk_rows).c_str(), "", "",
         format_bytes(p.head_buffer_bytes));
    const int64_t rows = p.opt.compute.logit_rows < 0 ? p.opt.n_slots : p.opt.compute.logit_rows;
    line(o, strfmt("logits returned (%lld rows f32)", (long long)rows).c_str(), "", "", format_bytes(p.logit_bytes));
    line(o, "cuBLAS handle + workspace (GPU)", "", "", format_bytes(p.opt.compute.cublas_bytes));
    line(o, "CUDA context (GPU)", "", "", format_bytes(p.opt.compute.cuda_context_bytes));

    o += strfmt("\nsplit     %s%s%s\n", ngl_label(s.gpu_layers, L).c_str(),
                r.recommended ? ", recommended" : "", r.fits ? "" : "  ** DOES NOT FIT **");
    o += strfmt("  %-38s %13s %13s\n", "", "GPU", "host");
    auto row = [&](const char* what, uint64_t g, uint64_t h) {
        o += strfmt("  %-38s %13s %13s\n", what, format_bytes(g).c_str(), format_bytes(h).c_str());
    };
    row("weights", s.gpu.weights, s.host.weights);
    row("KV cache", s.gpu.kv_cache, s.host.kv_cache);
    if (rec.count) row("DeltaNet state", s.gpu.recurrent_state, s.host.recurrent_state);
    row("activation buffers", s.gpu.scratch, s.host.scratch);
    row("head buffers / logits", s.gpu.logits, s.host.logits);
    row("cuBLAS, matmul + attention scratch", s.gpu.workspace, s.host.workspace);
    row("CUDA context / pinned staging", s.gpu.runtime, s.host.runtime);
    if (s.gpu.offload) row("prompt offload arenas + shadow state", s.gpu.offload, 0);
    row("cudaMalloc rounding (2 MiB pages)", s.gpu.padding, s.host.padding);
    row("total", s.gpu.total(), s.host.total());
    if (s.gpu_f16_copies)
        o += strfmt("  (+ up to %s of f16 weight copies for faster prompts, kept only while a quarter of\n"
                    "   the GPU stays free; QINFER_CUDA_F16_COPY=0 turns them off)\n",
                    format_bytes(s.gpu_f16_copies).c_str());

    if (r.max_ctx.n_ctx > 0)
        o += strfmt("\nlargest context per slot with -ngl %d: %lld tokens (limited by %s)\n", s.gpu_layers,
                    (long long)r.max_ctx.n_ctx, r.max_ctx.limited_by);
    else
        o += strfmt("\nlargest context per slot with -ngl %d: none fits (%s)\n", s.gpu_layers, r.max_ctx.limited_by);

    for (const std::string& w : r.warnings) o += "warning: " + w + "\n";

    // A few other splits, for choosing by hand.
    std::set<int> ns = {0, L / 4, L / 2, 3 * L / 4, L, L + 1, s.gpu_layers};
    o += strfmt("\nother splits at context %lld\n", (long long)p.opt.n_ctx);
    for (int n : ns) {
        if (n < 0 || n > L + 1) continue;
        Split t = p.split(n);
        o += strfmt("  %-26s GPU %11s   host %11s%s\n", ngl_label(n, L).c_str(), format_bytes(t.gpu.total()).c_str(),
                    format_bytes(t.host.total()).c_str(),
                    r.limits.vram_bytes > 0 && !split_fits(t, r.limits.vram_bytes, r.limits.safety_margin,
                                                           r.limits.host_bytes)
                        ? "   (does not fit)"
                        : "");
    }

    if (per_layer) {
        o += "\nlayers\n";
        for (const LayerPlan& l : p.layers)
            o += strfmt("  %3lld  %-9s %12s  %s\n", (long long)l.index, l.recurrent ? "DeltaNet" : "attention",
                        format_bytes(l.weight_bytes).c_str(),
                        layer_on_gpu(L, s.gpu_layers, l.index) ? "GPU" : "host");
    }
    return o;
}

}  // namespace qinfer
