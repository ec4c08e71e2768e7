// Gated DeltaNet pieces (spec/models.md §5.6): the causal depthwise conv with
// its rolling state, and the gated delta rule with an f32 state.
//
// The conv is parallel over channels and tokens. The delta rule has two
// kernels: a token-serial one for decode and short segments (the state of a
// few rows stays in registers, one pass over it per token), and a chunked one
// for prompts (§5.7) that turns 32 tokens at a time into small matrix products.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include <cooperative_groups.h>

#include "common/error.h"
#include "runtime/cuda/act_quant.cuh"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

namespace {

// ---- causal conv + SiLU
// Thread (channel, tile of CONV_TT tokens of one segment): the window of K-1
// earlier raw inputs comes from the conv state for the first K-1 tokens of the
// segment and from x after that, so tiles are independent. The sum runs in the
// CPU backend's order without FMA contraction (same rounding as the CPU).
// Memory-bound: T = 512, C = 8192 reads 16 MB (+3/16 window overlap, cached)
// and writes 16 MB, ~8-10 us at H200 bandwidth (the per-channel serial loop
// took 226 us). Decode (1 token per segment) gets the same grid as before.
constexpr int CONV_THREADS = 128;
constexpr int CONV_TT = 16;  // tokens per thread; >= K-1, so only tile 0 reads the state

template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
    conv1d_silu_kernel(const float* __restrict__ x, int64_t ldx, const float* __restrict__ w, int64_t C,
                       float* __restrict__ state, const Segment* __restrict__ seg, float* __restrict__ out,
                       int64_t ldo) {
    pdl_enter();
    static_assert(K - 1 <= CONV_TT, "the state is read by tile 0 only");
    const int64_t c = int64_t(blockIdx.x) * CONV_THREADS + threadIdx.x;
    if (c >= C) return;
    const Segment sg = seg[blockIdx.z];
    const int t0 = int(blockIdx.y) * CONV_TT;  // segment-relative
    if (t0 > 0 && t0 >= sg.count) return;     // tile 0 always runs: it writes the new state
    float* st = state + int64_t(sg.slot) * (K - 1) * C + c;  // state row r at st[r * C]
    float wc[K];
#pragma unroll
    for (int r = 0; r < K; ++r) wc[r] = __ldg(w + c * K + r);
    // win[r] = input of token t0 - (K-1) + r; negative tokens are state rows
    float win[K];
#pragma unroll
    for (int r = 0; r < K - 1; ++r) {
        const int tt = t0 - (K - 1) + r;
        win[r] = tt < 0 ? st[int64_t(tt + K - 1) * C] : __ldg(x + int64_t(sg.first + tt) * ldx + c);
    }
    float old[K - 1];  // the state before this call (tile 0 only)
#pragma unroll
    for (int r = 0; r < K - 1; ++r) old[r] = win[r];
    const int t1 = min(t0 + CONV_TT, sg.count);
    for (int t = t0; t < t1; ++t) {
        const int64_t tok = sg.first + t;
        win[K - 1] = __ldg(x + tok * ldx + c);
        float acc = 0.f;
#pragma unroll
        for (int r = 0; r < K; ++r) acc = __fadd_rn(acc, __fmul_rn(wc[r], win[r]));
        out[tok * ldo + c] = silu(acc);
#pragma unroll
        for (int r = 0; r < K - 1; ++r) win[r] = win[r + 1];
    }
    if (t0 == 0) {
        // new state row r = element count + r of [old state; segment inputs]
#pragma unroll
        for (int r = 0; r < K - 1; ++r) {
            const int idx = sg.count + r;
            float val = 0.f;
            if (idx < K - 1) {
#pragma unroll
                for (int i = 0; i < K - 1; ++i)
                    if (i == idx) val = old[i];
            } else {
                val = __ldg(x + int64_t(sg.first + idx - (K - 1)) * ldx + c);
            }
            st[int64_t(r) * C] = val;
        }
    }
}

// ---- gated delta rule, token-serial
constexpr int GDR_WARPS = 4;
constexpr int GDR_ROWS = 4;  // value rows per warp

// The gated RMSNorm of the rule's output heads (d_v = 128) and its quantization
// for the next product, as the fused norm_quantize launch computes them (ops.cu:
// 16 lanes per head row, 8 elements each, the same sums in the same order).
struct GdrNormDev {
    const float* w;  // [128]
    Rows z, y;       // rows t * Hv + head
    float eps;
    ActOutPtrs q;
    int64_t m;  // head rows per token row of the quantized input
};
constexpr int GDR_NORM_WARPS = 8;  // 32 rows a block: a cluster of 4 x 2 blocks holds two heads

// Block: (row group, value head, segment). KPL keys per lane (d_k = 32 * KPL),
// W warps of GDR_ROWS rows. Segments longer than max_count are left to the
// chunked kernel. QK != 0 (one token per segment, d_v = 128, clusters of 4 x 2
// blocks = two value heads): the cluster's first block also applies the gated
// norm to the pair of heads and quantizes them (Q8_0 / Q8_1 / Q8_K), one launch
// instead of two per DeltaNet layer in decode.
template <int KPL, int W = GDR_WARPS, int QK = 0>
__global__ void __launch_bounds__(W * WARP)
    gdr_seq_kernel(DeltaArgs p, const Segment* __restrict__ seg, int max_count, GdrNormDev nd) {
    pdl_trigger_at_top();
    if (!p.state_early) pdl_wait_inputs();
    // the segments are copied in before the step's kernels: readable before the wait
    const int j = blockIdx.y;
    const Segment sg = seg[blockIdx.z];
    if (QK == 0 && sg.count > max_count) return;  // (QK: every block reaches the cluster barrier)
    const int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    const int r0 = (blockIdx.x * W + wid) * GDR_ROWS;
    const int dk = p.dk, dv = p.dv;
    if (r0 >= dv) return;
    const int kh = j % p.Hk;  // tiled value-head -> key-head mapping (GGUF order)
    // QK: the gated norm's weight and gate for the 8 values a lane of the lead
    // warp normalizes at the end, loaded while the recurrence runs (the weight
    // before the wait: no kernel writes it), not after the cluster barrier
    [[maybe_unused]] float nw[8], nz[8];
    [[maybe_unused]] bool norm_warp = false;
    [[maybe_unused]] const int hp = lane / 16, nk0 = 8 * (lane % 16);  // head of the pair, first element
    [[maybe_unused]] const int64_t nr = int64_t(sg.first) * p.Hv + (j & ~1) + hp;  // its gate / output row
#if __CUDA_ARCH__ >= 900
    if constexpr (QK != 0) {
        norm_warp = cooperative_groups::this_cluster().block_rank() == 0 && wid == 0;
        if (norm_warp)
#pragma unroll
            for (int i = 0; i < 8; ++i) nw[i] = nd.w[nk0 + i];
    }
#endif
    float* S = p.S + ((int64_t(sg.slot) * p.Hv + j) * dv) * dk;
    float s[GDR_ROWS][KPL];
#pragma unroll
    for (int r = 0; r < GDR_ROWS; ++r)
#pragma unroll
        for (int i = 0; i < KPL; ++i)
            s[r][i] = r0 + r < dv ? S[int64_t(r0 + r) * dk + lane + 32 * i] : 0.f;
    const float dtb = p.dt_bias[j], A = p.ssm_a[j];  // weights: before the wait
    if (p.state_early) pdl_wait_inputs();  // q, k, v, a and b come from the kernels before this one
    if (QK != 0 && norm_warp) {
        const float* zr = row_ptr(nd.z, nr);
#pragma unroll
        for (int i = 0; i < 8; ++i) nz[i] = zr[nk0 + i];
    }
    const float scale = rsqrtf(float(dk));
    // Inputs of token t+1 are loaded while token t is computed: the chain through
    // the state is the only true dependency between tokens.
    float kk[KPL], qq[KPL], vr[GDR_ROWS], araw = 0.f, braw = 0.f;
    auto load = [&](int t) {
        const float* kt = p.k + int64_t(t) * p.k_t + int64_t(kh) * p.k_h;
        const float* qt = p.q + int64_t(t) * p.q_t + int64_t(kh) * p.q_h;
        const float* vt = p.v + int64_t(t) * p.v_t + int64_t(j) * p.v_h;
#pragma unroll
        for (int i = 0; i < KPL; ++i) {
            kk[i] = __ldg(kt + lane + 32 * i);
            qq[i] = __ldg(qt + lane + 32 * i);
        }
#pragma unroll
        for (int r = 0; r < GDR_ROWS; ++r) vr[r] = r0 + r < dv ? __ldg(vt + r0 + r) : 0.f;
        araw = __ldg(p.a + int64_t(t) * p.a_t + j);
        braw = __ldg(p.b + int64_t(t) * p.b_t + j);
    };
    // l2_qk: q and k as l2_norm leaves them (a warp holds whole key heads)
    auto normalize = [&] {
        if (!p.l2_qk) return;
        float sq = 0.f, sk2 = 0.f;
#pragma unroll
        for (int i = 0; i < KPL; ++i) {
            sq = fmaf(qq[i], qq[i], sq);
            sk2 = fmaf(kk[i], kk[i], sk2);
        }
        sq = 1.f / fmaxf(sqrtf(warp_sum(sq)), p.l2_eps);
        sk2 = 1.f / fmaxf(sqrtf(warp_sum(sk2)), p.l2_eps);
#pragma unroll
        for (int i = 0; i < KPL; ++i) {
            qq[i] *= sq;
            kk[i] *= sk2;
        }
    };
    const int t_end = sg.first + sg.count;
    float last = 0.f;  // this lane's output row of the last token (lane < GDR_ROWS)
    if (sg.count > 0) {
        load(sg.first);
        normalize();
    }
    for (int t = sg.first; t < t_end; ++t) {
        float ck[KPL], cq[KPL], cv[GDR_ROWS];
#pragma unroll
        for (int i = 0; i < KPL; ++i) {
            ck[i] = kk[i];
            cq[i] = qq[i];
        }
#pragma unroll
        for (int r = 0; r < GDR_ROWS; ++r) cv[r] = vr[r];
        const float g = softplus(araw + dtb) * A;
        const float alpha = expf(g);
        const float beta = sigmoid(braw);
        if (t + 1 < t_end) {
            load(t + 1);
            normalize();
        }
        // decay, then S k with the decayed state (all rows at once for ILP)
        float sk[GDR_ROWS];
#pragma unroll
        for (int r = 0; r < GDR_ROWS; ++r) {
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < KPL; ++i) {
                s[r][i] *= alpha;
                acc = fmaf(s[r][i], ck[i], acc);
            }
            sk[r] = acc;
        }
#pragma unroll
        for (int r = 0; r < GDR_ROWS; ++r) sk[r] = warp_sum(sk[r]);
        float o[GDR_ROWS];
#pragma unroll
        for (int r = 0; r < GDR_ROWS; ++r) {
            const float delta = beta * (cv[r] - sk[r]);
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < KPL; ++i) {
                s[r][i] = fmaf(delta, ck[i], s[r][i]);
                acc = fmaf(s[r][i], cq[i], acc);
            }
            o[r] = acc;
        }
#pragma unroll
        for (int r = 0; r < GDR_ROWS; ++r) o[r] = warp_sum(o[r]);
        if (lane < GDR_ROWS) {
            float ov = o[0];
#pragma unroll
            for (int r = 1; r < GDR_ROWS; ++r)
                if (lane == r) ov = o[r];
            last = ov * scale;
            if (r0 + lane < dv) p.out[(int64_t(t) * p.Hv + j) * dv + r0 + lane] = last;
        }
    }
    auto store_state = [&] {
#pragma unroll
        for (int r = 0; r < GDR_ROWS; ++r)
            if (r0 + r < dv)
#pragma unroll
                for (int i = 0; i < KPL; ++i) S[int64_t(r0 + r) * dk + lane + 32 * i] = s[r][i];
    };
    if constexpr (QK == 0) {
        store_state();
    } else {
#if __CUDA_ARCH__ >= 900
        constexpr int DV = 128;
        __shared__ float pair[2 * DV];  // the cluster's two heads, in its first block
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        float* lead = cluster.map_shared_rank(pair, 0);
        if (lane < GDR_ROWS) lead[(j & 1) * DV + r0 + lane] = last;
        // The state goes out after the barrier: its arrive has release
        // semantics, so stores issued before it could hold every block there
        // until they are acknowledged, and the gated norm needs only `pair`.
        cluster.sync();
        store_state();
        if (norm_warp) {
            const int k0 = nk0;
            const int64_t r = nr, rp = r - hp;
            float* yr = row_ptr(nd.y, r);
            float v[8], ss = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                v[i] = pair[hp * DV + k0 + i];
                ss = fmaf(v[i], v[i], ss);
            }
            for (int o = 8; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            const float sc = rms_scale(ss, DV, nd.eps);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                v[i] = rms_gated(v[i], sc, nw[i], nz[i]);
                yr[k0 + i] = v[i];
            }
            quantize_span<QK>(v, lane, nd.q, rp / nd.m, nd.m * DV, (rp % nd.m) * DV, true);
        }
