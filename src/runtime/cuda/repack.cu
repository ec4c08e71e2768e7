// Block repacking on the GPU (see repack.h and layout.h): one thread per block
// copies its main, qh and scale fields to their sections. Blocks are 2-byte
// aligned in the file layout, so fields move in 16-bit words.
#include <cstddef>

#include "common/error.h"
#include "quant/blocks.h"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/layout.h"
#include "runtime/cuda/repack.h"

namespace qinfer::cuda {

namespace {

struct Field {
    int offset = 0;  // bytes into the GGUF block
    int bytes = 0;   // 0: the layout has no such section
};

__device__ __forceinline__ void copy_field(const uint8_t* blk, Field f, uint8_t* dst) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(blk + f.offset);
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    for (int i = 0; i < f.bytes / 2; ++i) d[i] = s[i];
}

__global__ void repack_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, int type_size, Field main,
                              Field qh, Field d, uint8_t* __restrict__ dmain, uint8_t* __restrict__ dqh,
                              uint8_t* __restrict__ dd) {
    const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint8_t* blk = src + b * type_size;
    copy_field(blk, main, dmain + b * main.bytes);
    if (qh.bytes) copy_field(blk, qh, dqh + b * qh.bytes);
    copy_field(blk, d, dd + b * d.bytes);
}

}  // namespace

void repack_blocks_on_device(GgmlType t, const void* src, int64_t n_blocks, void* dst, cudaStream_t s) {
    Field main, qh, d;
    switch (t) {
        case GgmlType::Q4_0: main = {int(offsetof(block_q4_0, qs)), 16}; d = {0, 2}; break;
        case GgmlType::Q4_1: main = {int(offsetof(block_q4_1, qs)), 16}; d = {0, 4}; break;  // d, m
        case GgmlType::Q5_0:
            main = {int(offsetof(block_q5_0, qs)), 16};
            qh = {int(offsetof(block_q5_0, qh)), 4};
            d = {0, 2};
            break;
        case GgmlType::Q5_1:
            main = {int(offsetof(block_q5_1, qs)), 16};
            qh = {int(offsetof(block_q5_1, qh)), 4};
            d = {0, 4};
            break;
        case GgmlType::Q8_0: main = {int(offsetof(block_q8_0, qs)), 32}; d = {0, 2}; break;
        case GgmlType::Q6_K: main = {0, 208}; d = {int(offsetof(block_q6_K, d)), 2}; break;  // ql, qh, scales
        default: fail(strfmt("CUDA repack: type %s is not repacked", type_name(t)));
    }
    const WeightLayout l = weight_layout(t, n_blocks);
    if (size_t(main.bytes) != l.main_bytes || size_t(qh.bytes) != l.qh_bytes || size_t(d.bytes) != l.d_bytes)
        fail(strfmt("CUDA repack: %s fields do not match the layout", type_name(t)));
    if (n_blocks == 0) return;
    uint8_t* base = static_cast<uint8_t*>(dst);
    const int threads = 256;
    repack_kernel<<<unsigned((n_blocks + threads - 1) / threads), threads, 0, s>>>(
        static_cast<const uint8_t*>(src), n_blocks, int(traits(t).type_size), main, qh, d, base,
        l.qh_bytes ? base + l.off_qh : nullptr, base + l.off_d);
    QINFER_CUDA_LAUNCHED("repack");
}

}  // namespace qinfer::cuda
