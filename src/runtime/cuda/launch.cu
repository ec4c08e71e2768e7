#include "runtime/cuda/launch.cuh"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/env.h"
#include "common/error.h"

namespace qinfer::cuda {

namespace {
__global__ void pdl_probe_kernel() {}
}  // namespace

bool pdl_enabled() {
    static const bool enabled = [] {
        if (env_is("QINFER_CUDA_PDL", "0")) return false;
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 9)
            return false;
        cudaFuncAttributes fa{};
        if (cudaFuncGetAttributes(&fa, pdl_probe_kernel) != cudaSuccess) return false;
        return fa.ptxVersion >= 90;  // built from sm_90+ code, so pdl_wait() is compiled in
    }();
    return enabled;
}

namespace {
struct PdlTriggerSetter {
    const char* file;  // the translation unit whose constant it sets
    cudaError_t (*set)(int mode);
};
std::vector<PdlTriggerSetter>& pdl_trigger_setters() {
    static std::vector<PdlTriggerSetter> setters;  // filled at static initialization
    return setters;
}
}  // namespace

void register_pdl_trigger_setter(const char* file, cudaError_t (*set)(int mode)) {
    pdl_trigger_setters().push_back({file, set});
}

namespace {
std::vector<cudaError_t (*)(int)>& pdl_small_setters() {
    static std::vector<cudaError_t (*)(int)> setters;  // filled at static initialization
    return setters;
}
}  // namespace

void register_pdl_small_setter(cudaError_t (*set)(int value)) { pdl_small_setters().push_back(set); }

void pdl_configure_device() {
    // 1 unless asked otherwise (a value other than 0, 1 or 2 fails, as the
    // other A/B switches do): +4.8% tg128 on an H200 against 0, +3.4% for
    // Qwen3-4B; 2 was 4% below 0 (docs/cuda-notes.md).
    static const int mode = env_int_of("QINFER_CUDA_PDL_TRIGGER", {0, 1, 2}, 1);
    static const int small = env_int_of("QINFER_CUDA_SMALL_TRIGGER_TOP", {0, 1, 2}, 0);
    if (small)
        for (auto set : pdl_small_setters())
            if (const cudaError_t e = set(small); e != cudaSuccess) {
                cudaGetLastError();
                fail(strfmt("CUDA: setting QINFER_CUDA_SMALL_TRIGGER_TOP: %s", cudaGetErrorString(e)));
            }
    if (mode == 0) return;  // the constants start at 0
    // QINFER_CUDA_PDL_TRIGGER_FILES=matvec,deltanet: only the kernels of those
    // source files (names contained in their paths) move their trigger.
    const char* files = std::getenv("QINFER_CUDA_PDL_TRIGGER_FILES");
    std::vector<std::string> only;
    for (const char* p = files; p && *p;) {
        const char* e = std::strchr(p, ',');
        const size_t n = e ? size_t(e - p) : std::strlen(p);
        if (n) only.emplace_back(p, n);
        p = e ? e + 1 : p + n;
    }
    for (const auto& s : pdl_trigger_setters()) {
        bool chosen = only.empty();
        for (const auto& name : only) chosen = chosen || std::strstr(s.file, name.c_str()) != nullptr;
        if (!chosen) continue;
        const cudaError_t e = s.set(mode);
        if (e != cudaSuccess) {
            cudaGetLastError();
            fail(strfmt("CUDA: setting the trigger mode of %s: %s", s.file, cudaGetErrorString(e)));
        }
    }
}

void allow_dynamic_smem(const void* kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return;
    int dev = 0;
    QINFER_CUDA_CHECK(cudaGetDevice(&dev));
    static std::mutex mu;
    static std::map<std::pair<const void*, int>, size_t> raised;  // (kernel, device) -> bytes allowed
    std::lock_guard<std::mutex> lock(mu);
    size_t& have = raised[{kernel, dev}];
    if (have >= bytes) return;
    QINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    have = bytes;
}

Residency residency(const void* kernel, int threads, size_t smem) {
    int dev = 0;
    QINFER_CUDA_CHECK(cudaGetDevice(&dev));
    static std::mutex mu;
    static std::map<std::tuple<const void*, int, int, size_t>, Residency> known;
    std::lock_guard<std::mutex> lock(mu);
    Residency& r = known[{kernel, dev, threads, smem}];
    if (r.sms == 0) {
        QINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.per_sm, kernel, threads, smem));
        QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, dev));
    }
    return r;
}

}  // namespace qinfer::cuda
