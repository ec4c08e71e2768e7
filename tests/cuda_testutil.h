// Helpers shared by the CUDA tests (they skip where no GPU is present, so the
// CPU-only CI still builds and lists them).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "runtime/backend.h"

namespace qinfer::test {

inline bool have_gpu() { return cuda_device_count() > 0; }

// n values from Normal(mean, scale) with a fixed seed.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f, float mean = 0.f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(mean, scale);
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
}

}  // namespace qinfer::test

#define REQUIRE_GPU() \
    if (!::qinfer::test::have_gpu()) GTEST_SKIP() << "no CUDA device"
