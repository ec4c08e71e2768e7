// Golden vectors from ggml (reference/quant-vectors): our dequantization must be
// bit-exact and our reference quantization byte-identical to ggml's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "testutil.h"

using namespace qinfer;

namespace {

const char* kTypes[] = {"F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"};

std::string vec_path(const std::string& type, const char* what) {
    return test::reference_path("quant-vectors/" + type + "." + what);
}

GgmlType type_of(const std::string& name) {
    auto t = type_from_name(name);
    EXPECT_TRUE(t.has_value()) << name;
    return *t;
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

}  // namespace

TEST(QuantVectors, DequantizeIsBitExact) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    for (const char* name : kTypes) {
        const GgmlType t = type_of(name);
        const auto q = test::read_bytes(vec_path(name, "quant.bin"));
        const auto want = test::read_f32(vec_path(name, "dequant.f32"));
        ASSERT_EQ(want.size(), 4096u) << name;
        ASSERT_EQ(q.size(), row_bytes(t, 4096)) << name;
        std::vector<float> got(4096);
        dequantize_row(t, q.data(), got.data(), 4096);
        int bad = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            if (bits(got[i]) != bits(want[i]) && bad++ < 5)
                ADD_FAILURE() << name << " element " << i << ": got " << got[i] << " want " << want[i];
        }
        EXPECT_EQ(bad, 0) << name << ": " << bad << " elements differ";
    }
}

TEST(QuantVectors, QuantizeIsByteIdentical) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    for (const char* name : kTypes) {
        const GgmlType t = type_of(name);
        const auto x = test::read_f32(vec_path(name, "input.f32"));
        const auto want = test::read_bytes(vec_path(name, "quant.bin"));
        ASSERT_EQ(x.size(), 4096u);
        std::vector<uint8_t> got(row_bytes(t, 4096));
        EXPECT_EQ(quantize_row(t, x.data(), got.data(), 4096), got.size());
        const size_t bsize = traits(t).type_size;
        int bad_blocks = 0;
        for (size_t off = 0; off < got.size(); off += bsize) {
            if (std::memcmp(got.data() + off, want.data() + off, bsize) != 0 && bad_blocks++ < 3) {
                size_t b = off;
                while (got[b] == want[b]) ++b;
                ADD_FAILURE() << name << " block " << off / bsize << " differs first at byte " << b - off
                              << ": got " << int(got[b]) << " want " << int(want[b]);
            }
        }
        EXPECT_EQ(bad_blocks, 0) << name << ": " << bad_blocks << " blocks differ";
    }
}

TEST(QuantVectors, RoundTripErrorIsSmall) {
    // Independent of the golden bytes: quantize -> dequantize stays within a
    // bound that scales with the number of bits (catches layout mix-ups that a
    // symmetric quantize/dequantize bug could hide from the tests above).
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    const auto x = test::read_f32(vec_path("Q8_0", "input.f32"));
    double rms_x = 0;
    for (float v : x) rms_x += double(v) * v;
    rms_x = std::sqrt(rms_x / double(x.size()));
    struct Bound { const char* type; double max_rel_rmse; };
    for (Bound b : {Bound{"Q8_0", 0.01}, {"Q8_K", 0.01}, {"Q6_K", 0.03}, {"Q5_K", 0.05}, {"Q5_0", 0.06},
                    {"Q5_1", 0.06}, {"Q4_K", 0.09}, {"Q4_0", 0.12}, {"Q4_1", 0.12}, {"Q3_K", 0.2},
                    {"Q2_K", 0.4}, {"F16", 1e-3}, {"BF16", 1e-2}}) {
        const GgmlType t = type_of(b.type);
        std::vector<uint8_t> q(row_bytes(t, 4096));
        quantize_row(t, x.data(), q.data(), 4096);
        std::vector<float> y(4096);
        dequantize_row(t, q.data(), y.data(), 4096);
        double se = 0;
        for (size_t i = 0; i < x.size(); ++i) se += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
        const double rel = std::sqrt(se / double(x.size())) / rms_x;
        EXPECT_LT(rel, b.max_rel_rmse) << b.type;
        EXPECT_GT(rel, 0.0) << b.type;  // the input is not exactly representable in any of them
    }
}

TEST(QuantVectors, ZeroBlocksQuantizeToZero) {
    std::vector<float> zeros(512, 0.f), back(512, 1.f);
    for (const char* name : kTypes) {
        const GgmlType t = type_of(name);
        std::vector<uint8_t> q(row_bytes(t, 512), 0xAB);
        quantize_row(t, zeros.data(), q.data(), 512);
        dequantize_row(t, q.data(), back.data(), 512);
        for (float v : back) ASSERT_EQ(v, 0.f) << name;
    }
}

TEST(QuantVectors, UnsupportedTypesNameTheType) {
    float buf[256] = {};
    uint8_t q[1024] = {};
    try {
        dequantize_row(GgmlType::IQ2_XXS, q, buf, 256);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos) << e.what();
    }
    try {
        quantize_row(GgmlType::MXFP4, buf, q, 32);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("MXFP4"), std::string::npos) << e.what();
    }
    EXPECT_THROW(dequantize_row(GgmlType::Q4_K, q, buf, 100), Error);  // not a multiple of 256
    EXPECT_THROW(quantize_row(GgmlType::Q8_0, buf, q, 33), Error);
}
