// cpu_matmul driver: validates shapes, quantizes the activations once per call,
// splits the output rows (and, for long prompts, the activation rows) into
// tasks for the thread pool, and calls the dot-product kernel of the best ISA
// level the CPU supports. Tiling: a task owns a chunk of weight rows and a
// block of activation rows; it walks the activation rows in tiles of kMaxTile
// so each weight block is unpacked once per tile and the chunk's weights stay
// in L2 while the tiles pass over them.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "common/thread_pool.h"
#include "quant/blocks.h"
#include "quant/cpu_kernels.h"
#include "quant/cpu_matmul.h"
#include "quant/quant_ref.h"

#if defined(__x86_64__) || defined(_M_X64)
#define QINFER_X86 1
#if defined(_MSC_VER)
#include <intrin.h>
#else
#include <cpuid.h>
#endif
#endif

namespace qinfer::kernels {

namespace {

#ifdef QINFER_X86
void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
#if defined(_MSC_VER)
    int regs[4];
    __cpuidex(regs, int(leaf), int(sub));
    for (int i = 0; i < 4; ++i) r[i] = uint32_t(regs[i]);
#else
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
#endif
}

uint64_t xgetbv0() {
#if defined(_MSC_VER)
    return _xgetbv(0);
#else
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return (uint64_t(edx) << 32) | eax;
#endif
}

Isa hardware_isa() {
    uint32_t r[4];
    cpuid(0, 0, r);
    const uint32_t max_leaf = r[0];
    if (max_leaf < 7) return Isa::Scalar;
    cpuid(1, 0, r);
    const bool osxsave = r[2] & (1u << 27), fma = r[2] & (1u << 12), f16c = r[2] & (1u << 29);
    if (!osxsave) return Isa::Scalar;
    const uint64_t xcr0 = xgetbv0();
    const bool ymm_state = (xcr0 & 0x6) == 0x6;
    const bool zmm_state = (xcr0 & 0xE6) == 0xE6;
    cpuid(7, 0, r);
    const bool avx2 = r[1] & (1u << 5);
    const bool avx512f = r[1] & (1u << 16), avx512dq = r[1] & (1u << 17), avx512bw = r[1] & (1u << 30),
               avx512vl = r[1] & (1u << 31), vnni = r[2] & (1u << 11);
    if (!(ymm_state && avx2 && fma && f16c)) return Isa::Scalar;
    if (zmm_state && avx512f && avx512dq && avx512bw && avx512vl && vnni) return Isa::Avx512;
    return Isa::Avx2;
}
#else
Isa hardware_isa() { return Isa::Scalar; }
#endif

// The SIMD files are compiled on every x86-64 build. Their tables must not be
// touched before the CPU check: even their initialisation may use AVX.
Isa compiled_limit(Isa isa) {
#ifdef QINFER_X86
    return isa;
#else
    (void)isa;
    return Isa::Scalar;
#endif
}

DotFn pick_dot(Isa isa, GgmlType wt) {
    const int id = int(wt);
    if (id < 0 || id >= kTypeSlots) return nullptr;
    if (isa == Isa::Avx512 && avx512_table() && avx512_table()->dot[id]) return avx512_table()->dot[id];
    if (isa >= Isa::Avx2 && avx2_table() && avx2_table()->dot[id]) return avx2_table()->dot[id];
    return scalar_table()->dot[id];
}

// Activations to Q8_0 / Q8_1: ggml's reference layout, rounded with nearest_int
// (ties to even, as ggml's SIMD quantizers do) instead of a libm roundf call
// per element. Q8_K uses the reference quantizer, which already does.
template <class B>
void quantize_act_q8(const float* x, B* y, int64_t K) {
    for (int64_t i = 0; i < K / 32; ++i, x += 32) {
        float amax = 0.f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            y[i].qs[j] = int8_t(nearest_int(x[j] * id));
            sum += y[i].qs[j];
        }
        y[i].d = fp32_to_fp16(d);
        if constexpr (sizeof(B) == sizeof(block_q8_1)) y[i].s = fp32_to_fp16(float(sum) * d);
    }
}

void quantize_activation_row(ActFormat f, const float* x, uint8_t* dst, int64_t K) {
    switch (f) {
        case ActFormat::Q8_0: quantize_act_q8(x, reinterpret_cast<block_q8_0*>(dst), K); break;
        case ActFormat::Q8_1: quantize_act_q8(x, reinterpret_cast<block_q8_1*>(dst), K); break;
        case ActFormat::Q8_K: quantize_ref_q8_K(x, reinterpret_cast<block_q8_K*>(dst), K); break;
        case ActFormat::F32: std::memcpy(dst, x, size_t(K) * 4); break;
    }
}

int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(hi, v)); }

}  // namespace

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::Avx512: return "avx512vnni";
        case Isa::Avx2: return "avx2";
        default: return "scalar";
    }
}

bool cpu_supports(Isa isa) { return isa <= compiled_limit(hardware_isa()); }

