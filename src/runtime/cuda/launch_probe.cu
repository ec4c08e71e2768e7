// The cost of a kernel boundary inside a captured graph: a decode step is
// ~270-400 dependent kernels, so this cost times the launch count bounds the
// launch-per-op design from below, whatever the kernels do. The probe times
// chains of kernels that do (next to) nothing: empty ones, and ones that wait
// for the kernel before (griddepcontrol.wait) and read the word it wrote, with
// one block and with a full grid, with and without programmatic dependent
// launch. Used by the timing test in cuda_kernels_test (CudaLaunchTiming).
#include <algorithm>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/launch.cuh"

namespace qinfer::cuda {

namespace {

// (An argument, as launch() builds an array of argument pointers.)
__global__ void probe_empty_kernel(int) { pdl_trigger_at_top(); }

// Block b: out[b] = in[b] + 1 once the kernel before (which wrote in) is done.
__global__ void probe_chain_kernel(const long long* in, long long* out) {
    pdl_trigger_at_top();
    pdl_wait_inputs();
    if (threadIdx.x == 0) out[blockIdx.x] = in[blockIdx.x] + 1;
}

enum class Chain { Empty, Block, Grid, GridPlain };

// Microseconds per kernel of the fastest of `replays` replays of a graph of n
// launches; bufs[0] / bufs[1] alternate as input and output.
double time_chain(Chain kind, int n, int replays, int grid, long long* const bufs[2], cudaStream_t s) {
    cudaGraph_t graph = nullptr;
    QINFER_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; ++i) {
        const long long* in = bufs[i % 2];
        long long* out = bufs[(i + 1) % 2];
        switch (kind) {
            case Chain::Empty: launch("probe_empty_kernel", probe_empty_kernel, dim3(1), dim3(32), 0, s, 0); break;
            case Chain::Block: launch("probe_chain_kernel", probe_chain_kernel, dim3(1), dim3(32), 0, s, in, out); break;
            case Chain::Grid: launch("probe_chain_kernel", probe_chain_kernel, dim3(grid), dim3(128), 0, s, in, out); break;
            case Chain::GridPlain: probe_chain_kernel<<<grid, 128, 0, s>>>(in, out); break;
        }
    }
    QINFER_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec = nullptr;
    QINFER_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t a, b;
    QINFER_CUDA_CHECK(cudaEventCreate(&a));
    QINFER_CUDA_CHECK(cudaEventCreate(&b));
    QINFER_CUDA_CHECK(cudaGraphLaunch(exec, s));  // warm-up
    float best = 1e30f;
    for (int r = 0; r < replays; ++r) {
        QINFER_CUDA_CHECK(cudaEventRecord(a, s));
        QINFER_CUDA_CHECK(cudaGraphLaunch(exec, s));
        QINFER_CUDA_CHECK(cudaEventRecord(b, s));
        QINFER_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0.f;
        QINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return 1e3 * double(best) / n;
}

}  // namespace

LaunchCost probe_launch_cost(int n, int replays, cudaStream_t s) {
    n = std::max(2, n + n % 2);  // even, so a chain ends in bufs[0]
    replays = std::max(1, replays);
    int dev = 0, sms = 0;
    QINFER_CUDA_CHECK(cudaGetDevice(&dev));
    QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int grid = 4 * sms;
    long long* mem = nullptr;
    QINFER_CUDA_CHECK(cudaMalloc(&mem, 2 * size_t(grid) * sizeof(long long)));
    long long* const bufs[2] = {mem, mem + grid};
    LaunchCost c;
    c.launches = (1 + replays) * static_cast<long long>(n);
    c.last_value = c.launches;
    try {
        c.empty_block = time_chain(Chain::Empty, n, replays, grid, bufs, s);
        const Chain chains[3] = {Chain::Block, Chain::Grid, Chain::GridPlain};
        double* times[3] = {&c.chain_block, &c.chain_grid, &c.chain_grid_plain};
        for (int k = 0; k < 3; ++k) {
            QINFER_CUDA_CHECK(cudaMemsetAsync(mem, 0, 2 * size_t(grid) * sizeof(long long), s));
            *times[k] = time_chain(chains[k], n, replays, grid, bufs, s);
            // Every block of the chain's grid must have counted every launch.
            std::vector<long long> got(size_t(k == 0 ? 1 : grid));
            QINFER_CUDA_CHECK(cudaMemcpyAsync(got.data(), bufs[0], got.size() * sizeof(long long),
                                              cudaMemcpyDeviceToHost, s));
            QINFER_CUDA_CHECK(cudaStreamSynchronize(s));
            for (long long v : got) c.last_value = std::min(c.last_value, v);
        }
    } catch (...) {
        cudaFree(mem);
        throw;
    }
    cudaFree(mem);
    return c;
}

}  // namespace qinfer::cuda
