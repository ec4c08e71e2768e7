// `qinfer plan`: what a model needs on the GPU and the host for a context,
// slot count and batch size, the -ngl that fits a card, and the largest context.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/run_options.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "plan/gpus.h"
#include "plan/planner.h"
#include "plan/presets.h"
#include "plan/report.h"

#if defined(QINFER_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace qinfer::cli {

namespace {

// Free memory of CUDA device 0 as the driver reports it now (our context
// included, so the planner must not count a context again).
bool query_cuda_free(uint64_t* free_bytes, std::string* name) {
#if defined(QINFER_HAVE_CUDA)
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) return false;
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    *free_bytes = f;
    *name = strfmt("%s: %s free of %s", prop.name, format_bytes(f).c_str(), format_bytes(t).c_str());
    return true;
#else
    (void)free_bytes;
    (void)name;
    return false;
#endif
}

void list_presets() {
    std::printf("model presets (--arch-preset SHAPE[-TYPE], TYPE default q4_k_m):\n");
    for (const std::string& n : shape_preset_names()) std::printf("  %s\n", n.c_str());
    std::printf("types:");
    for (const std::string& n : file_type_names()) std::printf(" %s", n.c_str());
    std::printf("\n\nGPU presets (--gpu NAME):\n");
    for (const GpuPreset& g : gpu_presets())
        std::printf("  %-16s %10s  %s\n", g.name, format_bytes(g.bytes).c_str(), g.card);
}

// llama.cpp spells some flags with one dash and several letters; CLI11 does not.
std::vector<std::string> normalize_args(int argc, char** argv) {
    std::vector<std::string> a;
    for (int i = 1; i < argc; ++i) {
        std::string s = argv[i];
        if (s == "-np") s = "--parallel";
        else if (s == "-ngl") s = "--gpu-layers";
        a.push_back(s);
    }
    std::vector<std::string> rev(a.rbegin(), a.rend());  // CLI11 parses a reversed vector
    return rev;
}

}  // namespace

