// Causal GQA attention over the KV cache (spec/models.md §2.4): f32 scores and
// softmax whatever the cache type, as the CPU backend.
//
// Decode (few tokens): one block per (kv head, token, split of the key range)
// serves all query heads of the group, so every cached K/V byte is read once
// per token; long contexts are split over the key range (flash-decoding) and
// the partial softmax states are merged by a second kernel. The number of
// splits launched depends only on the cache capacity and the device, never on
// the current length, so a captured decode step stays valid as the context
// grows: both kernels read the length (pos) on the device and use only the first
// ceil(n / chunk) splits, chunk = n / splits rounded up to ATTN_SPLIT_ALIGN
// keys. The others exit at once, and when one split covers the context it
// writes the output itself and the merge kernel exits at once too: a 5-key
// context costs one block per kv head and a few memory round trips, whatever
// the capacity.
#include <algorithm>
#include <atomic>

#include "common/env.h"
#include "common/error.h"
#include "runtime/cuda/act_quant.cuh"
#include "runtime/cuda/attention_impl.cuh"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

namespace {

// One thread per 8 values of the step's K or V row of one (token = blockIdx.y,
// kv head): whole warps, since a q8_0 block is 4 lanes' shuffles (d % 32 == 0,
// so no block straddles K and V). type as store_cache8 takes it.
__global__ void kv_store_kernel(Rows k, Rows v, unsigned char* __restrict__ K, unsigned char* __restrict__ V, int type,
                                int64_t d, int64_t n_kv, int64_t n_ctx, const int32_t* __restrict__ pos,
                                const int32_t* __restrict__ slot) {
    pdl_enter();
    const int64_t t = blockIdx.y;
    const int64_t per_head = d / 8, per_side = n_kv * per_head;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const bool live = i < 2 * per_side;
    const int64_t j = live ? i % per_side : 0;
    const bool is_v = live && i >= per_side;
    const int64_t g = j / per_head, k0 = (j % per_head) * 8;
    const Rows& r = is_v ? v : k;
    const float* src = r.data + g * r.s1 + t * r.s2 + k0;
    float x[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = src[e];
    const int64_t row = (int64_t(slot[t]) * n_ctx + pos[t]) * n_kv + g;
    store_cache8(is_v ? V : K, type, row, d, k0, x, live);
}

// A decode step's merge of the splits and the quantization of its output for
// the next product in one launch (attention's `quant`): one block per (256-value
// span of a token's n_head * D outputs, token). Four groups of ATTN_THREADS
// threads each merge 64 columns as attn_combine_kernel does (same sums, same
// bits) and write out; then the first warp quantizes the span as quantize_act
// does, or (GATED) as gate_quant_kernel does with y = out * sigmoid(b). When one
// split covered the context the split kernel wrote out, and the block only
// quantizes.
template <int D, int QK, bool GATED>
__global__ void __launch_bounds__(4 * ATTN_THREADS)
    attn_combine_quant_kernel(const float* __restrict__ work, int ns, const int32_t* __restrict__ pos,
                              float* __restrict__ out, int n_head, Rows b, Rows y, ActOutPtrs q) {
    pdl_trigger_small(2);
    pdl_wait_inputs();
    constexpr int SPAN = 256, G = SPAN / ATTN_COMBINE_COLS;
    __shared__ AttnCombineSmem sm[G];
    __shared__ float vals[SPAN];
    const int64_t K = int64_t(n_head) * D;
    const int t = blockIdx.y;
    const int64_t k0 = int64_t(blockIdx.x) * SPAN;
    float* orow = out + int64_t(t) * K;
    const int nu = attn_splits_used(pos[t] + 1, ns);
    if (nu > 1) {  // block-uniform
        const int grp = threadIdx.x / ATTN_THREADS, gtid = threadIdx.x % ATTN_THREADS;
        const int64_t kg = k0 + grp * ATTN_COMBINE_COLS;
        const bool live = kg < K;  // a group past the row still joins the barriers
        const int h = live ? int(kg / D) : 0, c0 = live ? int(kg % D) : 0;
        const float* w = work + (int64_t(t) * n_head + h) * ns * (D + ATTN_PART_HDR);
        const float4 r = attn_combine_cols<D>(w, nu, c0, gtid, sm[grp]);
        if (live && gtid < AttnCombineSmem::CQ) {
            const int e = grp * ATTN_COMBINE_COLS + gtid * 4;
            const float rv[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                orow[k0 + e + i] = rv[i];
                vals[e + i] = rv[i];
            }
        }
        __syncthreads();
    }
    if (threadIdx.x >= WARP) return;
    const int lane = threadIdx.x;
    const int64_t k = k0 + 8 * lane;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (k < K) {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = nu > 1 ? vals[8 * lane + i] : orow[k + i];
        if constexpr (GATED) gate8(v, b, y, int64_t(t) * (K / b.n) + k / b.n, k % b.n, SigmoidGate{});
    }
    quantize_span<QK>(v, lane, q, t, K, k0, true);
}

template <int D, bool GATED>
void launch_combine_quant(const AttnQuant& e, dim3 grid, const float* work, int ns, const int32_t* pos, float* out,
                          int n_head, cudaStream_t s) {
    const ActOutPtrs o = act_out(e.q);
    const dim3 block(4 * ATTN_THREADS);
    switch (qk_of(e.q.kind)) {
        case 1: launch("attn_combine_quant_kernel", attn_combine_quant_kernel<D, 1, GATED>, grid, block, 0, s, work,
                       ns, pos, out, n_head, e.b, e.y, o); break;
        case 2: launch("attn_combine_quant_kernel", attn_combine_quant_kernel<D, 2, GATED>, grid, block, 0, s, work,
                       ns, pos, out, n_head, e.b, e.y, o); break;
        default: launch("attn_combine_quant_kernel", attn_combine_quant_kernel<D, 3, GATED>, grid, block, 0, s, work,
                        ns, pos, out, n_head, e.b, e.y, o); break;
    }
}

template <int D>
void combine_quant(const AttnQuant& e, dim3 grid, const float* work, int ns, const int32_t* pos, float* out,
                   int n_head, cudaStream_t s) {
    if (e.gated) launch_combine_quant<D, true>(e, grid, work, ns, pos, out, n_head, s);
    else launch_combine_quant<D, false>(e, grid, work, ns, pos, out, n_head, s);
}

}  // namespace

bool attention_quantize_fits(const AttnQuant& e, const float* out, int64_t n_head, int64_t d, int64_t T) {
    const int64_t K = n_head * d;
    const ActDest& q = e.q;
    if (!qk_of(q.kind) || q.K != K || q.T != T || !whole_blocks(q)) return false;
    if (!e.gated) return q.x == out && (T == 1 || q.ldx == K);
    // a (the gate's input) must read out's rows as the kernel does: element k of token t at out + t K + k
    const ActDest out_rows{q.kind, out, K, K, T, nullptr};
    return e.a.n > 0 && K % e.a.n == 0 && rows_are_act_input(e.a, out_rows, K / e.a.n) &&
           gate_quantize_fits(e.a, e.b, e.y, q);
}

void kv_store(Rows k, Rows v, const KvView& kv, const int32_t* pos, const int32_t* slot, int64_t T, cudaStream_t s) {
    if (T == 0) return;
    const int type = kv_cache_code(kv.type);
    if (type < 0) fail(strfmt("CUDA kv_store: cache type %s not supported", type_name(kv.type)));
    if (kv.d % 32 != 0) fail(strfmt("CUDA kv_store: head dim %lld is not a multiple of 32", (long long)kv.d));
    const dim3 grid(unsigned(ceil_div(2 * kv.n_kv * (kv.d / 8), 256)), unsigned(T));
    launch("kv_store_kernel", kv_store_kernel, grid, dim3(256), 0, s, k, v, static_cast<unsigned char*>(kv.k),
           static_cast<unsigned char*>(kv.v), type, kv.d, kv.n_kv, kv.n_ctx, pos, slot);
    QINFER_CUDA_LAUNCHED("kv_store");
}

// Decode steps -- up to this many tokens, no sequence with more than 4 of them
// (every decode batch of the server) -- take the split
// kernel; prompts one pass over the keys per token. The split structure
// depends only on the cache capacity, so a decode token's result is the same
// whatever else is in its batch (when only steps of up to 4 tokens split,
// greedy server completions depended on how requests were batched). A step
// that mixes a prompt chunk with decode tokens still takes one pass.
// QINFER_CUDA_ATTN_SPLIT_T overrides the token limit (A/B).
constexpr int kSplitMaxTokens = kAttnSplitMaxTokens;
constexpr int kSplitMaxSegment = kAttnSplitMaxSegment;
constexpr int kPrefillMinSegment = 128;
std::atomic<int> g_split_max_override{0};

int split_max_tokens() {
    if (const int forced = g_split_max_override.load(std::memory_order_relaxed)) return forced;
    static const int from_env = env_int("QINFER_CUDA_ATTN_SPLIT_T", 1, 1024, kSplitMaxTokens);
    return from_env;
}

void set_attention_split_max_tokens(int t) {
    g_split_max_override.store(t >= 1 && t <= 1024 ? t : 0, std::memory_order_relaxed);
}

// Splits of the key range launched for decode: enough blocks to keep every SM
// streaming K/V at long contexts (a split covers >= ATTN_SPLIT_ALIGN keys of
// the capacity, at most 128 splits); those past a short context exit at once.
// QINFER_CUDA_ATTN_SPLITS lowers the maximum (A/B).
int attention_splits(int64_t T, int64_t max_ctx, int max_seg_len) {
    if (T > split_max_tokens() || max_seg_len > kSplitMaxSegment) return 1;
    static const int max_splits = env_int("QINFER_CUDA_ATTN_SPLITS", 1, ATTN_MAX_SPLITS, ATTN_MAX_SPLITS);
    const int64_t n = (max_ctx + ATTN_SPLIT_ALIGN - 1) / ATTN_SPLIT_ALIGN;
    return n < 1 ? 1 : (n > max_splits ? max_splits : int(n));
}

size_t attention_work_bytes(int64_t T, int64_t n_head, int64_t d, int64_t max_ctx, int max_seg_len) {
    const int ns = attention_splits(T, max_ctx, max_seg_len);
    if (ns == 1) return 0;
    return size_t(T) * size_t(n_head) * size_t(ns) * size_t(d + ATTN_PART_HDR) * sizeof(float);
}

namespace {

// An f16 cache takes the tensor-core split kernel; QINFER_CUDA_ATTN_MMA=0
// keeps the CUDA-core one (A/B; an f32 cache always takes it, a q8_0 cache
// always the tensor cores).
bool split_on_tensor_cores() {
    static const bool on = env_int("QINFER_CUDA_ATTN_MMA", 0, 1, 1) != 0;
    return on;
}

// Warps per block of the q8_0 split kernel: 8 (q in shared memory) where the
// head dim gives each warp a 16-column tile, else 4. QINFER_CUDA_ATTN_Q8_WARPS=4
// keeps 4 (A/B).
int q8_split_warps(int d) {
    static const int forced = env_int("QINFER_CUDA_ATTN_Q8_WARPS", 4, 8, 8);
    if (forced != 4 && forced != 8) fail("QINFER_CUDA_ATTN_Q8_WARPS takes 4 or 8");
    return d >= 128 ? forced : 4;
}

// The split kernel for a cache type, its block size and dynamic shared memory.
struct SplitKernel {
    void (*fn)(AttnArgs);
    int threads;
    size_t smem;
};
template <int D, int GT> SplitKernel split_kernel(GgmlType type) {
    switch (type) {
        case GgmlType::F32: return {attn_split_kernel<D, GT, float>, ATTN_THREADS, attn_smem_bytes<D, float>()};
        case GgmlType::F16:
            if (split_on_tensor_cores())
                return {attn_split_mma_kernel<D, GT, MmaKvF16<D>, 4>, ATTN_THREADS, 2 * size_t(MmaKvF16<D>::TILE)};
            return {attn_split_kernel<D, GT, __half>, ATTN_THREADS, attn_smem_bytes<D, __half>()};
        case GgmlType::Q8_0:
            if constexpr (D >= 128) {
                if (q8_split_warps(D) == 8)
                    return {attn_split_mma_kernel<D, GT, MmaKvQ8<D>, 8>, 8 * 32,
                            2 * size_t(MmaKvQ8<D>::TILE) + QFrags<true, D / 16, GT>::BYTES};
            }
            return {attn_split_mma_kernel<D, GT, MmaKvQ8<D>, 4>, ATTN_THREADS, 2 * size_t(MmaKvQ8<D>::TILE)};
        default: fail(strfmt("CUDA attention: cache type %s not supported", type_name(type)));
    }
}

// Launches the split kernel over at most ns_cap splits and returns the number
// launched: no more than one wave of blocks per token (the kernel's resident
// blocks on this device over the kv heads), since a second, partial wave of
// the longest splits sets the time (d 256 at 32k keys on an H200: 3 blocks per
// SM, 396 at once; 512 blocks took 51.6 us, 384 took 46.7). The count depends
// on the device and the cache capacity, never on the length or the batch.
template <int D, int GT>
int launch_split(GgmlType type, AttnArgs a, int T, int n_kv, int ns_cap, cudaStream_t s) {
    const SplitKernel k = split_kernel<D, GT>(type);
    allow_dynamic_smem(k.fn, k.smem);  // K/V tiles above the 48 KB default
    int ns = ns_cap;
    if (ns > 1) {
        const Residency r = residency(k.fn, k.threads, k.smem);
        ns = std::clamp(std::max(1, r.per_sm * r.sms) / n_kv, 1, ns_cap);
    }
    a.n_split = ns;
    const dim3 grid(static_cast<unsigned>(n_kv), unsigned(T), unsigned(ns));
    launch("attn_split_kernel", k.fn, dim3(grid), dim3(k.threads), k.smem, s, a);
    return ns;
}

template <int D>
int launch_d(GgmlType type, const AttnArgs& a, int T, int n_kv, int ns, cudaStream_t s) {
    if (a.group <= 1) return launch_split<D, 1>(type, a, T, n_kv, ns, s);
    if (a.group <= 2) return launch_split<D, 2>(type, a, T, n_kv, ns, s);
    if (a.group <= 4) return launch_split<D, 4>(type, a, T, n_kv, ns, s);
    if (a.group <= 8) return launch_split<D, 8>(type, a, T, n_kv, ns, s);
    fail(strfmt("CUDA attention: %d query heads per kv head not supported (max 8)", a.group));
}

}  // namespace

bool attention(Rows q, const KvView& kv, const int32_t* pos, const int32_t* slot, int64_t T, float scale, float* out,
               void* work, int max_seg_len, cudaStream_t s, const Segment* seg, int n_seg, int fresh,
               const AttnQuant* quant) {
    if (T == 0) return false;
    // Steps with a prompt chunk of kPrefillMinSegment tokens or more: the
    // tensor-core kernel where it applies (QINFER_CUDA_ATTN_PREFILL=0: the
    // one-pass kernel below). Its f16 q and probabilities move a token's output
    // by ~1e-3 relative, so short prompts keep the one-pass kernel's f32 scores
    // and equal token-by-token decode within the 8-bit activation roundings.
    static const bool tiled_prefill = env_int("QINFER_CUDA_ATTN_PREFILL", 0, 1, 1) != 0;
    if (tiled_prefill && seg && n_seg > 0 && max_seg_len >= kPrefillMinSegment &&
        attention_prefill(q, kv, seg, n_seg, T, scale, out, s))
        return false;
    const int64_t n_head = q.n1;
    if (n_head % kv.n_kv != 0 || q.n != kv.d)
        fail(strfmt("CUDA attention: %lld query heads of %lld vs %lld kv heads of %lld", (long long)n_head,
                    (long long)q.n, (long long)kv.n_kv, (long long)kv.d));
    AttnArgs a;
    a.q = q.data;
    a.q_h = q.s1;
    a.q_t = q.s2;
    a.K = kv.k;
    a.V = kv.v;
    a.n_kv = int(kv.n_kv);
    a.n_ctx = kv.n_ctx;
    a.group = int(n_head / kv.n_kv);
    a.pos = pos;
    a.slot = slot;
    a.scale = scale;
    a.out = out;
    a.work = static_cast<float*>(work);
    a.fresh = fresh;
    static const int trigger_late = env_int("QINFER_CUDA_ATTN_LATE_TRIGGER", 0, 1, 1);
    a.trigger_late = trigger_late;
    // the work buffer is sized for attention_splits(); the launch may use fewer
    const int ns_cap = attention_splits(T, kv.n_ctx, max_seg_len);
    if (ns_cap > 1 && !work) fail("CUDA attention: no work buffer for split attention");
    const int n_kv = int(kv.n_kv);
    int ns = 1;
    switch (kv.d) {
        case 64: ns = launch_d<64>(kv.type, a, int(T), n_kv, ns_cap, s); break;
        case 128: ns = launch_d<128>(kv.type, a, int(T), n_kv, ns_cap, s); break;
        case 256: ns = launch_d<256>(kv.type, a, int(T), n_kv, ns_cap, s); break;
        default: fail(strfmt("CUDA attention: head dim %lld not supported (64, 128, 256)", (long long)kv.d));
    }
    QINFER_CUDA_LAUNCHED("attention");
    if (ns > 1 && quant && attention_quantize_fits(*quant, out, n_head, kv.d, T)) {
        const dim3 grid(unsigned(ceil_div(n_head * kv.d, 256)), unsigned(T));
        switch (kv.d) {
            case 64: combine_quant<64>(*quant, grid, a.work, ns, pos, out, int(n_head), s); break;
            case 128: combine_quant<128>(*quant, grid, a.work, ns, pos, out, int(n_head), s); break;
            default: combine_quant<256>(*quant, grid, a.work, ns, pos, out, int(n_head), s); break;
        }
        QINFER_CUDA_LAUNCHED("attention combine + quantize");
        return true;
    }
    if (ns > 1) {
        const dim3 grid(static_cast<unsigned>(n_head), unsigned(T), unsigned(kv.d / ATTN_COMBINE_COLS));
        switch (kv.d) {
            case 64: launch("attn_combine_kernel", attn_combine_kernel<64>, dim3(grid), dim3(ATTN_THREADS), 0, s,
                    a.work, ns, pos, out); break;
            case 128: launch("attn_combine_kernel", attn_combine_kernel<128>, dim3(grid), dim3(ATTN_THREADS), 0, s,
                    a.work, ns, pos, out); break;
            default: launch("attn_combine_kernel", attn_combine_kernel<256>, dim3(grid), dim3(ATTN_THREADS), 0, s,
                    a.work, ns, pos, out); break;
        }
        QINFER_CUDA_LAUNCHED("attention combine");
    }
    return false;
}

}  // namespace qinfer::cuda
