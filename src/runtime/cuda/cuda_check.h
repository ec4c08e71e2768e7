// CUDA error checks that turn a failed runtime call into a qinfer::Error naming
// the call and where it happened (host code only; usable from .cpp and .cu).
#pragma once
#include <cuda_runtime.h>

#include "common/error.h"

namespace qinfer::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
    fail(strfmt("CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(e), cudaGetErrorString(e), what, file, line));
}

}  // namespace qinfer::cuda

#define QINFER_CUDA_CHECK(call)                                                          \
    do {                                                                                 \
        cudaError_t qinfer_e_ = (call);                                                  \
        if (qinfer_e_ != cudaSuccess) ::qinfer::cuda::throw_cuda(qinfer_e_, #call, __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: reports launch-configuration errors at once (execution
// errors surface at the next synchronizing call).
#define QINFER_CUDA_LAUNCHED(name)                                                      \
    do {                                                                                 \
        cudaError_t qinfer_e_ = cudaGetLastError();                                      \
        if (qinfer_e_ != cudaSuccess) ::qinfer::cuda::throw_cuda(qinfer_e_, name, __FILE__, __LINE__); \
    } while (0)
