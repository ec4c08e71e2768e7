// Gated DeltaNet pieces (spec/models.md §5.6): the causal depthwise conv with
// its rolling state, and the gated delta rule with an f32 state.
//
// Delta rule: the state of one value head is d_v rows of d_k; a warp owns a few
// rows with the keys spread over its lanes, so a token costs one pass over the
// state, which stays in registers for all tokens of a segment.
#include "common/error.h"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/kernels.h"

namespace qinfer::cuda {

namespace {

// One thread per (channel, segment): window of the last K-1 raw inputs in registers.
template <int K>
__global__ void conv1d_silu_kernel(const float* __restrict__ x, int64_t ldx, const float* __restrict__ w, int64_t C,
                                   float* __restrict__ state, const Segment* __restrict__ seg, float* __restrict__ out,
                                   int64_t ldo) {
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const Segment sg = seg[blockIdx.y];
    float* st = state + int64_t(sg.slot) * (K - 1) * C + c;  // row r at st[r * C]
    float win[K];
#pragma unroll
    for (int r = 0; r < K - 1; ++r) win[r] = st[r * C];
    float wc[K];
#pragma unroll
    for (int r = 0; r < K; ++r) wc[r] = w[c * K + r];
    for (int t = 0; t < sg.count; ++t) {
        const int64_t tok = sg.first + t;
        win[K - 1] = x[tok * ldx + c];
        float acc = 0.f;
#pragma unroll
        for (int r = 0; r < K; ++r) acc += wc[r] * win[r];
        out[tok * ldo + c] = silu(acc);
#pragma unroll
        for (int r = 0; r < K - 1; ++r) win[r] = win[r + 1];
    }
#pragma unroll
    for (int r = 0; r < K - 1; ++r) st[r * C] = win[r];
}

constexpr int GDR_WARPS = 4;
constexpr int GDR_ROWS = 4;  // value rows per warp

// Block: (row group, value head, segment). KPL keys per lane (d_k = 32 * KPL).
template <int KPL>
__global__ void __launch_bounds__(GDR_WARPS * WARP) gdr_seq_kernel(DeltaArgs p, const Segment* __restrict__ seg) {
    const int j = blockIdx.y;
    const Segment sg = seg[blockIdx.z];
    const int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    const int r0 = (blockIdx.x * GDR_WARPS + wid) * GDR_ROWS;
    const int dk = p.dk, dv = p.dv;
    if (r0 >= dv) return;
    const int kh = j % p.Hk;  // tiled value-head -> key-head mapping (GGUF order)
    float* S = p.S + ((int64_t(sg.slot) * p.Hv + j) * dv) * dk;
    float s[GDR_ROWS][KPL];
#pragma unroll
    for (int r = 0; r < GDR_ROWS; ++r)
#pragma unroll
        for (int i = 0; i < KPL; ++i)
            s[r][i] = r0 + r < dv ? S[int64_t(r0 + r) * dk + lane + 32 * i] : 0.f;
    const float scale = rsqrtf(float(dk));
    const float dtb = p.dt_bias[j], A = p.ssm_a[j];
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
    const int t_end = sg.first + sg.count;
    if (sg.count > 0) load(sg.first);
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
        if (t + 1 < t_end) load(t + 1);
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
            if (r0 + lane < dv) p.out[(int64_t(t) * p.Hv + j) * dv + r0 + lane] = ov * scale;
        }
    }
#pragma unroll
    for (int r = 0; r < GDR_ROWS; ++r)
        if (r0 + r < dv)
#pragma unroll
            for (int i = 0; i < KPL; ++i) S[int64_t(r0 + r) * dk + lane + 32 * i] = s[r][i];
}

}  // namespace

void conv1d_silu(const float* x, int64_t ldx, const float* w, int K, int64_t C, float* state, int n_slots,
                 const Segment* seg, int n_seg, float* out, int64_t ldo, cudaStream_t s) {
    (void)n_slots;
    if (n_seg == 0) return;
    const dim3 grid(static_cast<unsigned>(ceil_div(C, 128)), static_cast<unsigned>(n_seg));
    switch (K) {
        case 2: conv1d_silu_kernel<2><<<grid, 128, 0, s>>>(x, ldx, w, C, state, seg, out, ldo); break;
        case 3: conv1d_silu_kernel<3><<<grid, 128, 0, s>>>(x, ldx, w, C, state, seg, out, ldo); break;
        case 4: conv1d_silu_kernel<4><<<grid, 128, 0, s>>>(x, ldx, w, C, state, seg, out, ldo); break;
        case 5: conv1d_silu_kernel<5><<<grid, 128, 0, s>>>(x, ldx, w, C, state, seg, out, ldo); break;
        case 6: conv1d_silu_kernel<6><<<grid, 128, 0, s>>>(x, ldx, w, C, state, seg, out, ldo); break;
        default: fail(strfmt("CUDA conv1d: kernel size %d not supported (2..6)", K));
    }
    QINFER_CUDA_LAUNCHED("conv1d_silu");
}

void gated_delta_rule(const DeltaArgs& a, const Segment* seg, int n_seg, int max_seg_len, cudaStream_t s) {
    (void)max_seg_len;
    if (n_seg == 0) return;
    if (a.Hv % a.Hk != 0) fail(strfmt("CUDA delta rule: %d value heads over %d key heads", a.Hv, a.Hk));
    const int rows_per_block = GDR_WARPS * GDR_ROWS;
    const dim3 grid(static_cast<unsigned>(ceil_div(a.dv, rows_per_block)), static_cast<unsigned>(a.Hv),
                    static_cast<unsigned>(n_seg));
    switch (a.dk) {
        case 32: gdr_seq_kernel<1><<<grid, GDR_WARPS * WARP, 0, s>>>(a, seg); break;
        case 64: gdr_seq_kernel<2><<<grid, GDR_WARPS * WARP, 0, s>>>(a, seg); break;
        case 128: gdr_seq_kernel<4><<<grid, GDR_WARPS * WARP, 0, s>>>(a, seg); break;
        case 256: gdr_seq_kernel<8><<<grid, GDR_WARPS * WARP, 0, s>>>(a, seg); break;
        default: fail(strfmt("CUDA delta rule: key head dim %d not supported (32, 64, 128, 256)", a.dk));
    }
    QINFER_CUDA_LAUNCHED("gated_delta_rule");
}

}  // namespace qinfer::cuda