Isa detected_isa() {
    static const Isa isa = [] {
        Isa best = compiled_limit(hardware_isa());
        if (const char* env = std::getenv("QINFER_CPU_ISA")) {
            const std::string want(env);
            Isa forced = best;
            if (want == "scalar") forced = Isa::Scalar;
            else if (want == "avx2") forced = Isa::Avx2;
            else if (want == "avx512" || want == "avx512vnni") forced = Isa::Avx512;
            best = std::min(best, forced);  // the variable can only lower the level
        }
        return best;
    }();
    return isa;
}

ActFormat act_format(GgmlType wt) {
    switch (wt) {
        case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return ActFormat::Q8_0;
        case GgmlType::Q4_1: case GgmlType::Q5_1: return ActFormat::Q8_1;
        case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K:
        case GgmlType::Q6_K: return ActFormat::Q8_K;
        default: return ActFormat::F32;
    }
}

size_t act_row_bytes(ActFormat f, int64_t K) {
    switch (f) {
        case ActFormat::Q8_0: return size_t(K / QK8_0) * sizeof(block_q8_0);
        case ActFormat::Q8_1: return size_t(K / QK8_1) * sizeof(block_q8_1);
        case ActFormat::Q8_K: return size_t(K / QK_K) * sizeof(block_q8_K);
        default: return size_t(K) * 4;
    }
}

void matmul_isa(Isa isa, GgmlType wt, const void* W, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                int64_t ldy, ThreadPool& pool) {
    if (!type_traits(uint32_t(wt))) fail(strfmt("cpu_matmul: unknown tensor type id %u", unsigned(wt)));
    if (!cpu_supports(isa)) fail(strfmt("cpu_matmul: this CPU or build does not support %s", isa_name(isa)));
    const DotFn dot = pick_dot(isa, wt);
    if (!dot) fail(strfmt("cpu_matmul: unsupported weight type %s", type_name(wt)));
    const uint32_t bs = traits(wt).block_size;
    if (K <= 0 || N < 0 || T < 0 || K % bs != 0)
        fail(strfmt("cpu_matmul: bad shape K=%lld N=%lld T=%lld for %s (K must be a positive multiple of %u)",
                    (long long)K, (long long)N, (long long)T, type_name(wt), bs));
    if (ldy < N) fail(strfmt("cpu_matmul: output stride %lld < N=%lld", (long long)ldy, (long long)N));
    if (N == 0 || T == 0) return;

    // 1. Activations -> 8-bit blocks, once per call (f32 weights use x as is).
    const ActFormat af = act_format(wt);
    const size_t ab = act_row_bytes(af, K);
    const uint8_t* A = reinterpret_cast<const uint8_t*>(x);
    thread_local std::vector<uint8_t> act_buf;
    if (af != ActFormat::F32) {
        if (act_buf.size() < ab * size_t(T)) act_buf.resize(ab * size_t(T));
        uint8_t* dst = act_buf.data();
        if (T >= 4)
            pool.parallel_for(T, [&](int64_t t, int) { quantize_activation_row(af, x + t * K, dst + t * ab, K); });
        else
            for (int64_t t = 0; t < T; ++t) quantize_activation_row(af, x + t * K, dst + t * ab, K);
        A = dst;
    }

    // 2. Tasks: nc weight rows x tc activation rows, sized so that each task's
    //    weights and activations fit in L2 (~256 KiB each).
    const size_t wb = row_bytes(wt, K);
    const uint8_t* Wb = static_cast<const uint8_t*>(W);
    const int64_t threads = pool.size();
    int64_t nc, tc;
    if (T == 1) {
        // Decode: pure streaming of the weights; enough tasks to balance the threads.
        nc = clamp64(N / (threads * 16), 4, 128);
        tc = 1;
    } else {
        nc = clamp64(int64_t((256 << 10) / wb), 4, 256);
        tc = clamp64(int64_t((256 << 10) / ab), kMaxTile, 256) / kMaxTile * kMaxTile;
        // Small N (e.g. DeltaNet gates): split the activation rows more finely.
        const int64_t n_chunks = (N + nc - 1) / nc;
        while (tc > kMaxTile && n_chunks * ((T + tc - 1) / tc) < threads * 4) tc = std::max<int64_t>(kMaxTile, tc / 2);
    }
    const int64_t n_chunks = (N + nc - 1) / nc, t_blocks = (T + tc - 1) / tc;
    pool.parallel_for(n_chunks * t_blocks, [&](int64_t task, int) {
        const int64_t o0 = (task % n_chunks) * nc, o1 = std::min(N, o0 + nc);
        const int64_t t0 = (task / n_chunks) * tc, t1 = std::min(T, t0 + tc);
        for (int64_t t = t0; t < t1; t += kMaxTile) {
            const int R = int(std::min<int64_t>(kMaxTile, t1 - t));
            for (int64_t o = o0; o < o1; ++o)
                dot(K, Wb + size_t(o) * wb, A + size_t(t) * ab, ab, R, y + t * ldy + o, ldy);
        }
    });
}

}  // namespace qinfer::kernels

namespace qinfer {

void cpu_matmul(GgmlType wt, const void* W, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                int64_t ldy, ThreadPool& pool) {
    kernels::matmul_isa(kernels::detected_isa(), wt, W, K, N, x, T, y, ldy, pool);
}

const char* cpu_kernel_isa() { return kernels::isa_name(kernels::detected_isa()); }

}  // namespace qinfer