#else
        store_state();
#endif
    }
}

// ---- gated delta rule, chunked (spec/models.md §5.7)
//
// Design. Block = (32 value rows c0.., value head j, segment), 256 threads; the
// 32 x d_k slice of S stays in shared memory for the whole segment (rows of S
// are independent: k, q, g, beta are shared, v and S are per row). Per chunk
// of CT = 32 tokens (gamma = inclusive cumsum of g, Gamma = exp(gamma)):
//   Z = [K; Q] [K; S0]^T    one 64 x 64 x d_k f32 tile product: k.k, q.k, S0 k, S0 q
//   A = beta_r (k_r.k_s) exp(gamma_r - gamma_s), s < r     P = (q_r.k_s) exp(..), s <= r
//   R = beta_r (v_r - Gamma_r S0 k_r);  U = (I + A)^-1 R    forward substitution, shuffles
//   o_r = scale (Gamma_r S0 q_r + sum_s P[r][s] u_s)
//   S0 <- Gamma_n S0 + sum_s exp(gamma_n - gamma_s) u_s k_s^T
// exp(gamma_r - gamma_s) is taken only for s <= r, with the exponent summed
// over tokens s+1..r (never a ratio of Gammas, never a difference of two large
// prefix sums). Padded tokens of a short chunk have k = q = v = 0, g = 0,
// beta = 0 and change nothing. All f32 with FMA; on random data with unit keys
// (also strongly correlated ones) a host emulation of this kernel's exact index
// mapping is as close to an f64 serial reference as the f32 serial form is
// (1024-token segment: state 6e-7 relative), so long prompts do not drift.
//
// Cost, d_k = d_v = 128, per block and 32-token chunk: Z 459K FMA (the always
// masked quarter of the k.k and q.k blocks skipped), state update 131K, output
// 33K, substitution 16K = ~640K FMA = 5K cycles of one SM's 128 FP32 lanes.
// Z alone: 1792 FMA per thread = 3.6K issue cycles, shared memory at 8 of 14
// wavefront-or-issue slots (16-byte loads, 4 x 8 warp tile), so ~4.2K; the
// state update ~1.3K; latency-bound pieces (decay scans ~250, 32 shuffle steps
// of the substitution ~900, barriers and the output ~500): ~7.5K cycles = ~4 us
// per chunk at 1.9 GHz. Hv = 32 heads x 4 row blocks = 128 blocks, one per SM
// of a 132-SM H200, so per layer T = 512 (16 chunks) ~65 us (serial: 329 us
// measured), T = 4096 ~520 us; the FP32 peak bound is 43 us at T = 512. Memory
// is minor: k and q are read once per block (8 blocks share a key head: L2
// hits), next-chunk loads are in flight during the product, and S (64 KB per
// head) is read and written once per segment.
// Next steps if this is the bottleneck: the Z product on the tensor cores in
// 3xTF32 (plain TF32 is not accurate enough for A), or a workspace so that the
// S-independent half of Z is computed once per key head instead of 8 times.
__device__ __forceinline__ float4 ld16f(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

constexpr int CT = 32;   // tokens per chunk (= warp size: the scan and the substitution use lanes)
constexpr int CV = 32;   // value rows of S per block
constexpr int CNT = 256; // threads per block (8 warps)

template <int DK>
struct ChunkSmem {
    alignas(16) float k[CT][DK + 4];  // +4: rows start on different banks for 16-byte loads
    alignas(16) float q[CT][DK + 4];
    alignas(16) float s[CV][DK + 4];  // S rows c0..c0+CV of value head j (key index contiguous)
    float v[CT][CV + 1];
    float A[CT][CT + 1];
    float P[CT][CT + 1];
    float u[CT][CV + 1];  // R, then U in place
    float o[CT][CV + 1];  // Gamma_r S0 q_r
    float E[CT][CT + 1];  // exp(gamma_r - gamma_s) for s <= r, else 0
    float g[CT], beta[CT], eg[CT];  // g, beta, Gamma = exp(gamma)
};

// Segments shorter than min_count are left to the serial kernel.
template <int DK>
__global__ void __launch_bounds__(CNT, 1) gdr_chunk_kernel(DeltaArgs p, const Segment* __restrict__ seg, int min_count) {
    pdl_enter();
    constexpr int KQ = DK / 4;              // float4 per key row
    constexpr int LDQ = CT * KQ / CNT;      // float4 of k (and of q) each thread stages per chunk
    constexpr int LDV = CT * CV / CNT;      // v elements each thread stages per chunk
    static_assert(CT * KQ % CNT == 0 && CT * CV % CNT == 0, "staging split");
    extern __shared__ float4 smem_raw[];
    ChunkSmem<DK>& sm = *reinterpret_cast<ChunkSmem<DK>*>(smem_raw);

    const int tid = threadIdx.x, lane = tid % WARP, wid = tid / WARP;
    const int c0 = blockIdx.x * CV, j = blockIdx.y, kh = j % p.Hk;
    const Segment sg = seg[blockIdx.z];
    if (sg.count < min_count) return;
    const int dv = p.dv;
    float* S = p.S + ((int64_t(sg.slot) * p.Hv + j) * dv + c0) * DK;
    const float scale = rsqrtf(float(DK));
    const float dtb = p.dt_bias[j], Aj = p.ssm_a[j];

    for (int i = tid; i < CV * KQ; i += CNT) {
        const int r = i / KQ, d = (i % KQ) * 4;
        *reinterpret_cast<float4*>(&sm.s[r][d]) = *reinterpret_cast<const float4*>(S + int64_t(r) * DK + d);
    }

    // Inputs of the next chunk are staged in registers while this one computes.
    float4 nk[LDQ], nq[LDQ];
    float nv[LDV], na = 0.f, nb = 0.f;
    auto stage = [&](int t0) {
        const int n = min(CT, sg.count - t0);
#pragma unroll
        for (int i = 0; i < LDQ; ++i) {
            const int e = tid + i * CNT, r = e / KQ, d = (e % KQ) * 4;
            nk[i] = nq[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < n) {
                const int64_t t = sg.first + t0 + r;
                nk[i] = ld16f(p.k + t * p.k_t + kh * p.k_h + d);
                nq[i] = ld16f(p.q + t * p.q_t + kh * p.q_h + d);
            }
        }
#pragma unroll
        for (int i = 0; i < LDV; ++i) {
            const int e = tid + i * CNT, r = e / CV, c = e % CV;
            nv[i] = r < n ? __ldg(p.v + int64_t(sg.first + t0 + r) * p.v_t + int64_t(j) * p.v_h + c0 + c) : 0.f;
        }
        if (wid == 0 && lane < n) {
            const int64_t t = sg.first + t0 + lane;
            na = __ldg(p.a + t * p.a_t + j);
            nb = __ldg(p.b + t * p.b_t + j);
        }
    };
    if (sg.count > 0) stage(0);

    for (int t0 = 0; t0 < sg.count; t0 += CT) {
        const int n = min(CT, sg.count - t0);
        __syncthreads();  // the previous chunk is done with k, q, v, u and the S slice is in place
#pragma unroll
        for (int i = 0; i < LDQ; ++i) {
            const int e = tid + i * CNT, r = e / KQ, d = (e % KQ) * 4;
            *reinterpret_cast<float4*>(&sm.k[r][d]) = nk[i];
            *reinterpret_cast<float4*>(&sm.q[r][d]) = nq[i];
        }
#pragma unroll
        for (int i = 0; i < LDV; ++i) {
            const int e = tid + i * CNT;
            sm.v[e / CV][e % CV] = nv[i];
        }
        if (wid == 0) {
            float g = 0.f, be = 0.f;
            if (lane < n) {
                g = softplus(na + dtb) * Aj;
                be = sigmoid(nb);
            }
            sm.g[lane] = g;
#pragma unroll
            for (int o = 1; o < WARP; o <<= 1) {  // inclusive prefix sum over the chunk
                const float y = __shfl_up_sync(0xffffffffu, g, o);
                if (lane >= o) g += y;
            }
            sm.beta[lane] = be;
            sm.eg[lane] = expf(g);
        }
        if (t0 + CT < sg.count) stage(t0 + CT);
        __syncthreads();

        // Decay table. gamma_r - gamma_s is summed over tokens s+1..r (a suffix scan
        // per row), not taken as a difference of prefix sums: with strong decays
        // |gamma| reaches hundreds in a chunk and the difference would lose ~1e-5
        // where exp(difference) is near 1.
        // Warp w does rows w + 8 i, interleaved (the scans are latency-bound).
        {
            static_assert(CNT / WARP * (CT / 8) == CT, "decay table rows");
            float x[CT / 8];
#pragma unroll
            for (int i = 0; i < CT / 8; ++i) {
                const int r = wid + 8 * i;
                x[i] = lane < r ? sm.g[lane + 1] : 0.f;
            }
#pragma unroll
            for (int o = 1; o < WARP; o <<= 1)
#pragma unroll
                for (int i = 0; i < CT / 8; ++i) {
                    const float y = __shfl_down_sync(0xffffffffu, x[i], o);
                    if (lane + o < WARP) x[i] += y;
                }
#pragma unroll
            for (int i = 0; i < CT / 8; ++i) {
                const int r = wid + 8 * i;
                sm.E[r][lane] = lane <= r ? expf(x[i]) : 0.f;
            }
        }

        // Z = [K; Q] [K; S0]^T: thread rows tr + 16 i (i < 2: k, else q), cols tc + 16 i2
        // (i2 < 2: k, else S rows). A warp covers 4 tr x 8 tc, so each 16-byte load
        // of the warp touches 4 or 8 distinct rows on distinct banks: one wavefront.
        {
            const int tr = (wid % 4) * 4 + lane / 8, tc = (wid / 4) * 8 + lane % 8;
            const float* xr[4] = {sm.k[tr], sm.k[tr + 16], sm.q[tr], sm.q[tr + 16]};
            const float* yr[4] = {sm.k[tc], sm.k[tc + 16], sm.s[tc], sm.s[tc + 16]};
            float acc[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int i2 = 0; i2 < 4; ++i2) acc[i][i2] = 0.f;
#pragma unroll 4
            for (int d = 0; d < DK; d += 4) {
                float4 xv[4], yv[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) xv[i] = *reinterpret_cast<const float4*>(xr[i] + d);
#pragma unroll
                for (int i = 0; i < 4; ++i) yv[i] = *reinterpret_cast<const float4*>(yr[i] + d);
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int i2 = 0; i2 < 4; ++i2) {
                        // row tr against row tc + 16 (k or q against k) is always above
                        // the diagonal: masked, so not computed (1/8 of the product)
                        if (i2 == 1 && (i == 0 || i == 2)) continue;
                        float a = acc[i][i2];
                        a = fmaf(xv[i].x, yv[i2].x, a);
                        a = fmaf(xv[i].y, yv[i2].y, a);
                        a = fmaf(xv[i].z, yv[i2].z, a);
                        a = fmaf(xv[i].w, yv[i2].w, a);
                        acc[i][i2] = a;
                    }
            }
            __syncthreads();  // the decay table
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int i2 = 0; i2 < 4; ++i2) {
                    const int r = tr + 16 * (i & 1), cc = tc + 16 * (i2 & 1);
                    const float z = acc[i][i2];
                    if (i < 2 && i2 < 2)  // k_r . k_cc
                        sm.A[r][cc] = cc < r ? sm.beta[r] * z * sm.E[r][cc] : 0.f;
                    else if (i2 < 2)  // q_r . k_cc
                        sm.P[r][cc] = cc <= r ? z * sm.E[r][cc] : 0.f;
                    else if (i < 2)  // S0 row cc . k_r
                        sm.u[r][cc] = sm.beta[r] * (sm.v[r][cc] - sm.eg[r] * z);
                    else  // S0 row cc . q_r
                        sm.o[r][cc] = sm.eg[r] * z;
                }
        }
        __syncthreads();

        // U = (I + A)^-1 R by forward substitution. Warp w solves columns 4w..4w+3;
        // lane (cl, rg) holds rows rg + 8 i of column 4w + cl. Row s is final at
        // step s (A is strictly lower) and is broadcast from its lane.
        {
            const int cl = lane / 8, rg = lane % 8, c = wid * 4 + cl;
            float x[CT / 8];
#pragma unroll
            for (int i = 0; i < CT / 8; ++i) x[i] = sm.u[rg + 8 * i][c];
#pragma unroll
            for (int s = 0; s < CT; ++s) {
                const float us = __shfl_sync(0xffffffffu, x[s / 8], (lane & ~7) | (s % 8));
#pragma unroll
                for (int i = 0; i < CT / 8; ++i) x[i] = fmaf(-sm.A[rg + 8 * i][s], us, x[i]);
            }
#pragma unroll
            for (int i = 0; i < CT / 8; ++i) sm.u[rg + 8 * i][c] = x[i];
        }
        __syncthreads();

        // Outputs: warp w, rows w + 8 i, lane = value row. Reads u, P (zero above
        // the diagonal), o.
        {
            const int c = lane;
            float acc[CT / 8];
#pragma unroll
            for (int i = 0; i < CT / 8; ++i) acc[i] = sm.o[wid + 8 * i][c];
#pragma unroll 8
            for (int s = 0; s < CT; ++s) {
                const float us = sm.u[s][c];
#pragma unroll
                for (int i = 0; i < CT / 8; ++i) acc[i] = fmaf(sm.P[wid + 8 * i][s], us, acc[i]);
            }
#pragma unroll
            for (int i = 0; i < CT / 8; ++i) {
                const int r = wid + 8 * i;
                if (r < n) p.out[(int64_t(sg.first + t0 + r) * p.Hv + j) * dv + c0 + c] = acc[i] * scale;
            }
        }
        // State: thread keys 4 kq .. 4 kq + 3 of rows cg + NCG i. Reads u, k; writes s
        // (read by no other phase of this chunk).
        {
            constexpr int NCG = CNT / KQ, RPT = CV / NCG;
            static_assert(CNT % KQ == 0 && CV % NCG == 0, "state update split");
            const int kq = tid % KQ, cg = tid / KQ;
            const float dl = sm.eg[CT - 1];
            float4 acc[RPT];
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                const float4 s0 = *reinterpret_cast<const float4*>(&sm.s[cg + NCG * i][4 * kq]);
                acc[i] = make_float4(s0.x * dl, s0.y * dl, s0.z * dl, s0.w * dl);
            }
            for (int s = 0; s < n; ++s) {
                const float4 kv = *reinterpret_cast<const float4*>(&sm.k[s][4 * kq]);
                const float wl = sm.E[CT - 1][s];  // exp(gamma_n - gamma_s); padding has g = 0
#pragma unroll
                for (int i = 0; i < RPT; ++i) {
                    const float us = sm.u[s][cg + NCG * i] * wl;
                    acc[i].x = fmaf(us, kv.x, acc[i].x);
                    acc[i].y = fmaf(us, kv.y, acc[i].y);
                    acc[i].z = fmaf(us, kv.z, acc[i].z);
                    acc[i].w = fmaf(us, kv.w, acc[i].w);
                }
            }
#pragma unroll
            for (int i = 0; i < RPT; ++i) *reinterpret_cast<float4*>(&sm.s[cg + NCG * i][4 * kq]) = acc[i];
        }
    }
    __syncthreads();
    for (int i = tid; i < CV * KQ; i += CNT) {
        const int r = i / KQ, d = (i % KQ) * 4;
        *reinterpret_cast<float4*>(S + int64_t(r) * DK + d) = *reinterpret_cast<const float4*>(&sm.s[r][d]);
    }
}

