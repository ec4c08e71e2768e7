// Weights streamed into an arena for one step (prompt offload): the layers that
// live in host memory run here for big batches. The copy goes through the same
// pinned ring as the load-time upload, on the upload stream, fenced by events
// against the compute stream on both sides, so the host returns as soon as the
// last chunk is queued and the GPU keeps computing the previous layer meanwhile.
#include "common/error.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/layout.h"

namespace qinfer {

size_t CudaBackend::weight_bytes(GgmlType type, const int64_t ne[4]) const {
    const int64_t n = ne[0] * ne[1] * ne[2] * ne[3];
    return cuda::weight_layout(type, n / traits(type).block_size).total;
}

Tensor CudaBackend::stream_weight(const Tensor& arena, size_t offset, GgmlType type, const int64_t ne[4],
                                  const void* src, const char* name) {
    check_ours(arena, "stream_weight");
    if (in_keyed_) fail("CUDA: stream_weight() inside a recorded step");
    if (!cuda::cuda_supports_weight_type(type))
        fail(strfmt("CUDA: tensor '%s' has type %s, which the CUDA kernels do not handle", name, type_name(type)));
    const TypeTraits& tt = traits(type);
    if (ne[0] % tt.block_size != 0)
        fail(strfmt("CUDA: tensor '%s': rows of %lld are not whole %s blocks", name, (long long)ne[0], tt.name));
    Tensor t;
    t.type = type;
    for (int i = 0; i < 4; ++i) t.ne[i] = ne[i];
    set_contiguous_strides(t);
    t.backend = this;
    t.name = name;
    const int64_t n_blocks = t.n_elements() / tt.block_size;
    const cuda::WeightLayout l = cuda::weight_layout(type, n_blocks);
    if (offset % 256 != 0 || offset + l.total > arena.nbytes())
        fail(strfmt("stream_weight '%s': %zu bytes at offset %zu do not fit arena '%s' (%zu bytes)", name, l.total,
                    offset, arena.name, arena.nbytes()));
    uint8_t* dst = static_cast<uint8_t*>(arena.data) + offset;

    if (!compute_mark_) {
        QINFER_CUDA_CHECK(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
        QINFER_CUDA_CHECK(cudaEventCreateWithFlags(&streamed_, cudaEventDisableTiming));
    }
    // Ops issued so far may read these bytes: launch them, and let the copy
    // start only after them.
    flush();
    QINFER_CUDA_CHECK(cudaEventRecord(compute_mark_, stream_));
    QINFER_CUDA_CHECK(cudaStreamWaitEvent(upload_stream_, compute_mark_, 0));
    copy_weight_blocks(type, l, n_blocks, static_cast<const uint8_t*>(src), dst);
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

}  // namespace qinfer
