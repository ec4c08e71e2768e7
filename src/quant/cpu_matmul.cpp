// cpu_matmul driver: validates shapes, quantizes the activations once per call
// (once per group of matrices sharing an input), splits the output rows (and,
// for long prompts, the activation rows) into tasks for one parallel region,
// and calls the kernels of the best ISA level the CPU supports. Dot kernels
// (decode, short prompts, types without a tile kernel): a task owns a chunk of
// weight rows and a block of activation rows; it walks the activation rows in
// tiles of kMaxTile so each weight block is unpacked once per tile and the
// chunk's weights stay in L2 while the tiles pass over them. Int8 tile kernels
// (K-quants, from q8_gemm_min_rows() rows; cpu_q8_gemm.h): a task repacks its
// chunk of weight rows into panels once and passes all its activation rows
// over them.
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
#include "quant/cpu_q8_gemm.h"
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

// The continuing dot of a K-quant (KernelTable::dot_continue), or nullptr.
DotFn pick_dot_continue(Isa isa, GgmlType wt) {
    const int id = int(wt);
    if (id < 0 || id >= kTypeSlots) return nullptr;
    if (isa == Isa::Avx512 && avx512_table() && avx512_table()->dot_continue[id])
        return avx512_table()->dot_continue[id];
    if (isa >= Isa::Avx2 && avx2_table()) return avx2_table()->dot_continue[id];
    return nullptr;
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

void quantize_activation_row(Isa isa, ActFormat f, const float* x, uint8_t* dst, int64_t K) {
    switch (f) {
        case ActFormat::Q8_0: quantize_act_q8(x, reinterpret_cast<block_q8_0*>(dst), K); break;
        case ActFormat::Q8_1: quantize_act_q8(x, reinterpret_cast<block_q8_1*>(dst), K); break;
        case ActFormat::Q8_K:
            if (isa >= Isa::Avx2 && avx2_table() && avx2_table()->quantize_q8_K)
                avx2_table()->quantize_q8_K(x, reinterpret_cast<block_q8_K*>(dst), K);
            else
                quantize_ref_q8_K(x, reinterpret_cast<block_q8_K*>(dst), K);
            break;
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

// CPUID traps to the hypervisor on VMs (microseconds each), and cpu_matmul asks
// on every call: probe once (thread-safe static initialisation).
bool cpu_supports(Isa isa) {
    static const Isa supported = compiled_limit(hardware_isa());
    return isa <= supported;
}

std::vector<Isa> supported_isas() {
    std::vector<Isa> v;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
        if (cpu_supports(isa)) v.push_back(isa);
    return v;
}

Isa detected_isa() {
    static const Isa isa = [] {
        Isa best = Isa::Avx512;
        while (best > Isa::Scalar && !cpu_supports(best)) best = Isa(int(best) - 1);
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

namespace {

// A job's share of the region: nc weight rows x tc activation rows per task.
struct JobPlan {
    DotFn dot;
    DotFn dot_continue;  // decode of long K-quant rows: in chunks of super-blocks
    GemmKernel gemm;    // int8 tile kernel, when fn is set (then nc is a multiple of gemm.nr)
    size_t pb;          // gemm: panel bytes
    size_t wb;          // weight row bytes
    const uint8_t* A;   // its activations, quantized
    size_t ab;          // activation row bytes
    int64_t nc, tc, n_chunks, first_task;
    int64_t ahead;      // decode: rows between the one computed and the one prefetched
};

// Decode streams each thread's slice of weight rows from memory once. The
// hardware prefetchers alone leave a core waiting on DRAM; also asking for the
// row ~kPrefetchBytes ahead made qwen35-0.8B decode 10-20% faster on 1 and 2
// threads of the development VM (2 KiB ahead gained less; 5-18 KiB about alike).
constexpr size_t kPrefetchBytes = 16 << 10;

inline void prefetch(const void* p) {
#if defined(_MSC_VER) && !defined(__clang__)
#if defined(_M_X64)
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
#else
    (void)p;
#endif
#else
    __builtin_prefetch(p);
#endif
}

// Decode rows of at least kChunkMinBlocks super-blocks (K >= 6144, the FFN
// down projections) run a task's rows kChunkBlocks super-blocks at a time,
// round-robin. One pass per long row read 20-30% fewer bytes per second than
// rows of K = 2560; in chunks of 4 they read as fast (bench/results/
// cpu-kernels.md; chunks of 8 and 16 were slower, and chunking rows of K = 2560
// or 4096 made them slower). QINFER_CPU_CHUNK_ROWS=0 keeps one pass per row.
constexpr int64_t kChunkMinBlocks = 24;
constexpr int64_t kChunkBlocks = 4;

bool chunk_long_rows() {
    static const bool on = [] {
        const char* v = std::getenv("QINFER_CPU_CHUNK_ROWS");
        return !(v && std::string(v) == "0");
    }();
    return on;
}

// Below this many multiply-adds a whole group runs on the calling thread: a
// parallel region (wake, run, join) costs a few microseconds.
constexpr double kInlineWork = 1 << 16;

}  // namespace

DotFn check_job(Isa isa, const MatmulJob& jb, int64_t K, int64_t T) {
    if (!type_traits(uint32_t(jb.wt))) fail(strfmt("cpu_matmul: unknown tensor type id %u", unsigned(jb.wt)));
    const DotFn dot = pick_dot(isa, jb.wt);
    if (!dot) fail(strfmt("cpu_matmul: unsupported weight type %s", type_name(jb.wt)));
    const uint32_t bs = traits(jb.wt).block_size;
    if (K <= 0 || jb.N < 0 || T < 0 || K % bs != 0)
        fail(strfmt("cpu_matmul: bad shape K=%lld N=%lld T=%lld for %s (K must be a positive multiple of %u)",
                    (long long)K, (long long)jb.N, (long long)T, type_name(jb.wt), bs));
    if (jb.ldy < jb.N) fail(strfmt("cpu_matmul: output stride %lld < N=%lld", (long long)jb.ldy, (long long)jb.N));
    return dot;
}

void matmul_group_isa(Isa isa, const MatmulJob* jobs, size_t n_jobs, int64_t K, const float* x, int64_t T,
                      ThreadPool& pool, TilePath path) {
    if (!cpu_supports(isa)) fail(strfmt("cpu_matmul: this CPU or build does not support %s", isa_name(isa)));
    std::vector<JobPlan> plans(n_jobs);
    double work = 0;
    bool need[4] = {};
    for (size_t j = 0; j < n_jobs; ++j) {
        const MatmulJob& jb = jobs[j];
        plans[j].dot = check_job(isa, jb, K, T);
        plans[j].dot_continue =
            T == 1 && K % QK_K == 0 && K / QK_K >= kChunkMinBlocks && chunk_long_rows() ? pick_dot_continue(isa, jb.wt)
                                                                                        : nullptr;
        plans[j].gemm = {};
        // Decode (T = 1) never repacks: the dot kernels stream each weight once.
        const bool tile = path == TilePath::Gemm || (path == TilePath::Auto && isa >= Isa::Avx2 && T > 1 &&
                                                     T >= q8_gemm_min_rows(jb.wt));
        if (tile) plans[j].gemm = pick_gemm(isa, jb.wt);
        need[int(act_format(jb.wt))] = true;
        work += double(jb.N) * double(K) * double(T);
    }
    if (T == 0 || work == 0) return;

    // 1. Activations -> 8-bit blocks, once per format for the whole group (f32
    //    weights use x as is).
    thread_local std::vector<uint8_t> act_buf[4];
    const uint8_t* act[4] = {reinterpret_cast<const uint8_t*>(x), nullptr, nullptr, nullptr};
    for (int f = 1; f < 4; ++f) {
        if (!need[f]) continue;
        const ActFormat af = ActFormat(f);
        const size_t ab = act_row_bytes(af, K);
        std::vector<uint8_t>& buf = act_buf[f];
        if (buf.size() < ab * size_t(T)) buf.resize(ab * size_t(T));
        uint8_t* dst = buf.data();
        if (T >= 4 && pool.size() > 1)
            pool.parallel_for(T, [&](int64_t t, int) { quantize_activation_row(isa, af, x + t * K, dst + t * ab, K); });
        else
            for (int64_t t = 0; t < T; ++t) quantize_activation_row(isa, af, x + t * K, dst + t * ab, K);
        act[f] = dst;
    }

    // 2. Tasks, numbered job after job. Decode (T == 1) streams the weights:
    //    tasks of ~16 KiB of consecutive rows, and the pool hands every thread a
    //    contiguous run of them. Prefill: each task's weights and activations
    //    fit in L2 (~256 KiB each).
    const int64_t threads = pool.size();
    int64_t n_tasks = 0;
    for (size_t j = 0; j < n_jobs; ++j) {
        const MatmulJob& jb = jobs[j];
        JobPlan& p = plans[j];
        const ActFormat af = act_format(jb.wt);
        p.wb = row_bytes(jb.wt, K);
        p.ab = act_row_bytes(af, K);
        p.A = act[int(af)];
        p.ahead = int64_t(std::max<size_t>(1, kPrefetchBytes / p.wb));
        if (p.gemm.fn) {
            // A task packs a chunk of weight rows into panels (~128 KiB, in L2)
            // once and runs all its activation rows over them, mr at a time
            // (those stay in L1). Split the rows only when the chunks are too
            // few for the threads: every split packs the chunk again.
            const int64_t nr = p.gemm.nr, mr = p.gemm.mr;
            p.pb = q8_panel_bytes(jb.wt, K, int(nr));
            p.nc = std::max<int64_t>(1, int64_t((128 << 10) / p.pb)) * nr;
            while (p.nc > nr && (jb.N + p.nc - 1) / p.nc < threads * 4) p.nc = std::max(nr, p.nc / 2 / nr * nr);
            p.tc = T;
            const int64_t n_chunks = (jb.N + p.nc - 1) / p.nc;
            while (p.tc > 4 * mr && n_chunks * ((T + p.tc - 1) / p.tc) < threads * 4)
                p.tc = ((p.tc + 1) / 2 + mr - 1) / mr * mr;
        } else if (T == 1) {
            p.nc = clamp64(int64_t((16 << 10) / p.wb), 1, 256);
            p.tc = 1;
        } else {
            p.nc = clamp64(int64_t((256 << 10) / p.wb), 4, 256);
            p.tc = clamp64(int64_t((256 << 10) / p.ab), kMaxTile, 256) / kMaxTile * kMaxTile;
            // Small N (e.g. DeltaNet gates): split the activation rows more finely.
            const int64_t n_chunks = (jb.N + p.nc - 1) / p.nc;
            while (p.tc > kMaxTile && n_chunks * ((T + p.tc - 1) / p.tc) < threads * 4)
                p.tc = std::max<int64_t>(kMaxTile, p.tc / 2);
        }
        p.n_chunks = (jb.N + p.nc - 1) / p.nc;
        p.first_task = n_tasks;
        n_tasks += p.n_chunks * ((T + p.tc - 1) / p.tc);
    }
    auto run_task = [&](int64_t task, int) {
        size_t j = 0;
        while (j + 1 < n_jobs && plans[j + 1].first_task <= task) ++j;
        const MatmulJob& jb = jobs[j];
        const JobPlan& p = plans[j];
        const int64_t local = task - p.first_task;
        const int64_t o0 = (local % p.n_chunks) * p.nc, o1 = std::min(jb.N, o0 + p.nc);
        const int64_t t0 = (local / p.n_chunks) * p.tc, t1 = std::min(T, t0 + p.tc);
        const uint8_t* Wb = static_cast<const uint8_t*>(jb.W);
        if (p.gemm.fn) {
            const int nr = p.gemm.nr;
            const int64_t n_panels = (o1 - o0 + nr - 1) / nr;
            thread_local std::vector<uint8_t> panels;
            if (panels.size() < size_t(n_panels) * p.pb) panels.resize(size_t(n_panels) * p.pb);
            for (int64_t q = 0; q < n_panels; ++q) {
                const int64_t o = o0 + q * nr;
                const int n = int(std::min<int64_t>(nr, o1 - o));
                uint8_t* panel = panels.data() + size_t(q) * p.pb;
                if (p.gemm.pack) p.gemm.pack(Wb + size_t(o) * p.wb, p.wb, n, K, panel);
                else q8_pack_panel(jb.wt, Wb + size_t(o) * p.wb, p.wb, n, nr, K, panel);
            }
            for (int64_t t = t0; t < t1; t += p.gemm.mr) {
                const int R = int(std::min<int64_t>(p.gemm.mr, t1 - t));
                for (int64_t q = 0; q < n_panels; ++q) {
                    const int64_t o = o0 + q * nr;
                    p.gemm.fn(K, panels.data() + size_t(q) * p.pb, p.A + size_t(t) * p.ab, p.ab, R,
                              jb.y + t * jb.ldy + o, jb.ldy, int(std::min<int64_t>(nr, o1 - o)));
                }
            }
            return;
        }
        if (p.dot_continue) {  // T == 1, long K-quant rows (see kChunkBlocks)
            const int64_t n_blocks = K / QK_K;
            const size_t wbb = p.wb / size_t(n_blocks), abb = p.ab / size_t(n_blocks);
            const int64_t next = o1 - o0;  // the rows of the next task, likely this thread's: prefetched
            for (int64_t o = o0; o < o1; ++o) jb.y[o] = 0.f;
            for (int64_t c0 = 0; c0 < n_blocks; c0 += kChunkBlocks) {
                const int64_t cb = std::min(kChunkBlocks, n_blocks - c0);
                for (int64_t o = o0; o < o1; ++o) {
                    if (o + next < jb.N) {
                        const uint8_t* ahead = Wb + size_t(o + next) * p.wb + size_t(c0) * wbb;
                        for (size_t b = 0; b < size_t(cb) * wbb; b += 64) prefetch(ahead + b);
                    }
                    p.dot_continue(cb * QK_K, Wb + size_t(o) * p.wb + size_t(c0) * wbb, p.A + size_t(c0) * abb, p.ab,
                                   1, jb.y + o, jb.ldy);
                }
            }
            return;
        }
        for (int64_t t = t0; t < t1; t += kMaxTile) {
            const int R = int(std::min<int64_t>(kMaxTile, t1 - t));
            for (int64_t o = o0; o < o1; ++o) {
                if (T == 1 && o + p.ahead < jb.N) {
                    const uint8_t* next = Wb + size_t(o + p.ahead) * p.wb;
                    for (size_t b = 0; b < p.wb; b += 64) prefetch(next + b);
                }
                p.dot(K, Wb + size_t(o) * p.wb, p.A + size_t(t) * p.ab, p.ab, R, jb.y + t * jb.ldy + o, jb.ldy);
            }
        }
    };
    if (work < kInlineWork || threads == 1) {
        for (int64_t i = 0; i < n_tasks; ++i) run_task(i, 0);
        return;
    }
    pool.parallel_for(n_tasks, run_task);
}

void matmul_isa(Isa isa, GgmlType wt, const void* W, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                int64_t ldy, ThreadPool& pool, TilePath path) {
    const MatmulJob job{wt, W, N, y, ldy};
    matmul_group_isa(isa, &job, 1, K, x, T, pool, path);
}

}  // namespace qinfer::kernels

namespace qinfer {

void cpu_matmul(GgmlType wt, const void* W, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                int64_t ldy, ThreadPool& pool) {
    kernels::matmul_isa(kernels::detected_isa(), wt, W, K, N, x, T, y, ldy, pool);
}

void cpu_matmul_check(GgmlType wt, int64_t K, int64_t N, int64_t ldy) {
    const MatmulJob job{wt, nullptr, N, nullptr, ldy};
    kernels::check_job(kernels::detected_isa(), job, K, 0);
}

void cpu_matmul_group(const MatmulJob* jobs, size_t n_jobs, int64_t K, const float* x, int64_t T, ThreadPool& pool) {
    kernels::matmul_group_isa(kernels::detected_isa(), jobs, n_jobs, K, x, T, pool);
}

const char* cpu_kernel_isa() { return kernels::isa_name(kernels::detected_isa()); }

}  // namespace qinfer