template <int DK>
void launch_chunked(const DeltaArgs& a, const Segment* seg, int n_seg, int min_count, cudaStream_t s) {
    const size_t bytes = sizeof(ChunkSmem<DK>);
    allow_dynamic_smem(gdr_chunk_kernel<DK>, bytes);
    const dim3 grid(static_cast<unsigned>(a.dv / CV), static_cast<unsigned>(a.Hv), static_cast<unsigned>(n_seg));
    launch("gdr_chunk_kernel", gdr_chunk_kernel<DK>, dim3(grid), dim3(CNT), bytes, s, a, seg, min_count);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The chunked kernel's preconditions: a head dim it is built for, whole row
// blocks, and 16-byte aligned q / k rows.
bool chunked_fits(const DeltaArgs& a) {
    return (a.dk == 64 || a.dk == 128) && a.dv % CV == 0 && aligned16(a.q) && aligned16(a.k) && aligned16(a.S) &&
           a.q_t % 4 == 0 && a.k_t % 4 == 0 && a.q_h % 4 == 0 && a.k_h % 4 == 0;
}

// Auto gives the chunked kernel the segments of at least this many tokens.
// Predicted crossover: a chunk costs ~4-5 us whatever its length, a serial
// token ~0.65 us (329 us / 512 measured), so ~8 tokens; 16 keeps decode,
// speculative and small-batch steps on the serial kernel they ran on before,
// at a cost of at most ~5 us where the guess is off. The test prints both
// kernels' times at 8..64 tokens to set it from measurements.
constexpr int kGdrChunkMinTokens = 16;

// QINFER_CUDA_GDR=serial|chunked forces one kernel (A/B runs); default: by segment length.
GdrPath env_path() {
    static const GdrPath p = [] {
        const char* v = std::getenv("QINFER_CUDA_GDR");
        if (!v || !*v) return GdrPath::Auto;
        if (std::strcmp(v, "serial") == 0) return GdrPath::Serial;
        if (std::strcmp(v, "chunked") == 0) return GdrPath::Chunked;
        fail(strfmt("QINFER_CUDA_GDR=%s: expected serial or chunked", v));
    }();
    return p;
}

}  // namespace

