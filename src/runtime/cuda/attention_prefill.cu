// Prompt attention on the tensor cores (flash-attention 2 with GQA packing).
//
// The one-pass kernel of attention.cu reads all keys of a token for every
// token: a 512-token chunk of a 4096-token prompt re-reads ~2 GB of K/V per
// layer on CUDA cores. Here a block owns one kv head and a tile of consecutive
// tokens of one segment (a contiguous run of one sequence in the step). Its
// M = 64 query rows are (token, head of the group) pairs -- 64 / group tokens
// times the group's heads, row r = token r / G, head r % G -- so every K/V
// tile staged in shared memory serves all of them. 4 warps own 16 rows each.
//
// Per tile of BK keys (streamed with cp.async, double-buffered so that the
// next tile loads while this one computes; a q8_0 cache's rows are dequantized
// to f16 on their way into the tile, see load_kv_tile):
//   S = Q K^T          mma.sync m16n8k16, f16 inputs, f32 accumulators
//   online softmax     per row in f32 registers (running max and sum), in the
//                      log2 domain (scale * log2(e) folded into Q); causal
//                      mask key > position of the row's token -> -inf
//   O += P V           P rounded to f16 in registers (the S accumulator
//                      layout is the A-fragment layout), V fragments by
//                      ldmatrix.trans; O in f32 registers
// and O / sum is written as f32 at the end. The row sum adds the f16-rounded
// P that O received, so the result is an exact weighted mean of V rows.
//
// Only key tiles up to the tile's last token position are visited; keys past
// it in the last tile are zero-filled (the cache may hold anything there), keys
// between a row's position and the tile's end are masked. Key 0 is in the first
// tile and visible to every row, so every running max is finite after it.
// Rows past the segment end compute a copy of the last token and are not
// written.
//
// Shared memory: Q 64 x D and two stages of K and V (BK x D each), f16, rows
// of 16-byte chunks stored at chunk ^ (row % 8), so the 8 rows an ldmatrix
// phase reads lie in 8 different bank groups without padding. D = 256 takes
// BK = 32: 32 KB + 64 KB = 96 KB (fits sm_86 / sm_89's 99 KB); Q stays in
// shared memory because O alone is 128 registers per thread there.
//
// sm_80+ only (mma.sync, ldmatrix, cp.async); no Hopper-only instructions, so
// the compute_80 PTX runs on RTX 30xx / 40xx.

#include "common/error.h"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/tensor_core.cuh"

