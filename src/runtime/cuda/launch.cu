#include "runtime/cuda/launch.cuh"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

namespace qinfer::cuda {

namespace {
__global__ void pdl_probe_kernel() {}
}  // namespace

bool pdl_enabled() {
    static const bool enabled = [] {
        const char* v = std::getenv("QINFER_CUDA_PDL");
        if (v && std::strcmp(v, "0") == 0) return false;
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
