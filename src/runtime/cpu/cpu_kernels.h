// Scalar activation functions shared by the CPU ops (spec/models.md §1).
#pragma once
#include <cmath>

namespace qinfer::cpu {

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float silu(float x) { return x / (1.f + std::exp(-x)); }
// Threshold 20 as ggml and PyTorch (spec pitfall 4).
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

}  // namespace qinfer::cpu