namespace qinfer::cuda {

namespace {

constexpr int PF_THREADS = 128;  // 4 warps
constexpr int PF_ROWS = 64;      // query rows per block: (token, head) pairs
constexpr int PF_WARP_ROWS = 16;

// Keys per shared-memory tile: 96 KB in all for D = 256, 48 KB for 128, 40 KB for 64.
template <int D> constexpr int prefill_bk() { return D == 64 ? 64 : 32; }
template <int D> constexpr size_t prefill_smem_bytes() {
    return size_t(PF_ROWS + 4 * prefill_bk<D>()) * D * sizeof(__half);
}

struct PrefillArgs {
    const float* q;          // row of (token t, head h) at q + t*q_t + h*q_h
    int64_t q_h, q_t;
    const unsigned char* K;  // {d, n_kv, n_ctx, n_slots}: f16, or q8_0 rows of d / 32 GGUF blocks
    const unsigned char* V;
    bool q8;
    int n_kv, n_head;
    int64_t n_ctx;
    const Segment* seg;      // device
    int n_seg;
    float q_scale;           // scale * log2(e): scores in the log2 domain
    float* out;              // [T][n_head][d]
};

// Bytes of one kv head's row in the cache.
template <int D> __host__ __device__ constexpr int64_t prefill_row_bytes(bool q8) { return q8 ? D / 32 * 34 : D * 2; }

// Eight values of a q8_0 block (part 0..3 of its 32) as f16 d x q: the
// product is exact in f32 (11 + 7 bits), so each value is the dequantized
// cache value rounded once to f16, as an f16 cache would hold it.
__device__ __forceinline__ uint4 q8_0_part_to_f16(const unsigned char* block, int part) {
    const float d = __half2float(*reinterpret_cast<const __half*>(block));
    const uint16_t* qs = reinterpret_cast<const uint16_t*>(block + 2 + 8 * part);  // 2-byte aligned
    uint32_t h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint16_t two = qs[i];
        const __half2 v = __floats2half2_rn(d * float(int8_t(two & 0xFF)), d * float(int8_t(two >> 8)));
        h[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
    return make_uint4(h[0], h[1], h[2], h[3]);
}

// Keys [key0, key0 + BK) of the block's kv head into one stage (Kb, Vb: key
// 0's row; row_stride bytes apart); rows at or past kv_end are zero-filled.
// f16 rows go by cp.async. q8_0 rows are dequantized on the way with plain
// loads (their values are only 2-byte aligned, too little for cp.async); the
// stage is read after the same wait and barrier, and the 64 query rows of the
// block share each tile, so the loads' latency is paid once per tile.
template <int D, int BK, bool Q8>
__device__ __forceinline__ void load_kv_tile(__half* ks, __half* vs, const unsigned char* Kb, const unsigned char* Vb,
                                             int64_t row_stride, int key0, int kv_end) {
    constexpr int CPR = D / 8;  // 16-byte chunks of the f16 row (8 values)
    static_assert(BK * CPR % PF_THREADS == 0, "whole rounds of copies");
#pragma unroll
    for (int it = 0; it < BK * CPR / PF_THREADS; ++it) {
        const int i = it * PF_THREADS + int(threadIdx.x);
        const int r = i / CPR, c = i % CPR;  // a warp copies whole rows: coalesced
        const bool valid = key0 + r < kv_end;
        const int64_t row = int64_t(valid ? key0 + r : key0) * row_stride;
        if constexpr (!Q8) {
            cp_async16(ks + swz<D>(r, c), Kb + row + c * 16, valid);
            cp_async16(vs + swz<D>(r, c), Vb + row + c * 16, valid);
        } else {
            const int64_t block = row + (c / 4) * 34;
            const uint4 zero = make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(ks + swz<D>(r, c)) = valid ? q8_0_part_to_f16(Kb + block, c % 4) : zero;
            *reinterpret_cast<uint4*>(vs + swz<D>(r, c)) = valid ? q8_0_part_to_f16(Vb + block, c % 4) : zero;
        }
    }
}

// (Q8: a q8_0 cache; its own instantiation, so that the f16 kernel's registers
// do not pay for the dequantizing loader.)
template <int D, int G, bool Q8>
__global__ void __launch_bounds__(PF_THREADS) attn_prefill_kernel(PrefillArgs a) {
    constexpr int BK = prefill_bk<D>();
    constexpr int TOK = PF_ROWS / G;   // tokens per block
    constexpr int NS = BK / 8;         // n8 score tiles per key tile
    constexpr int NO = D / 8;          // n8 output tiles
    static_assert(D % 64 == 0 && BK % 16 == 0 && PF_ROWS % G == 0 && PF_WARP_ROWS % G == 0, "prefill shape");

    extern __shared__ __align__(128) unsigned char smem_raw[];
    // Q [PF_ROWS][D], then K stage 0, K stage 1, V stage 0, V stage 1 ([BK][D] each)
    __half* qs = reinterpret_cast<__half*>(smem_raw);
    auto k_stage = [&](int st) { return qs + (PF_ROWS + st * BK) * D; };
    auto v_stage = [&](int st) { return qs + (PF_ROWS + (2 + st) * BK) * D; };

    pdl_enter();  // q, the segments and the step's own keys come from earlier kernels

    // This block's (segment, tile): blocks are numbered from the end, so the
    // tiles with the most keys (the last of a segment) start first. The grid
    // has n_seg spare tiles for partial ones; blocks past the work exit.
    int b = int(gridDim.y) - 1 - int(blockIdx.y);
    int si = 0;
    for (; si < a.n_seg; ++si) {
        const int tiles = (a.seg[si].count + TOK - 1) / TOK;
        if (b < tiles) break;
        b -= tiles;
    }
    if (si == a.n_seg) return;
    const Segment sg = a.seg[si];
    const int i0 = b * TOK;                        // first token of the tile within the segment
    const int ntok = min(TOK, sg.count - i0);
    const int64_t tok0 = int64_t(sg.first) + i0;   // its index in the step
    const int pos_first = sg.pos0 + i0;
    const int kv_end = pos_first + ntok;           // keys [0, kv_end) are visited
    const int g = blockIdx.x;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;

    const int64_t head_row = prefill_row_bytes<D>(Q8), row_stride = int64_t(a.n_kv) * head_row;
    const unsigned char* Kb = a.K + (int64_t(sg.slot) * a.n_ctx * a.n_kv + g) * head_row;
    const unsigned char* Vb = a.V + (int64_t(sg.slot) * a.n_ctx * a.n_kv + g) * head_row;
    const int n_tiles = (kv_end + BK - 1) / BK;

    load_kv_tile<D, BK, Q8>(k_stage(0), v_stage(0), Kb, Vb, row_stride, 0, kv_end);
    cp_async_commit();

    // Q (scaled, f16), while the first tile loads. Rows past the segment end are zero.
    for (int i = tid; i < PF_ROWS * (D / 8); i += PF_THREADS) {
        const int r = i / (D / 8), c = i % (D / 8);
        const int tt = r / G, hh = r % G;
        float x[8];
        if (tt < ntok) {
            const float* src = a.q + (tok0 + tt) * a.q_t + int64_t(g * G + hh) * a.q_h + c * 8;
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = src[e] * a.q_scale;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = 0.f;
        }
        uint4 h;
        h.x = pack_half2(x[0], x[1]);
        h.y = pack_half2(x[2], x[3]);
        h.z = pack_half2(x[4], x[5]);
        h.w = pack_half2(x[6], x[7]);
        *reinterpret_cast<uint4*>(qs + swz<D>(r, c)) = h;
    }

    // Fragment coordinates (PTX m16n8k16): lane = 4 * group + quad; this thread
    // holds accumulator rows `group` and `group + 8` of its warp's 16, columns
    // 2 * quad and 2 * quad + 1 of every n8 tile.
    const int group = lane / 4, quad = lane % 4;
    const int row_lo = warp * PF_WARP_ROWS + group, row_hi = row_lo + 8;
    // A row's key limit: its token's position (rows past the segment copy the last token).
    const int pos_lo = pos_first + min(row_lo / G, ntok - 1);
    const int pos_hi = pos_first + min(row_hi / G, ntok - 1);
    const int warp_pos_max = pos_first + min((warp * PF_WARP_ROWS + PF_WARP_ROWS - 1) / G, ntok - 1);

    // ldmatrix addresses. Every row a lane addresses is = lane (mod 8), so its
    // swizzled chunk is c ^ (lane % 8); for c = 8 u + 2 j + x (j < 4, x the
    // lane's 0/1 half) that is 8 u + ((2 j + x) ^ (lane % 8)): four per-lane
    // offsets, and the rest compile-time immediates (bytes: chunk 16, row 2 D).
    //   Q (A, x4):        row = 16 warp + lane % 16,           x = lane / 16
    //   K (B, x4):        row = 16 np + lane % 8 + 8 (lane / 16), x = (lane / 8) % 2
    //   V (B, x4.trans):  row = 16 kk + lane % 8 + 8 ((lane / 8) % 2), x = lane / 16
    constexpr uint32_t ROW = 2 * D;  // bytes per smem row
    const uint32_t q_addr = smem_addr(qs) + uint32_t(warp * PF_WARP_ROWS + lane % 16) * ROW;
    const uint32_t k_row = uint32_t(lane % 8 + 8 * (lane / 16)) * ROW;
    const uint32_t v_row = uint32_t(lane % 8 + 8 * ((lane / 8) % 2)) * ROW;
    uint32_t off_a[4], off_b[4];  // Q and V / K
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        off_a[j] = uint32_t(((2 * j + lane / 16) ^ (lane % 8)) * 16);
        off_b[j] = uint32_t(((2 * j + (lane / 8) % 2) ^ (lane % 8)) * 16);
    }

    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_lo = -INFINITY, m_hi = -INFINITY;  // running max (log2 domain)
    float l_lo = 0.f, l_hi = 0.f;              // this thread's share of the running sum

    for (int kt = 0; kt < n_tiles; ++kt) {
        const int key0 = kt * BK;
        const int st = kt & 1;
        // the next tile into the other stage (freed by the barrier that ended the last iteration)
        if (kt + 1 < n_tiles)
            load_kv_tile<D, BK, Q8>(k_stage(st ^ 1), v_stage(st ^ 1), Kb, Vb, row_stride, key0 + BK, kv_end);
        cp_async_commit();  // possibly empty: keeps the group count uniform
        cp_async_wait<1>();  // this tile's group has landed
        __syncthreads();     // ... for every thread's copies (and Q's stores)

        // A warp whose rows all end before this tile skips it: nothing would change.
        if (key0 <= warp_pos_max) {
            const uint32_t k_addr = smem_addr(k_stage(st)) + k_row;
            const uint32_t v_addr = smem_addr(v_stage(st)) + v_row;

            // S = Q K^T over the head dim, 16 at a time
            float s[NS][4];
#pragma unroll
            for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kc = 0; kc < D / 16; ++kc) {
                // A x4: rows lane % 16 of the warp, chunk 2 kc + lane / 16 (a0 a1 a2 a3)
                uint32_t qa[4];
                ldsm_x4(q_addr + off_a[kc % 4] + 128 * (kc / 4), qa);
#pragma unroll
                for (int np = 0; np < NS / 2; ++np) {
                    // B x4 for keys 16 np..16 np + 15: matrices (keys 0-7, d lo), (0-7, hi),
                    // (8-15, lo), (8-15, hi) -> b0, b1 of n-tile 2 np, then of 2 np + 1
                    uint32_t kb[4];
                    ldsm_x4(k_addr + off_b[kc % 4] + 128 * (kc / 4) + 16 * np * ROW, kb);
                    mma_16816(s[2 * np], qa, kb[0], kb[1]);
                    mma_16816(s[2 * np + 1], qa, kb[2], kb[3]);
                }
            }

            // causal mask: only tiles that reach past the block's first position need it
            if (key0 + BK - 1 > pos_first) {
#pragma unroll
                for (int n = 0; n < NS; ++n) {
                    const int key = key0 + 8 * n + 2 * quad;
                    if (key > pos_lo) s[n][0] = -INFINITY;
                    if (key + 1 > pos_lo) s[n][1] = -INFINITY;
                    if (key > pos_hi) s[n][2] = -INFINITY;
                    if (key + 1 > pos_hi) s[n][3] = -INFINITY;
                }
            }

            // online softmax: the tile's row max over the 4 threads of a row
            float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                mx_lo = fmaxf(mx_lo, fmaxf(s[n][0], s[n][1]));
                mx_hi = fmaxf(mx_hi, fmaxf(s[n][2], s[n][3]));
            }
#pragma unroll
            for (int o2 = 1; o2 <= 2; o2 <<= 1) {
                mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o2));
                mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o2));
            }
            const float corr_lo = exp2f(m_lo - mx_lo);  // 0 on the first tile (m = -inf)
            const float corr_hi = exp2f(m_hi - mx_hi);
            m_lo = mx_lo;
            m_hi = mx_hi;

            // P = exp2(S - max) as f16 A fragments: n-tiles 2 kk, 2 kk + 1 are
            // keys 16 kk..16 kk + 15, and their (c0 c1), (c2 c3) pairs are a0..a3
            uint32_t pa[BK / 16][4];
            float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                const __half2 plo = __floats2half2_rn(exp2f(s[n][0] - mx_lo), exp2f(s[n][1] - mx_lo));
                const __half2 phi = __floats2half2_rn(exp2f(s[n][2] - mx_hi), exp2f(s[n][3] - mx_hi));
                const float2 flo = __half22float2(plo), fhi = __half22float2(phi);
                sum_lo += flo.x + flo.y;
                sum_hi += fhi.x + fhi.y;
                pa[n / 2][(n % 2) * 2] = *reinterpret_cast<const uint32_t*>(&plo);
                pa[n / 2][(n % 2) * 2 + 1] = *reinterpret_cast<const uint32_t*>(&phi);
            }
            l_lo = l_lo * corr_lo + sum_lo;
            l_hi = l_hi * corr_hi + sum_hi;
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                o[n][0] *= corr_lo;
                o[n][1] *= corr_lo;
                o[n][2] *= corr_hi;
                o[n][3] *= corr_hi;
            }

            // O += P V: V x4.trans for keys 16 kk.. and d 16 dp..: matrices (keys 0-7, d lo),
            // (8-15, lo), (0-7, hi), (8-15, hi) -> b0, b1 of n-tile 2 dp, then of 2 dp + 1
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
                for (int dp = 0; dp < D / 16; ++dp) {
                    uint32_t vb[4];
                    ldsm_x4_trans(v_addr + off_a[dp % 4] + 128 * (dp / 4) + 16 * kk * ROW, vb);
                    mma_16816(o[2 * dp], pa[kk], vb[0], vb[1]);
                    mma_16816(o[2 * dp + 1], pa[kk], vb[2], vb[3]);
                }
            }
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
    cp_async_wait<0>();  // nothing is in flight at exit (the last group is empty)

    // the row sums over the 4 threads of a row, then O / sum
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o2);
        l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o2);
    }
    const float inv_lo = 1.f / l_lo, inv_hi = 1.f / l_hi;
    const int tt_lo = row_lo / G, tt_hi = row_hi / G;
    float* out_lo = a.out + ((tok0 + tt_lo) * a.n_head + g * G + row_lo % G) * D;
    float* out_hi = a.out + ((tok0 + tt_hi) * a.n_head + g * G + row_hi % G) * D;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
        const int e = 8 * n + 2 * quad;
        if (tt_lo < ntok) *reinterpret_cast<float2*>(out_lo + e) = make_float2(o[n][0] * inv_lo, o[n][1] * inv_lo);
        if (tt_hi < ntok) *reinterpret_cast<float2*>(out_hi + e) = make_float2(o[n][2] * inv_hi, o[n][3] * inv_hi);
    }
}

