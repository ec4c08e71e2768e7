// The branch-free pair extraction of Q4_K / Q5_K scales that the GPU products
// use must give what get_scale_min_k4 gives for each sub-block.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>

#include "quant/blocks.h"

using namespace qinfer;

namespace {

void expect_pairs_match(const uint8_t (&scales)[12]) {
    uint32_t w[3];
    std::memcpy(w, scales, sizeof(w));  // the three words a 16-byte header load holds after d / dmin
    for (int g = 0; g < 4; ++g) {
        int sc0 = -1, m0 = -1, sc1 = -1, m1 = -1;
        get_scale_min_k4_pair(g, w[0], w[1], w[2], sc0, m0, sc1, m1);
        uint8_t e_sc0, e_m0, e_sc1, e_m1;
        get_scale_min_k4(2 * g, scales, &e_sc0, &e_m0);
        get_scale_min_k4(2 * g + 1, scales, &e_sc1, &e_m1);
        ASSERT_EQ(sc0, e_sc0) << "g " << g;
        ASSERT_EQ(m0, e_m0) << "g " << g;
        ASSERT_EQ(sc1, e_sc1) << "g " << g;
        ASSERT_EQ(m1, e_m1) << "g " << g;
    }
}

TEST(QuantScaleK4, PairEqualsOneSubBlockAtATime) {
    // every byte value in every position, the others fixed to patterns that
    // expose a bit carried between neighbouring bytes
    for (uint8_t fill : {uint8_t(0x00), uint8_t(0xFF), uint8_t(0xC0), uint8_t(0x3F), uint8_t(0x0F), uint8_t(0xF0)})
        for (int pos = 0; pos < 12; ++pos)
            for (int v = 0; v < 256; ++v) {
                uint8_t s[12];
                std::memset(s, fill, sizeof(s));
                s[pos] = uint8_t(v);
                expect_pairs_match(s);
            }
    std::mt19937 rng(7);
    for (int it = 0; it < 200000; ++it) {
        uint8_t s[12];
        for (uint8_t& b : s) b = uint8_t(rng());
        expect_pairs_match(s);
    }
}

}  // namespace
