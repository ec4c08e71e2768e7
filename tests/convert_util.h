// Helpers for the convert tests: writing small safetensors files and HF folders.
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fp16.h"

namespace qinfer::test {

struct StEntry {
    std::string name;
    std::string dtype;  // F32, F16, BF16 (values converted), or anything else (raw zero bytes)
    std::vector<int64_t> shape;
    std::vector<float> values;
};

inline std::vector<uint8_t> encode_st(const std::vector<StEntry>& ts) {
    nlohmann::json h = nlohmann::json::object();
    std::vector<uint8_t> data;
    for (const StEntry& t : ts) {
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        size_t begin = data.size();
        if (t.dtype == "F32") {
            for (int64_t i = 0; i < n; ++i) {
                uint8_t b[4];
                std::memcpy(b, &t.values[size_t(i)], 4);
                data.insert(data.end(), b, b + 4);
            }
        } else if (t.dtype == "F16" || t.dtype == "BF16") {
            for (int64_t i = 0; i < n; ++i) {
                uint16_t x = t.dtype == "F16" ? fp32_to_fp16(t.values[size_t(i)]) : fp32_to_bf16(t.values[size_t(i)]);
                data.push_back(uint8_t(x & 0xff));
                data.push_back(uint8_t(x >> 8));
            }
        } else {
            size_t es = t.dtype == "I64" ? 8 : t.dtype == "I32" ? 4 : t.dtype == "I16" ? 2 : 1;
            data.insert(data.end(), size_t(n) * es, 0);
        }
        h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
    }
    h["__metadata__"] = {{"format", "pt"}};
    std::string hs = h.dump();
    std::vector<uint8_t> out(8);
    uint64_t n = hs.size();
    for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(n >> (8 * i));
    out.insert(out.end(), hs.begin(), hs.end());
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

inline void write_file(const std::string& path, const std::string& s) {
    std::ofstream f(path, std::ios::binary);
    f.write(s.data(), std::streamsize(s.size()));
}
inline void write_file(const std::string& path, const std::vector<uint8_t>& b) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// Deterministic pseudo-random values in [-scale, scale): distinct per element,
// so a misplaced row or column shows up as a mismatch.
inline std::vector<float> rand_values(int64_t n, float scale, uint64_t seed) {
    std::vector<float> v(static_cast<size_t>(n));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& x : v) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x = scale * (float(s >> 40) / 8388608.0f - 1.0f);
    }
    return v;
}

}  // namespace qinfer::test