int cmd_plan(int argc, char** argv) {
    CLI::App app{"Memory planner: what a model needs on the GPU and the host, the -ngl that fits, and the largest "
                 "context. Formulas: docs/memory-planning.md.",
                 "qinfer plan"};
    std::string model_path, preset, kv_type = "f16", vram_s, gpu_s, ram_s, margin_s, ngl_s = "auto";
    int64_t n_ctx = 4096;
    int n_slots = 1, n_batch = 512;
    int64_t logit_rows = -1;
    bool json = false, per_layer = false, show_presets = false;
    std::string cuda_ctx_s;
    auto* m = app.add_option("-m,--model", model_path, "GGUF file (first shard of a split model)");
    auto* ap = app.add_option("--arch-preset", preset, "plan a model that is not on disk, e.g. qwen35-4b-q4_k_m");
    m->excludes(ap);
    app.add_option("-c,--ctx-size", n_ctx, "context per slot in tokens (default 4096)");
    app.add_option("--parallel", n_slots, "-np: parallel sequences (slots), each with its own context (default 1)");
    app.add_option("-b,--batch-size", n_batch, "max tokens per forward call (default 512; run and serve take 2048 when every layer, the embedding and the head fit on the GPU with it)");
    app.add_option("--kv-type", kv_type, "KV cache type: f16 (default), f32, q8_0");
    auto* vr = app.add_option("--vram", vram_s, "GPU memory to plan for, e.g. 8GiB, 12G, 24000MB (0: no GPU)");
    auto* gp = app.add_option("--gpu", gpu_s, "GPU by name (see --list-presets) or 'auto' (free memory of CUDA device 0)");
    vr->excludes(gp);
    app.add_option("--ram", ram_s, "host memory limit, e.g. 16GiB (default: not checked)");
    app.add_option("--gpu-layers", ngl_s, "-ngl: layers on the GPU, or 'auto' (default: the most that fit)");
    app.add_option("--margin", margin_s, "GPU safety margin (default max(256 MiB, vram/32))");
    app.add_option("--cuda-context", cuda_ctx_s, "CUDA context size to assume (default 526MiB; 0 with --gpu auto)");
    app.add_option("--logit-rows", logit_rows, "rows of the logits buffer (default: batch size)");
    int op_offload_min_batch = kOpOffloadMinBatch;
    add_op_offload_flags(app, op_offload_min_batch);
    app.add_flag("--json", json, "print one JSON object");
    app.add_flag("--layers", per_layer, "list every layer with its bytes and device");
    app.add_flag("--list-presets", show_presets, "list model and GPU presets");

    try {
        app.parse(normalize_args(argc, argv));
    } catch (const CLI::CallForHelp&) {
        std::printf("%s", app.help().c_str());
        return 0;
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "error: qinfer plan: %s\n", e.what());
        return 2;
    }
    if (show_presets) {
        list_presets();
        return 0;
    }
    if (model_path.empty() && preset.empty()) fail("qinfer plan: give a model (-m FILE) or --arch-preset NAME");

    PlanOptions opt;
    opt.n_ctx = n_ctx;
    opt.n_slots = n_slots;
    opt.n_batch = n_batch;
    std::optional<GgmlType> kt = type_from_name(kv_type);
    if (!kt || (*kt != GgmlType::F16 && *kt != GgmlType::F32 && *kt != GgmlType::Q8_0))
        fail(strfmt("qinfer plan: --kv-type '%s' is not one of f16, f32, q8_0", kv_type.c_str()));
    opt.kv_type = *kt;
    if (logit_rows < -1) fail("qinfer plan: --logit-rows must be at least 0");
    opt.compute.logit_rows = logit_rows;

    PlanLimits lim;
    if (!vram_s.empty()) {
        lim.vram_bytes = parse_bytes(vram_s, "qinfer plan: --vram");
        lim.vram_source = "--vram " + vram_s;
    } else if (!gpu_s.empty() && gpu_s != "auto") {
        std::optional<uint64_t> b = gpu_preset_bytes(gpu_s);
        if (!b) {
            std::string names;
            for (const GpuPreset& g : gpu_presets()) names += std::string(names.empty() ? "" : ", ") + g.name;
            fail(strfmt("qinfer plan: --gpu '%s' is not a known card (%s, or auto)", gpu_s.c_str(), names.c_str()));
        }
        lim.vram_bytes = *b;
        lim.vram_source = gpu_s;
    } else {
        // --gpu auto, or the default: the device's free memory when there is one.
        uint64_t free_b = 0;
        std::string desc;
        if (query_cuda_free(&free_b, &desc)) {
            lim.vram_bytes = free_b;
            lim.vram_source = desc;
            opt.compute.cuda_context_bytes = 0;  // already taken out of the free memory
        } else if (gpu_s == "auto") {
#if defined(QINFER_HAVE_CUDA)
            fail("qinfer plan: --gpu auto: no CUDA device found; give --vram BYTES or --gpu NAME");
#else
            fail("qinfer plan: --gpu auto: this build has no CUDA support; give --vram BYTES or --gpu NAME");
#endif
        }
    }
    opt.op_offload = op_offload_min_batch > 0 && lim.vram_bytes > 0;
    if (!cuda_ctx_s.empty()) opt.compute.cuda_context_bytes = parse_bytes(cuda_ctx_s, "qinfer plan: --cuda-context");
    lim.safety_margin = margin_s.empty() ? (lim.vram_bytes ? default_safety_margin(lim.vram_bytes) : 0)
                                         : parse_bytes(margin_s, "qinfer plan: --margin");
    if (!ram_s.empty()) lim.host_bytes = parse_bytes(ram_s, "qinfer plan: --ram");
    if (ngl_s != "auto") {
        char* end = nullptr;
        long v = std::strtol(ngl_s.c_str(), &end, 10);
        if (ngl_s.empty() || *end != '\0' || v < 0 || v > 1000000)
            fail(strfmt("qinfer plan: -ngl '%s' is not a layer count or 'auto'", ngl_s.c_str()));
        lim.gpu_layers = int(v);
    }

    MemoryPlan plan;
    if (!model_path.empty()) {
        std::unique_ptr<gguf::File> f = gguf::File::open(model_path);
        HParams hp = HParams::from_gguf(*f);
        plan = plan_memory(*f, hp, opt);
    } else {
        plan = plan_memory(preset_model(preset), opt);
    }
    PlanReport rep = make_report(plan, lim);
    if (json) std::cout << report_json(rep).dump(2) << "\n";
    else std::cout << report_text(rep, per_layer);
    return 0;
}

}  // namespace qinfer::cli
