// `qinfer plan` output: the decision (recommended -ngl, largest context) for
// given memory limits, as a readable table or one JSON object whose field
// names scripts depend on (docs/memory-planning.md lists them).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/planner.h"

namespace qinfer {

struct PlanLimits {
    uint64_t vram_bytes = 0;     // 0: no GPU
    std::string vram_source;     // "--vram 8GiB", "rtx4070-laptop", "CUDA0 free memory", ...
    uint64_t safety_margin = 0;
    uint64_t host_bytes = 0;     // 0: host memory not checked
    int gpu_layers = -1;         // -ngl asked for; -1: recommend
};

struct PlanReport {
    MemoryPlan plan;
    PlanLimits limits;
    int gpu_layers = 0;          // chosen: asked for, or recommended
    bool recommended = false;
    Split split;                 // at plan.opt.n_ctx
    bool fits = false;
    ContextFit max_ctx;          // for gpu_layers
    std::vector<std::string> warnings;
};

// Chooses -ngl (recommend_gpu_layers unless limits.gpu_layers >= 0; throws when
// nothing fits) and the largest context for it.
PlanReport make_report(const MemoryPlan& plan, const PlanLimits& limits);

nlohmann::ordered_json report_json(const PlanReport& r);
std::string report_text(const PlanReport& r, bool per_layer);

}  // namespace qinfer
