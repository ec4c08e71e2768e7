// Weights streamed into an arena for one step (prompt offload): the layers that
// live in host memory run here for big batches. Copies run on the upload
// stream; the compute stream waits for them (an event) before the ops issued
// afterwards, so the host returns once they are queued and the GPU keeps
// computing the previous layer meanwhile. From a pinned range (pin_streamed_range) the DMA reads the
// mapped file directly (repacked types: raw blocks, then the repack kernel);
// otherwise the blocks go through the load-time pinned staging ring, which
// costs a host memcpy per byte (~8 GB/s on one core).
#include <cstdio>
#include <cstdlib>

#include "common/error.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/layout.h"
#include "runtime/cuda/repack.h"

namespace qinfer {

size_t CudaBackend::weight_bytes(GgmlType type, const int64_t ne[4]) const {
    const int64_t n = ne[0] * ne[1] * ne[2] * ne[3];
    return cuda::weight_layout(type, n / traits(type).block_size).total;
}

Tensor CudaBackend::stream_weight(const Tensor& arena, size_t offset, GgmlType type, const int64_t ne[4],
                                  const void* src, const char* name) {
    check_ours(arena, "stream_weight");
    if (in_keyed_) fail("CUDA: stream_weight() inside a recorded step");
    Tensor t = weight_desc(type, ne, name);
    const TypeTraits& tt = traits(type);
    const int64_t n_blocks = t.n_elements() / tt.block_size;
    const cuda::WeightLayout l = cuda::weight_layout(type, n_blocks);
    if (offset % 256 != 0 || offset + l.total > arena.nbytes())
        fail(strfmt("stream_weight '%s': %zu bytes at offset %zu do not fit arena '%s' (%zu bytes)", name, l.total,
                    offset, arena.name, arena.nbytes()));
    uint8_t* dst = static_cast<uint8_t*>(arena.data) + offset;

    if (!streamed_) QINFER_CUDA_CHECK(cudaEventCreateWithFlags(&streamed_, cudaEventDisableTiming));
    // Launch the ops queued so far before the compute stream starts waiting
    // for this copy: they do not read these bytes (the caller's guarantee),
    // so they run while it is in flight.
    flush();
    const size_t file_bytes = size_t(n_blocks) * tt.type_size;
    if (in_pinned_range(src, file_bytes)) {
        // Straight from the pinned file pages; repacked types go through the
        // raw stage and the repack kernel (same stream: the next copy into the
        // stage waits for the kernel).
        if (!l.repacked) {
            QINFER_CUDA_CHECK(cudaMemcpyAsync(dst, src, file_bytes, cudaMemcpyHostToDevice, upload_stream_));
        } else {
            if (raw_stage_bytes_ < file_bytes) {
                QINFER_CUDA_CHECK(cudaStreamSynchronize(upload_stream_));
                if (raw_stage_) device_free(raw_stage_, raw_stage_bytes_);
                raw_stage_ = nullptr;
                raw_stage_bytes_ = 0;
                raw_stage_ = device_malloc(file_bytes, "streamed weight stage");
                raw_stage_bytes_ = file_bytes;
            }
            QINFER_CUDA_CHECK(cudaMemcpyAsync(raw_stage_, src, file_bytes, cudaMemcpyHostToDevice, upload_stream_));
            cuda::repack_blocks_on_device(type, raw_stage_, n_blocks, dst, upload_stream_);
        }
    } else {
        copy_weight_blocks(type, l, n_blocks, static_cast<const uint8_t*>(src), dst);
    }
    QINFER_CUDA_CHECK(cudaEventRecord(streamed_, upload_stream_));
    QINFER_CUDA_CHECK(cudaStreamWaitEvent(stream_, streamed_, 0));

    cuda::DeviceWeight dw;
    dw.type = type;
    dw.K = ne[0];
    dw.N = t.n_rows();
    dw.data = dst;
    dw.layout = l;
    weights_[dst] = WeightInfo{dw};
    t.data = dst;
    return t;
}

bool CudaBackend::in_pinned_range(const void* p, size_t bytes) const {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    for (const auto& [start, n] : pinned_ranges_)
        if (b >= start && b + bytes <= start + n) return true;
    return false;
}

// Page-aligned cudaHostRegister of a read-only mapping. Pinning reads the
// pages in and locks them; where the driver or the system refuses, streaming
// keeps going through the pinned staging ring.
bool CudaBackend::pin_streamed_range(const void* host, size_t bytes) {
    if (bytes == 0 || std::getenv("QINFER_CUDA_NO_PIN")) return false;
    constexpr uintptr_t kPage = 4096;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(host) & ~(kPage - 1);
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(host) + bytes + kPage - 1) & ~(kPage - 1);
    void* p = reinterpret_cast<void*>(lo);
    const cudaError_t e = cudaHostRegister(p, hi - lo, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    if (e != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it
        if (std::getenv("QINFER_CUDA_VERBOSE"))
            std::fprintf(stderr, "%s: streamed weights stay unpinned (%s)\n", name_.c_str(), cudaGetErrorString(e));
        return false;
    }
    pinned_ranges_.emplace_back(static_cast<const uint8_t*>(p), size_t(hi - lo));
    return true;
}

}  // namespace qinfer
