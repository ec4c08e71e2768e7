// Kernel launches with programmatic dependent launch (PDL, sm_90+).
//
// A decode step is ~350 small kernels in a row; between two of them the GPU
// drains the first grid, makes its writes visible, then launches and ramps up
// the second. With PDL the next kernel's blocks are scheduled while the
// previous one finishes and wait on the device (griddepcontrol.wait) until its
// results are visible, so the launch and ramp overlap the tail.
//
// The contract for a kernel started with launch(): it calls pdl_wait() before
// it reads anything an earlier kernel wrote or writes anything an earlier
// kernel may still read. Before the wait it may only read what no kernel
// writes (weights), what copies wrote before the step's kernels (positions,
// slots, segments), and data the backend vouches for: a KV cache or recurrent
// state that no kernel of the current chain wrote (CudaBackend::written_in_chain;
// the chain is the kernels since the last copy, memset or synchronization,
// which all completed before it). Kernels started with <<<>>> are fully
// ordered as before, so kernels can move to launch() one at a time.
#pragma once
#include <cuda_runtime.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "runtime/cuda/cuda_check.h"

namespace qinfer::cuda {

// Waits until the kernels before this one in the stream have finished and
// their writes are visible (a no-op when launched without PDL or below sm_90).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream be scheduled once every block of this one
// has called it (or exited); it still waits for this one's results in pdl_wait().
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Where kernels let their dependents be scheduled (QINFER_CUDA_PDL_TRIGGER, an
// A/B switch): 0 at their top, 1 (the default) once their inputs are ready
// (after pdl_wait), 2 only at their exit. At the top, a chain of short kernels
// each triggering at once can put several kernels' blocks on the SMs, waiting,
// beside the one that works (mode 1 decodes 3-5% faster on an H200). Kept per
// translation unit (the build has no relocatable device code) and set on each
// device by pdl_configure_device(); QINFER_CUDA_PDL_TRIGGER_FILES limits it to
// some source files.
void register_pdl_trigger_setter(const char* file, cudaError_t (*set)(int mode));
void register_pdl_small_setter(cudaError_t (*set)(int value));
void pdl_configure_device();
#ifdef __CUDACC__
namespace {
__constant__ int pdl_trigger_mode;
cudaError_t set_pdl_trigger_mode(int mode) { return cudaMemcpyToSymbol(pdl_trigger_mode, &mode, sizeof mode); }
[[maybe_unused]] const bool pdl_trigger_registered =
    (register_pdl_trigger_setter(__BASE_FILE__, &set_pdl_trigger_mode), true);
// QINFER_CUDA_SMALL_TRIGGER_TOP (an experiment, 0 by default): the small
// launches between two products -- 1: the one-row norm + quantize and gate +
// quantize; 2: also the attention merge + quantize -- let their dependents be
// scheduled at their top whatever the trigger mode, so the next product's
// blocks take the SMs the previous product leaves while this launch waits.
__constant__ int pdl_small_top;
cudaError_t set_pdl_small_top(int v) { return cudaMemcpyToSymbol(pdl_small_top, &v, sizeof v); }
[[maybe_unused]] const bool pdl_small_registered = (register_pdl_small_setter(&set_pdl_small_top), true);

// At a kernel's top, before anything it waits for.
__device__ __forceinline__ void pdl_trigger_at_top() {
    if (pdl_trigger_mode == 0) pdl_launch_dependents();
}
// pdl_wait(), then the trigger when it goes once the inputs are ready.
__device__ __forceinline__ void pdl_wait_inputs() {
    pdl_wait();
    if (pdl_trigger_mode == 1) pdl_launch_dependents();
}
// At the top of a small launch of class `cls` (see pdl_small_top).
__device__ __forceinline__ void pdl_trigger_small(int cls) {
    if (pdl_small_top >= cls) pdl_launch_dependents();
    else pdl_trigger_at_top();
}
// Both, at the top of a kernel with nothing to do before its inputs are ready.
__device__ __forceinline__ void pdl_enter() {
    pdl_trigger_at_top();
    pdl_wait_inputs();
}
}  // namespace
#endif

// Whether launch() asks for PDL: the device is sm_90 or newer, the kernels were
// compiled for it (not JIT-compiled from the sm_80 PTX, which has no waits),
// and QINFER_CUDA_PDL is not 0. Decided once per process.
bool pdl_enabled();

// Lets `kernel` take `bytes` of dynamic shared memory on the current device
// (above 48 KB a kernel needs the opt-in; the setting is per device). Cheap
// after the first call for a kernel, device and size: the host remembers.
void allow_dynamic_smem(const void* kernel, size_t bytes);
template <class... KArgs> void allow_dynamic_smem(void (*kernel)(KArgs...), size_t bytes) {
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// How many blocks of `kernel` (`threads` each, `smem` bytes of dynamic shared
// memory) one SM of the current device holds at once, and its SM count: what
// a grid of one resident wave may have. Asked of the runtime once per kernel,
// device and shape.
struct Residency {
    int per_sm = 0, sms = 0;
};
Residency residency(const void* kernel, int threads, size_t smem);
template <class... KArgs> Residency residency(void (*kernel)(KArgs...), int threads, size_t smem) {
    return residency(reinterpret_cast<const void*>(kernel), threads, smem);
}

// kernel<<<grid, block, smem, s>>>(args...), with PDL when pdl_enabled().
template <class... KArgs, class... Args>
void launch(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            Args&&... args) {
    static_assert(sizeof...(KArgs) == sizeof...(Args), "launch: argument count");
    std::tuple<std::remove_cv_t<std::remove_reference_t<KArgs>>...> values(std::forward<Args>(args)...);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    const bool pdl = pdl_enabled();
    cfg.attrs = pdl ? attr : nullptr;
    cfg.numAttrs = pdl ? 1 : 0;
    const cudaError_t e = std::apply(
        [&](auto&... v) {
            void* ptrs[] = {static_cast<void*>(&v)...};
            return cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(kernel), ptrs);
        },
        values);
    if (e != cudaSuccess) throw_cuda(e, name, __FILE__, __LINE__);
}

}  // namespace qinfer::cuda
