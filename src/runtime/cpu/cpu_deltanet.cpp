// Gated DeltaNet pieces (spec/models.md §5.6): the causal depthwise conv with
// its rolling state, and the gated delta rule evaluated sequentially per token
// (the definition), parallel over segments and value heads.
#include <cmath>
#include <vector>

#include "common/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/cpu_vec.h"

namespace qinfer {

void CpuBackend::conv1d_silu(const Tensor& x, const Tensor& w, const RecurrentState& state, const StepInfo& step,
                             const Tensor& out) {
    flush();
    const int64_t C = x.ne[0], T = x.ne[1], K = w.ne[0];
    const Tensor& cs = state.conv;
    if (T != step.n_tokens || w.ne[1] != C || cs.ne[0] != C || cs.ne[1] != K - 1 || out.ne[0] != C || out.ne[1] != T)
        fail(strfmt("conv1d: x %s, w %s, state %s, out %s do not fit", shape_str(x).c_str(), shape_str(w).c_str(),
                    shape_str(cs).c_str(), shape_str(out).c_str()));
    const float* wv = static_cast<const float*>(w.data);
    const int64_t n_seg = int64_t(step.segments.size());
    // Item (segment, channel): the window of one channel is [state rows; segment tokens].
    parallel_rows(n_seg * C, double(T * K) / double(n_seg), [&](int64_t i0, int64_t i1) {
        std::vector<float> win;
        for (int64_t i = i0; i < i1; ++i) {
            const StepInfo::Segment& sg = step.segments[size_t(i / C)];
            const int64_t c = i % C, n = sg.count;
            win.resize(size_t(K - 1 + n));
            for (int64_t r = 0; r < K - 1; ++r) win[size_t(r)] = cs.row<float>(r, sg.slot)[c];
            for (int64_t t = 0; t < n; ++t) win[size_t(K - 1 + t)] = x.row<float>(sg.first + t)[c];
            const float* wc = wv + c * K;
            for (int64_t t = 0; t < n; ++t) {
                float acc = 0;
                for (int64_t r = 0; r < K; ++r) acc += wc[r] * win[size_t(t + r)];
                out.row<float>(sg.first + t)[c] = cpu::silu(acc);
            }
            for (int64_t r = 0; r < K - 1; ++r) cs.row<float>(r, sg.slot)[c] = win[size_t(n + r)];
        }
    });
}

void CpuBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a,
                                  const Tensor& b, const Tensor& dt_bias, const Tensor& ssm_a,
                                  const RecurrentState& state, const StepInfo& step, const Tensor& out) {
    flush();
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
                const float* vt = v.row<float>(j, t);
                float* ot = out.row<float>(j, t);
                for (int64_t r = 0; r < dv; ++r) {
                    float* Sr = Sj + r * dk;
                    // decay first; S k uses the decayed state
                    const float sk = vo.scale_dot(Sr, alpha, kt, dk);
                    const float delta = beta * (vt[r] - sk);
                    // rank-1 update; the read-out uses the updated state
                    ot[r] = vo.axpy_dot(Sr, delta, kt, qt, dk) * scale;
                }
            }
        }
    });
}

}  // namespace qinfer
