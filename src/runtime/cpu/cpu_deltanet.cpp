// Gated DeltaNet pieces (spec/models.md §5.6): the causal depthwise conv with
// its rolling state, and the gated delta rule evaluated sequentially per token
// (the definition), parallel over segments and value heads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/cpu_vec.h"

namespace qinfer {

void CpuBackend::conv1d_silu(const Tensor& x, const Tensor& w, const RecurrentState& state, const StepInfo& step,
                             const Tensor& out) {
    flush();
    const OpTimer timer(profile_.get(), "conv1d_silu");
    const int64_t C = x.ne[0], T = x.ne[1], K = w.ne[0];
    const Tensor& cs = state.conv;
    if (T != step.n_tokens || w.ne[1] != C || cs.ne[0] != C || cs.ne[1] != K - 1 || out.ne[0] != C || out.ne[1] != T)
        fail(strfmt("conv1d: x %s, w %s, state %s, out %s do not fit", shape_str(x).c_str(), shape_str(w).c_str(),
                    shape_str(cs).c_str(), shape_str(out).c_str()));
    const float* wv = static_cast<const float*>(w.data);
    const int64_t n_seg = int64_t(step.segments.size());
    // Item (segment, block of channels), so the inner loops run over
    // consecutive channels and a decode step's ~8k channels spread over the
    // pool. Row j of a segment's window is [state rows; segment tokens][j].
    constexpr int64_t kBlock = 64;
    const int64_t n_blocks = (C + kBlock - 1) / kBlock;
    const double work = double(kBlock * (K + 16)) * double(T) / double(n_seg);  // + silu's exp
    const cpu::VecOps& vo = cpu::vec();
    parallel_rows(n_seg * n_blocks, work, [&](int64_t i0, int64_t i1) {
        float acc[kBlock];
        std::vector<float> taps(size_t(K * kBlock));  // the block's weights by tap: taps[r * kBlock + c]
        for (int64_t i = i0; i < i1; ++i) {
            const StepInfo::Segment& sg = step.segments[size_t(i / n_blocks)];
            const int64_t c0 = (i % n_blocks) * kBlock, nc = std::min(kBlock, C - c0), n = sg.count;
            auto window = [&](int64_t j) {
                return (j < K - 1 ? cs.row<float>(j, sg.slot) : x.row<float>(sg.first + j - (K - 1))) + c0;
            };
            for (int64_t r = 0; r < K; ++r)
                for (int64_t c = 0; c < nc; ++c) taps[size_t(r * kBlock + c)] = wv[(c0 + c) * K + r];
            for (int64_t t = 0; t < n; ++t) {
                for (int64_t c = 0; c < nc; ++c) acc[c] = 0;
                for (int64_t r = 0; r < K; ++r) {
                    const float* wr = window(t + r);
                    const float* tr = &taps[size_t(r * kBlock)];
                    for (int64_t c = 0; c < nc; ++c) acc[c] += tr[c] * wr[c];
                }
                vo.silu(acc, out.row<float>(sg.first + t) + c0, nc);
            }
            // The new state is the window's last K-1 rows; ascending order reads
            // each old state row before it is overwritten.
            for (int64_t r = 0; r < K - 1; ++r) {
                const float* src = window(n + r);
                float* dst = cs.row<float>(r, sg.slot) + c0;
                if (src != dst) std::memcpy(dst, src, size_t(nc) * sizeof(float));
            }
        }
    });
}

void CpuBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a,
                                  const Tensor& b, const Tensor& dt_bias, const Tensor& ssm_a,
                                  const RecurrentState& state, const StepInfo& step, const Tensor& out) {
    flush();
    const OpTimer timer(profile_.get(), "gated_delta_rule");
    const int64_t dk = q.ne[0], Hk = q.ne[1], T = q.ne[2];
    const int64_t dv = v.ne[0], Hv = v.ne[1];
    const Tensor& S = state.S;
    if (T != step.n_tokens || k.ne[0] != dk || k.ne[1] != Hk || v.ne[2] != T || Hv % Hk != 0 || a.ne[0] != Hv ||
        b.ne[0] != Hv || S.ne[0] != dk || S.ne[1] != dv || S.ne[2] != Hv || out.ne[0] != dv || out.ne[1] != Hv)
        fail(strfmt("gated_delta_rule: q %s, v %s, state %s, out %s do not fit", shape_str(q).c_str(),
                    shape_str(v).c_str(), shape_str(S).c_str(), shape_str(out).c_str()));
    const float* dtb = static_cast<const float*>(dt_bias.data);
    const float* A = static_cast<const float*>(ssm_a.data);
    const float scale = 1.f / std::sqrt(float(dk));
    const int64_t n_seg = int64_t(step.segments.size());
    const cpu::VecOps& vo = cpu::vec();

    parallel_rows(n_seg * Hv, 4.0 * double(T) / double(n_seg) * double(dv * dk), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const StepInfo::Segment& sg = step.segments[size_t(i / Hv)];
            const int64_t j = i % Hv, kh = j % Hk;  // tiled value-head -> key-head mapping
            float* Sj = S.row<float>(0, j, sg.slot);  // d_v rows of d_k
            for (int64_t t = sg.first; t < sg.first + sg.count; ++t) {
                const float g = cpu::softplus(a.row<float>(t)[j] + dtb[j]) * A[j];
                const float alpha = std::exp(g);
                const float beta = cpu::sigmoid(b.row<float>(t)[j]);
                const float* kt = k.row<float>(kh, t);
                const float* qt = q.row<float>(kh, t);
                // decay first, S k on the decayed state; the read-out uses the updated state
                vo.delta_step(Sj, dv, dk, alpha, beta, kt, qt, v.row<float>(j, t), scale, out.row<float>(j, t));
            }
        }
    });
}

}  // namespace qinfer
