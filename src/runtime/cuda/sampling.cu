// GPU-side argmax over the logits, so a greedy decode step copies back one id
// instead of a vocabulary of floats.
//
// A row (a vocabulary of ~250k floats, 1 MB) is too much for one SM: a single
// block spends ~100 us waiting on its own loads. On sm_90+ a row is read by a
// thread-block cluster instead (up to 16 blocks, one per SM); each block
// reduces its slice to (value, index) and the cluster's first block merges the
// slices through distributed shared memory. Nothing lives outside the launch
// (no counters, no scratch), so a captured graph replays it as it is. Older
// GPUs, and code JIT-compiled from the compute_80 PTX, take one block per row.
#include <cooperative_groups.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

namespace {

constexpr int AM_THREADS = 1024;
constexpr int AM_UNROLL = 4;      // float4 loads in flight per thread
constexpr int AM_MAX_CLUSTER = 16;

// The order every step of the reduction uses: larger value first, then the
// lower index. NaN compares false both ways, so it never wins; a row of -inf
// gives its first index, a row of NaN (or an empty one) index 0.
__device__ __forceinline__ void take(float v, int i, float& best, int& bi) {
    if (v > best || (v == best && i < bi)) {
        best = v;
        bi = i;
    }
}

__device__ __forceinline__ void warp_take(float& best, int& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        take(ov, oi, best, bi);
    }
}

// Grid: T * cs blocks of AM_THREADS, row = blockIdx.x / cs; launched as clusters
// of cs blocks when cs > 1 (which only an sm_90 build uses as such).
__global__ void __launch_bounds__(AM_THREADS) argmax_kernel(const float* __restrict__ logits, int64_t ld, int n,
                                                            int cs, int32_t* __restrict__ ids) {
    const int row = blockIdx.x / cs;
    const int tid = threadIdx.x;
#if __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    const int parts = cs;
    const int rank = cs > 1 ? int(cg::this_cluster().block_rank()) : 0;
#else
    // No clusters in this build: the first block of the group takes the whole row.
    const int parts = 1, rank = 0;
    if (blockIdx.x % cs != 0) return;
#endif
    const float* p = logits + int64_t(row) * ld;
    // Split the row into an unaligned head (< 4 floats), 16-byte vectors and a tail.
    const int head = min(n, int(((16u - unsigned(reinterpret_cast<uintptr_t>(p) & 15u)) & 15u) / 4u));
    const int nv = (n - head) / 4;
    const int tail = head + 4 * nv;
    const float4* pv = reinterpret_cast<const float4*>(p + head);

    float best = -INFINITY;
    int bi = INT_MAX;
    if (rank == 0) {
        if (tid < head) take(__ldg(p + tid), tid, best, bi);
        if (tail + tid < n) take(__ldg(p + tail + tid), tail + tid, best, bi);
    }
    const int v0 = int(int64_t(nv) * rank / parts), v1 = int(int64_t(nv) * (rank + 1) / parts);
    for (int i = v0 + tid; i < v1; i += AM_UNROLL * AM_THREADS) {
        float4 x[AM_UNROLL];
#pragma unroll
        for (int u = 0; u < AM_UNROLL; ++u)
            if (i + u * AM_THREADS < v1) x[u] = __ldg(pv + i + u * AM_THREADS);
#pragma unroll
        for (int u = 0; u < AM_UNROLL; ++u) {
            const int k = i + u * AM_THREADS;
            if (k < v1) {
                const int e = head + 4 * k;
                take(x[u].x, e, best, bi);
                take(x[u].y, e + 1, best, bi);
                take(x[u].z, e + 2, best, bi);
                take(x[u].w, e + 3, best, bi);
            }
        }
    }

    __shared__ float sv[AM_THREADS / WARP];
    __shared__ int si[AM_THREADS / WARP];
    warp_take(best, bi);
    const int lane = tid % WARP, wid = tid / WARP;
    if (lane == 0) {
        sv[wid] = best;
        si[wid] = bi;
    }
    __syncthreads();
    if (wid == 0) {
        best = sv[lane];  // AM_THREADS / WARP == 32 partials
        bi = si[lane];
        warp_take(best, bi);
    }
#if __CUDA_ARCH__ >= 900
    if (parts > 1) {
        __shared__ float cv;
        __shared__ int ci;
        if (tid == 0) {
            cv = best;
            ci = bi;
        }
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();  // every block's partial is in its shared memory
        if (rank == 0 && wid == 0) {
            best = -INFINITY;
            bi = INT_MAX;
            if (lane < parts) {
                best = *cluster.map_shared_rank(&cv, lane);
                bi = *cluster.map_shared_rank(&ci, lane);
            }
            warp_take(best, bi);
            if (lane == 0) ids[row] = bi == INT_MAX ? 0 : bi;
        }
        cluster.sync();  // no block leaves (freeing its shared memory) before rank 0 has read it
        return;
    }
#endif
    if (tid == 0) ids[row] = bi == INT_MAX ? 0 : bi;
}

