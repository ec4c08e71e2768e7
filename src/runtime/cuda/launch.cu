#include "runtime/cuda/launch.cuh"

#include <cstdlib>
#include <cstring>

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

}  // namespace qinfer::cuda