template <int D, int G>
void launch_prefill(const PrefillArgs& a, int64_t T, cudaStream_t s) {
    constexpr int TOK = PF_ROWS / G;
    constexpr size_t bytes = prefill_smem_bytes<D>();
    static_assert(bytes <= 96 * 1024, "prefill attention: shared memory over sm_86's budget");
    auto kernel = a.q8 ? attn_prefill_kernel<D, G, true> : attn_prefill_kernel<D, G, false>;
    allow_dynamic_smem(kernel, bytes);
    // every segment's tiles fit in ceil(T / TOK) + n_seg (one partial tile per segment)
    const int64_t tiles = (T + TOK - 1) / TOK + a.n_seg;
    if (tiles > 65535) fail(strfmt("CUDA prefill attention: %lld tokens in one step are too many", (long long)T));
    const dim3 grid(unsigned(a.n_kv), unsigned(tiles));
    launch("attention_prefill", kernel, grid, dim3(PF_THREADS), bytes, s, a);
}

template <int D>
bool launch_prefill_d(const PrefillArgs& a, int group, int64_t T, cudaStream_t s) {
    switch (group) {
        case 1: launch_prefill<D, 1>(a, T, s); return true;
        case 2: launch_prefill<D, 2>(a, T, s); return true;
        case 4: launch_prefill<D, 4>(a, T, s); return true;
        case 8: launch_prefill<D, 8>(a, T, s); return true;
        default: return false;
    }
}

}  // namespace

