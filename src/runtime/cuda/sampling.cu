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

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/kernels.h"
#include "runtime/top_k_order.h"

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

// ---- top-k candidates (Backend::top_k)
//
// Each element is one 64-bit number that orders as the sampler does (the
// logit's order key above the inverted index, top_k_order.h), so
// all are distinct and "the k best" is "every number >= the k-th largest".
// That number is found by a radix select: eight passes over 8-bit digits from
// the top, each a shared-memory histogram of the elements that match the
// digits chosen so far and a warp that finds the digit holding the k-th; it
// stops early once the chosen digit's whole bin is needed (ties on the logit
// are rare, so four passes usually do). Two kernels: blocks over slices of a
// row keep their slice's k best (in a work buffer), then one block per row
// selects the k best of those and sorts them by rank.

namespace {

constexpr int TK_THREADS = 256;
constexpr int TK_MAX_K = 256;           // one sorting thread per candidate
constexpr int TK_MAX_CANDIDATES = 8192;  // slices per row x k, what the second kernel reads
constexpr int TK_MAX_SLICES = 128;

struct SelectShared {
    unsigned hist[256];
    unsigned digit, remaining, whole_bin;
};

// The smallest threshold such that exactly k of the n numbers item(i) are >=
// it (1 <= k <= n, all distinct). Every thread of the block calls it.
template <class Item>
__device__ uint64_t radix_select(const Item& item, int n, int k, SelectShared& sh) {
    const int tid = threadIdx.x, lane = tid % WARP;
    uint64_t prefix = 0, mask = 0;
    unsigned remaining = unsigned(k);
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += blockDim.x) sh.hist[b] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += blockDim.x) {
            const uint64_t c = item(i);
            if ((c & mask) == prefix) atomicAdd(&sh.hist[(c >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid < WARP) {
            // lane l holds bins 255 - 8l down to 248 - 8l: the scan runs from the top digit down
            unsigned cnt[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) sum += cnt[j] = sh.hist[255 - 8 * lane - j];
            unsigned incl = sum;
#pragma unroll
            for (int o = 1; o < WARP; o <<= 1) {
                const unsigned up = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += up;
            }
            unsigned acc = incl - sum;
            if (acc < remaining && remaining <= incl) {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (acc + cnt[j] >= remaining) {
                        sh.digit = unsigned(255 - 8 * lane - j);
                        sh.remaining = remaining - acc;
                        sh.whole_bin = cnt[j] == remaining - acc;
                        break;
                    }
                    acc += cnt[j];
                }
            }
        }
        __syncthreads();
        prefix |= uint64_t(sh.digit) << shift;
        mask |= uint64_t(255) << shift;
        remaining = sh.remaining;
        const bool done = sh.whole_bin;
        __syncthreads();  // sh is rewritten by the next pass
        if (done) break;
    }
    return prefix;  // the digits below the last chosen one are 0: the whole bin is in
}

// Grid (slices, T): slice b of row t writes its k best (fewer when the slice
// is shorter, the rest 0, below any element) to work[(t * slices + b) * k ...].
__global__ void __launch_bounds__(TK_THREADS) top_k_slices_kernel(const float* __restrict__ logits, int64_t ld,
                                                                  int n, int k, uint64_t* __restrict__ work) {
    __shared__ SelectShared sh;
    __shared__ unsigned count;
    const int slices = gridDim.x, b = blockIdx.x;
    const int64_t t = blockIdx.y;
    const int per = (n + slices - 1) / slices;
    const int i0 = min(n, b * per), len = min(n, i0 + per) - i0;
    const float* row = logits + t * ld;
    uint64_t* out = work + (t * slices + b) * k;
    auto item = [&](int i) { return top_k_order(__ldg(row + i0 + i), i0 + i); };
    if (len <= k) {
        for (int i = threadIdx.x; i < k; i += blockDim.x) out[i] = i < len ? item(i) : 0;
        return;
    }
    const uint64_t th = radix_select(item, len, k, sh);
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const uint64_t c = item(i);
        if (c >= th) {
            const unsigned at = atomicAdd(&count, 1u);
            if (at < unsigned(k)) out[at] = c;  // more only if the k-th is a NaN among padding
        }
    }
}

// Grid T: row t's k best of its slices' candidates, sorted, to values / ids.
__global__ void __launch_bounds__(TK_THREADS) top_k_merge_kernel(const float* __restrict__ logits, int64_t ld,
                                                                 int n, int n_cand, int k,
                                                                 const uint64_t* __restrict__ work,
                                                                 float* __restrict__ values, int32_t* __restrict__ ids) {
    __shared__ SelectShared sh;
    __shared__ uint64_t best[TK_MAX_K];
    __shared__ unsigned count;
    const int64_t t = blockIdx.x;
    const uint64_t* cand = work + t * n_cand;
    auto item = [&](int i) { return cand[i]; };
    const uint64_t th = radix_select(item, n_cand, k, sh);
    if (threadIdx.x == 0) count = 0;
    for (int j = threadIdx.x; j < k; j += blockDim.x) best[j] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_cand; i += blockDim.x) {
        const uint64_t c = cand[i];
        if (c >= th) {
            const unsigned at = atomicAdd(&count, 1u);
            if (at < unsigned(k)) best[at] = c;
        }
    }
    __syncthreads();
    // Sorted by rank: the number of candidates larger than this one.
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const uint64_t c = best[j];
        int rank = 0;
        for (int i = 0; i < k; ++i) rank += best[i] > c;
        const int64_t idx = min(top_k_index(c), int64_t(n - 1));  // padding (never chosen from real logits)
        values[t * k + rank] = logits[t * ld + idx];
        ids[t * k + rank] = int32_t(idx);
    }
}

int top_k_slices(int64_t n, int k) {
    return int(std::max<int64_t>(1, std::min<int64_t>({TK_MAX_SLICES, TK_MAX_CANDIDATES / k, n / k})));
}

}  // namespace

size_t top_k_work_bytes(int64_t n, int64_t T, int k) {
    if (k < 1 || k > TK_MAX_K || k > n) return 0;
    return size_t(T) * size_t(top_k_slices(n, k)) * size_t(k) * sizeof(uint64_t);
}

void top_k_rows(const float* logits, int64_t ld, int64_t n, int64_t T, int k, float* values, int32_t* ids,
                void* work, cudaStream_t s) {
    if (T == 0) return;
    if (k < 1 || k > TK_MAX_K || k > n || n > INT_MAX || T > 65535)
        fail(strfmt("CUDA top_k: %lld rows of %lld logits, k = %d", (long long)T, (long long)n, k));
    const int slices = top_k_slices(n, k);
    top_k_slices_kernel<<<dim3(unsigned(slices), unsigned(T)), TK_THREADS, 0, s>>>(logits, ld, int(n), k,
                                                                                  static_cast<uint64_t*>(work));
    QINFER_CUDA_LAUNCHED("top_k slices");
    top_k_merge_kernel<<<unsigned(T), TK_THREADS, 0, s>>>(logits, ld, int(n), slices * k, k,
                                                         static_cast<const uint64_t*>(work), values, ids);
    QINFER_CUDA_LAUNCHED("top_k merge");
}

}  // namespace qinfer::cuda