std::atomic<int> g_cluster_override{0};

// Launch configuration of `rows` clusters of `cs` argmax blocks each; `attr`
// holds the cluster shape the configuration points to.
cudaLaunchConfig_t cluster_config(int cs, int64_t rows, cudaStream_t s, cudaLaunchAttribute& attr) {
    attr = {};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = unsigned(cs);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(rows * cs));
    cfg.blockDim = dim3(AM_THREADS);
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    return cfg;
}

// Blocks per row for the current device: the largest cluster (16, 8, 4) of
// which at least one fits, or 1 where clusters are unavailable. Found once per device.
int auto_cluster_size() {
    static std::mutex mu;
    static std::vector<int> per_device;  // 0: not yet known
    int dev = 0;
    QINFER_CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    if (size_t(dev) >= per_device.size()) per_device.resize(size_t(dev) + 1, 0);
    int& cs = per_device[size_t(dev)];
    if (cs) return cs;
    cs = 1;
    int major = 0;
    QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major >= 9) {
        if (cudaFuncSetAttribute(argmax_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
            cudaGetLastError();  // portable sizes (<= 8) only
        for (int c = AM_MAX_CLUSTER; c >= 4; c /= 2) {
            cudaLaunchAttribute attr;
            const cudaLaunchConfig_t cfg = cluster_config(c, 1, nullptr, attr);
            int fits = 0;
            if (cudaOccupancyMaxActiveClusters(&fits, argmax_kernel, &cfg) == cudaSuccess && fits > 0) {
                cs = c;
                break;
            }
            cudaGetLastError();
        }
    }
    return cs;
}

}  // namespace

void set_argmax_cluster(int cs) { g_cluster_override.store(cs > 0 ? cs : 0); }

void argmax_rows(const float* logits, int64_t ld, int64_t n, int64_t T, int32_t* ids, cudaStream_t s) {
    if (T == 0) return;
    if (n < 0 || n > INT_MAX - 16 || T > INT_MAX / AM_MAX_CLUSTER)
        fail(strfmt("CUDA argmax: %lld rows of %lld logits are too many", (long long)T, (long long)n));
    int cs = auto_cluster_size();
    const int cap = g_cluster_override.load();
    while (cap > 0 && cs > cap) cs /= 2;  // 16 -> 8 -> 4 -> 2 -> 1
    if (cs == 1) {
        argmax_kernel<<<static_cast<unsigned>(T), AM_THREADS, 0, s>>>(logits, ld, int(n), 1, ids);
    } else {
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t cfg = cluster_config(cs, T, s, attr);
        QINFER_CUDA_CHECK(cudaLaunchKernelEx(&cfg, argmax_kernel, logits, ld, int(n), cs, ids));
    }
    QINFER_CUDA_LAUNCHED("argmax");
}

}  // namespace qinfer::cuda