bool attention_prefill(Rows q, const KvView& kv, const Segment* seg, int n_seg, int64_t T, float scale, float* out,
                       cudaStream_t s) {
    if ((kv.type != GgmlType::F16 && kv.type != GgmlType::Q8_0) || (kv.d != 64 && kv.d != 128 && kv.d != 256) || kv.n_kv <= 0 || q.n1 % kv.n_kv != 0) return false;
    const int64_t group = q.n1 / kv.n_kv;
    if (group != 1 && group != 2 && group != 4 && group != 8) return false;
    if (q.n != kv.d)
        fail(strfmt("CUDA prefill attention: q rows of %lld vs head dim %lld", (long long)q.n, (long long)kv.d));
    if (T == 0) return true;
    if (n_seg <= 0 || !seg) fail("CUDA prefill attention: no segments for a non-empty step");
    PrefillArgs a;
    a.q = q.data;
    a.q_h = q.s1;
    a.q_t = q.s2;
    a.K = static_cast<const unsigned char*>(kv.k);
    a.V = static_cast<const unsigned char*>(kv.v);
    a.q8 = kv.type == GgmlType::Q8_0;
    a.n_kv = int(kv.n_kv);
    a.n_head = int(q.n1);
    a.n_ctx = kv.n_ctx;
    a.seg = seg;
    a.n_seg = n_seg;
    a.q_scale = scale * 1.4426950408889634f;  // log2(e)
    a.out = out;
    bool ok = false;
    switch (kv.d) {
        case 64: ok = launch_prefill_d<64>(a, int(group), T, s); break;
        case 128: ok = launch_prefill_d<128>(a, int(group), T, s); break;
        default: ok = launch_prefill_d<256>(a, int(group), T, s); break;
    }
    if (ok) QINFER_CUDA_LAUNCHED("attention_prefill");
    return ok;
}

}  // namespace qinfer::cuda