void conv1d_silu(const float* x, int64_t ldx, const float* w, int K, int64_t C, float* state, int n_slots,
                 const Segment* seg, int n_seg, int max_seg_len, float* out, int64_t ldo, cudaStream_t s) {
    (void)n_slots;
    if (n_seg == 0) return;
    const dim3 grid(static_cast<unsigned>(ceil_div(C, CONV_THREADS)),
                    static_cast<unsigned>(std::max(1, ceil_div(max_seg_len, CONV_TT))), static_cast<unsigned>(n_seg));
    switch (K) {
        case 2: launch("conv1d_silu_kernel", conv1d_silu_kernel<2>, dim3(grid), dim3(CONV_THREADS), 0, s, x, ldx, w,
                C, state, seg, out, ldo); break;
        case 3: launch("conv1d_silu_kernel", conv1d_silu_kernel<3>, dim3(grid), dim3(CONV_THREADS), 0, s, x, ldx, w,
                C, state, seg, out, ldo); break;
        case 4: launch("conv1d_silu_kernel", conv1d_silu_kernel<4>, dim3(grid), dim3(CONV_THREADS), 0, s, x, ldx, w,
                C, state, seg, out, ldo); break;
        case 5: launch("conv1d_silu_kernel", conv1d_silu_kernel<5>, dim3(grid), dim3(CONV_THREADS), 0, s, x, ldx, w,
                C, state, seg, out, ldo); break;
        case 6: launch("conv1d_silu_kernel", conv1d_silu_kernel<6>, dim3(grid), dim3(CONV_THREADS), 0, s, x, ldx, w,
                C, state, seg, out, ldo); break;
        default: fail(strfmt("CUDA conv1d: kernel size %d not supported (2..6)", K));
    }
    QINFER_CUDA_LAUNCHED("conv1d_silu");
}

