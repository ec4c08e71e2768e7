// Building blocks of the sm_80+ tensor-core and asynchronous-copy kernels
// (attention, f16 products): shared-space addresses, cp.async, ldmatrix and the
// f16 mma.sync with f32 accumulators. No Hopper-only instruction, so the
// compute_80 PTX runs on RTX 30xx / 40xx too.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace qinfer::cuda {

// A shared-memory pointer as the 32-bit shared-space address PTX takes.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously (cp.async.cg: through L2 only).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
// The same, zero-filled when !valid (src is then not read but must still be a
// valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
// 4 or 8 bytes global -> shared (cp.async.ca), zero-filled when !valid: rows
// whose size is not a multiple of 16 bytes (q8_0 cache rows of a 64- or
// 128-wide head).
template <int N> __device__ __forceinline__ void cp_async_small(void* dst, const void* src, bool valid) {
    static_assert(N == 4 || N == 8, "cp.async.ca copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(N),
                 "r"(valid ? N : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices from shared memory (lane l addresses row l % 8 of matrix l / 8).
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) { ldsm_x4(addr, r[0], r[1], r[2], r[3]); }
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a b for a 16x16 (row) by 16x8 (col) f16 product, f32 accumulators.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a half2 register, `lo` in the low 16 bits (the lower column).
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// A float pair as two f16 terms, x = hi + lo with lo = f16(x - hi): an f16 mma
// over both keeps ~22 bits of the f32 operand.
__device__ __forceinline__ void split_half2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 hf = __half22float2(h);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = pack_half2(x0 - hf.x, x1 - hf.y);
}

// Two unsigned bytes of u (picked by the byte-permute selector `sel`: 0x5140
// takes bytes 0 and 1, 0x7362 bytes 2 and 3) minus `bias`, as an exact half2:
// 0x64XX is the f16 of 1024 + XX.
__device__ __forceinline__ __half2 bytes_to_half2(uint32_t u, uint32_t sel, float bias) {
    const uint32_t h = __byte_perm(u, 0x64646464u, sel);
    return __hsub2(*reinterpret_cast<const __half2*>(&h), __float2half2_rn(bias));
}

// Two int8 (the low 16 bits of p, the lower address in the low byte) as an
// exact half2 register: x + 128 as an unsigned byte, less 1024 + 128.
__device__ __forceinline__ uint32_t i8x2_to_half2(uint32_t p) {
    const __half2 h = bytes_to_half2(p ^ 0x8080u, 0x5140, 1152.f);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// Element offset of 16-byte chunk c of row r in a [rows][D] f16 shared tile
// stored at chunk c ^ (r % 8): the 8 rows an ldmatrix phase reads lie in 8
// different bank groups without padding.
template <int D> __device__ __forceinline__ int swz(int r, int c) {
    return (r * (D / 8) + (c ^ (r & 7))) * 8;
}

}  // namespace qinfer::cuda
