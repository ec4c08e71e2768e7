// Row-wise and elementwise CPU ops: norms, residual add, gates, RoPE.
#include <cmath>
#include <vector>

#include "common/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_vec.h"

namespace qinfer {

namespace {
// Cost of an element whose op calls exp (silu, sigmoid), in the multiply-adds
// parallel_rows counts: ~5 ns, where its budget assumes ~0.3 ns per unit.
constexpr double kExpWork = 16;

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
    for (int i = 0; i < 4; ++i)
        if (a.ne[i] != b.ne[i])
            fail(strfmt("%s: %s %s and %s %s differ in shape", op, a.name, shape_str(a).c_str(), b.name,
                        shape_str(b).c_str()));
}

// 1/sqrt(mean(x^2) + eps) with the sum of squares in double, as the spec asks.
float rms_scale(const float* x, int64_t n, float eps) {
    const double ss = cpu::vec().sum_squares(x, n);
    return 1.f / std::sqrt(float(ss / double(n)) + eps);
}
}  // namespace

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
    flush();
    const OpTimer timer(profile_.get(), "rms_norm");
    check_same_shape("rms_norm", x, y);
    const int64_t n = x.ne[0];
    if (w.ne[0] != n) fail(strfmt("rms_norm: weight %s %s does not match rows of %lld", w.name, shape_str(w).c_str(),
                                  (long long)n));
    const float* wv = static_cast<const float*>(w.data);
    parallel_rows(x.n_rows(), 3.0 * double(n), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* xr = row_at(x, r);
            float* yr = row_at(y, r);
            const float s = rms_scale(xr, n, eps);
            for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * s) * wv[i];
        }
    });
}

void CpuBackend::l2_norm(const Tensor& x, float eps, const Tensor& y) {
    flush();
    const OpTimer timer(profile_.get(), "l2_norm");
    check_same_shape("l2_norm", x, y);
    const int64_t n = x.ne[0];
    parallel_rows(x.n_rows(), 3.0 * double(n), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* xr = row_at(x, r);
            float* yr = row_at(y, r);
            const float s = 1.f / std::max(float(std::sqrt(cpu::vec().sum_squares(xr, n))), eps);
            for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * s;
        }
    });
}

void CpuBackend::rms_norm_gated(const Tensor& x, const Tensor& w, const Tensor& z, float eps, const Tensor& y) {
    flush();
    const OpTimer timer(profile_.get(), "rms_norm_gated");
    check_same_shape("rms_norm_gated", x, y);
    check_same_shape("rms_norm_gated", x, z);
    const int64_t n = x.ne[0];
    if (w.ne[0] != n) fail(strfmt("rms_norm_gated: weight %s does not match rows of %lld", w.name, (long long)n));
    const float* wv = static_cast<const float*>(w.data);
    const cpu::VecOps& vo = cpu::vec();
    parallel_rows(x.n_rows(), kExpWork * double(n), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* xr = row_at(x, r);
            const float* zr = row_at(z, r);
            float* yr = row_at(y, r);
            const float s = rms_scale(xr, n, eps);
            for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * s) * wv[i];
            vo.silu_mul(zr, yr, yr, n);
        }
    });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
    flush();
    const OpTimer timer(profile_.get(), "add");
    check_same_shape("add", a, b);
    check_same_shape("add", a, y);
    const int64_t n = a.ne[0];
    parallel_rows(a.n_rows(), double(n), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* ar = row_at(a, r);
            const float* br = row_at(b, r);
            float* yr = row_at(y, r);
            for (int64_t i = 0; i < n; ++i) yr[i] = ar[i] + br[i];
        }
    });
}

void CpuBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& y) {
    flush();
    const OpTimer timer(profile_.get(), "swiglu");
    check_same_shape("swiglu", gate, up);
    check_same_shape("swiglu", gate, y);
    const int64_t n = gate.ne[0];
    const cpu::VecOps& vo = cpu::vec();
    parallel_cols(gate.n_rows(), n, kExpWork, [&](int64_t r, int64_t i0, int64_t i1) {
        vo.silu_mul(row_at(gate, r) + i0, row_at(up, r) + i0, row_at(y, r) + i0, i1 - i0);
    });
}

void CpuBackend::sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& y) {
    flush();
    const OpTimer timer(profile_.get(), "sigmoid_mul");
    check_same_shape("sigmoid_mul", x, gate);
    check_same_shape("sigmoid_mul", x, y);
    const int64_t n = x.ne[0];
    const cpu::VecOps& vo = cpu::vec();
    parallel_cols(x.n_rows(), n, kExpWork, [&](int64_t r, int64_t i0, int64_t i1) {
        vo.sigmoid_mul(row_at(x, r) + i0, row_at(gate, r) + i0, row_at(y, r) + i0, i1 - i0);
    });
}

void CpuBackend::rope_neox(const Tensor& x, const StepInfo& step, int n_rot, float base, float freq_scale) {
    flush();
    const OpTimer timer(profile_.get(), "rope_neox");
    const int64_t T = x.ne[2], n_head = x.ne[1], half = n_rot / 2;
    if (T != step.n_tokens || n_rot > x.ne[0] || n_rot % 2)
        fail(strfmt("rope: %s %s does not fit %d tokens / n_rot %d", x.name, shape_str(x).c_str(), step.n_tokens,
                    n_rot));
    // cos/sin per token and pair. Angles in double: accurate at any position
    // (spec pitfall 11), computed once per token rather than per head, and
    // kept for the step's other calls (same positions, same frequencies).
    RopeTable& rt = rope_;
    if (rt.n_rot != n_rot || rt.base != base || rt.freq_scale != freq_scale || rt.pos != step.pos) {
        rt.pos = step.pos;
        rt.n_rot = n_rot;
        rt.base = base;
        rt.freq_scale = freq_scale;
        rt.cs.resize(size_t(T * half * 2));
        std::vector<double> freq(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; ++i) freq[size_t(i)] = std::pow(double(base), -2.0 * double(i) / double(n_rot));
        parallel_rows(T, 40.0 * double(half), [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) {
                const double p = double(step.pos[size_t(t)]) * double(freq_scale);
                for (int64_t i = 0; i < half; ++i) {
                    const double theta = p * freq[size_t(i)];
                    rt.cs[size_t((t * half + i) * 2)] = float(std::cos(theta));
                    rt.cs[size_t((t * half + i) * 2 + 1)] = float(std::sin(theta));
                }
            }
        });
    }
    const std::vector<float>& cs = rt.cs;
    parallel_rows(T * n_head, 4.0 * double(half), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const int64_t t = r / n_head;
            float* v = x.row<float>(r % n_head, t);
            const float* c = &cs[size_t(t * half * 2)];
            for (int64_t i = 0; i < half; ++i) {
                const float a = v[i], b = v[i + half];
                v[i] = a * c[2 * i] - b * c[2 * i + 1];
                v[i + half] = a * c[2 * i + 1] + b * c[2 * i];
            }
        }
    });
}

}  // namespace qinfer