namespace {
// Which segments the chunked kernel takes (count >= the result; INT_MAX: none);
// the serial kernel takes the rest. A chunk costs the same for 1 token as for
// 32, so in a mixed batch (a prompt next to decode tokens) the short segments
// stay serial, in a second launch that is skipped when one segment is all there is.
int chunk_min_tokens(const DeltaArgs& a, int max_seg_len, GdrPath path) {
    if (path == GdrPath::Auto) path = env_path();
    if (!chunked_fits(a)) return INT_MAX;
    if (path == GdrPath::Chunked) return 0;
    if (path == GdrPath::Auto && max_seg_len >= kGdrChunkMinTokens) return kGdrChunkMinTokens;
    return INT_MAX;
}
}  // namespace

namespace {
// Clusters in the running code: an sm_90+ device running sm_90+ code (a
// build's PTX for older targets, JIT-compiled on a newer device, has none).
bool gdr_clusters_usable() {
    static const bool ok = [] {
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 9)
            return false;
        cudaFuncAttributes fa{};
        if (cudaFuncGetAttributes(&fa, gdr_seq_kernel<4, GDR_NORM_WARPS, 3>) != cudaSuccess) return false;
        return fa.ptxVersion >= 90;
    }();
    return ok;
}

template <int KPL, int QK>
void launch_gdr_norm(const DeltaArgs& a, const Segment* seg, int n_seg, const GdrNormDev& nd, cudaStream_t s) {
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 128 / (GDR_NORM_WARPS * GDR_ROWS);
    attr[0].val.clusterDim.y = 2;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(128 / (GDR_NORM_WARPS * GDR_ROWS), unsigned(a.Hv), unsigned(n_seg));
    cfg.blockDim = dim3(GDR_NORM_WARPS * WARP);
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_enabled() ? 2 : 1;
    QINFER_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gdr_seq_kernel<KPL, GDR_NORM_WARPS, QK>, a, seg, INT_MAX, nd));
}
}  // namespace

