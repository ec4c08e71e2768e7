// GPU-side argmax over the logits, so a greedy decode step copies back one id
// instead of a vocabulary of floats.
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

namespace {

// One block per row. Ties go to the lowest index (as the CPU sampler).
__global__ void argmax_kernel(const float* __restrict__ logits, int64_t ld, int64_t n, int32_t* __restrict__ ids) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* row = logits + int64_t(blockIdx.x) * ld;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = row[i];
        if (v > best || (v == best && int(i) < bi)) { best = v; bi = int(i); }  // NaN never wins
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    const int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    if (lane == 0) { sv[wid] = best; si[wid] = bi; }
    __syncthreads();
    if (wid == 0) {
        const int nw = blockDim.x / WARP;
        best = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        }
        if (lane == 0) ids[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    }
}

}  // namespace

void argmax_rows(const float* logits, int64_t ld, int64_t n, int64_t T, int32_t* ids, cudaStream_t s) {
    if (T == 0) return;
    argmax_kernel<<<static_cast<unsigned>(T), 1024, 0, s>>>(logits, ld, n, ids);
    QINFER_CUDA_LAUNCHED("argmax");
}

}  // namespace qinfer::cuda