bool gdr_norm_fits(const DeltaArgs& a, int max_seg_len, const NormJob& norm, const ActDest& q) {
    const Rows& x = norm.x;
    const int64_t rows = x.n1 * x.n2;
    return max_seg_len == 1 && a.dv == 128 && a.Hv % 2 == 0 && a.Hv % a.Hk == 0 &&
           (a.dk == 32 || a.dk == 64 || a.dk == 128 || a.dk == 256) && norm.op == NormOp::RmsGated && norm.w &&
           x.data == a.out && x.n == 128 && (x.n1 == 1 || x.s1 == 128) && (x.n2 == 1 || x.s2 == x.n1 * 128) &&
           rows % a.Hv == 0 && q.T * a.Hv == rows && qk_of(q.kind) != 0 && norm_quantize_fits(norm, q) &&
           gdr_clusters_usable();
}

void gated_delta_rule_norm(const DeltaArgs& a, const Segment* seg, int n_seg, const NormJob& norm, const ActDest& q,
                           cudaStream_t s) {
    if (!gdr_norm_fits(a, 1, norm, q) || n_seg != q.T)
        fail("CUDA gated_delta_rule_norm: the norm is not the one of this decode step's delta rule output");
    if (n_seg == 0) return;
    GdrNormDev nd;
    nd.w = norm.w;
    nd.z = norm.z;
    nd.y = norm.y;
    nd.eps = norm.eps;
    nd.q = act_out(q);
    nd.m = q.K / 128;
    const int qk = qk_of(q.kind);
    const auto go = [&](auto kpl) {
        constexpr int KPL = decltype(kpl)::value;
        if (qk == 1) launch_gdr_norm<KPL, 1>(a, seg, n_seg, nd, s);
        else if (qk == 2) launch_gdr_norm<KPL, 2>(a, seg, n_seg, nd, s);
        else launch_gdr_norm<KPL, 3>(a, seg, n_seg, nd, s);
    };
    switch (a.dk) {
        case 32: go(std::integral_constant<int, 1>{}); break;
        case 64: go(std::integral_constant<int, 2>{}); break;
        case 128: go(std::integral_constant<int, 4>{}); break;
        default: go(std::integral_constant<int, 8>{}); break;
    }
    QINFER_CUDA_LAUNCHED("gated_delta_rule + gated norm");
}

bool gdr_all_serial(const DeltaArgs& a, int max_seg_len, GdrPath path) {
    return chunk_min_tokens(a, max_seg_len, path) == INT_MAX;
}

void gated_delta_rule(const DeltaArgs& a, const Segment* seg, int n_seg, int max_seg_len, cudaStream_t s,
                      GdrPath path) {
    if (n_seg == 0) return;
    if (a.Hv % a.Hk != 0) fail(strfmt("CUDA delta rule: %d value heads over %d key heads", a.Hv, a.Hk));
    const int chunk_min = chunk_min_tokens(a, max_seg_len, path);
    if (a.l2_qk && chunk_min != INT_MAX) fail("CUDA delta rule: q/k normalization in the kernel needs the serial kernel");
    if (chunk_min != INT_MAX) {
        if (a.dk == 128)
            launch_chunked<128>(a, seg, n_seg, chunk_min, s);
        else
            launch_chunked<64>(a, seg, n_seg, chunk_min, s);
        QINFER_CUDA_LAUNCHED("gated_delta_rule (chunked)");
        if (chunk_min == 0 || n_seg == 1) return;
    }
    const int serial_max = chunk_min == INT_MAX ? INT_MAX : chunk_min - 1;
    const int rows_per_block = GDR_WARPS * GDR_ROWS;
    const dim3 grid(static_cast<unsigned>(ceil_div(a.dv, rows_per_block)), static_cast<unsigned>(a.Hv),
                    static_cast<unsigned>(n_seg));
    switch (a.dk) {
        case 32: launch("gdr_seq_kernel", gdr_seq_kernel<1>, dim3(grid), dim3(GDR_WARPS * WARP), 0, s, a, seg,
                serial_max, GdrNormDev{}); break;
        case 64: launch("gdr_seq_kernel", gdr_seq_kernel<2>, dim3(grid), dim3(GDR_WARPS * WARP), 0, s, a, seg,
                serial_max, GdrNormDev{}); break;
        case 128: launch("gdr_seq_kernel", gdr_seq_kernel<4>, dim3(grid), dim3(GDR_WARPS * WARP), 0, s, a, seg,
                serial_max, GdrNormDev{}); break;
        case 256: launch("gdr_seq_kernel", gdr_seq_kernel<8>, dim3(grid), dim3(GDR_WARPS * WARP), 0, s, a, seg,
                serial_max, GdrNormDev{}); break;
        default: fail(strfmt("CUDA delta rule: key head dim %d not supported (32, 64, 128, 256)", a.dk));
    }
    QINFER_CUDA_LAUNCHED("gated_delta_rule");
}

}  // namespace qinfer::cuda
