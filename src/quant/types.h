// ggml tensor type ids as stored in GGUF, with their block geometry.
// One table, used by the GGUF reader, dequantization, kernels and `info`.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace qinfer {

enum class GgmlType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
    IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41, Q2_0 = 42,
};

struct TypeTraits {
    const char* name;
    uint32_t block_size;   // elements per block (1 for plain types)
    uint32_t type_size;    // bytes per block
    bool supported;        // we can dequantize / compute with it
};

// nullopt for ids that are unknown or removed (4, 5, 31-33, 36-38, >= 43).
std::optional<TypeTraits> type_traits(uint32_t id);
const TypeTraits& traits(GgmlType t);  // t must be valid
inline const char* type_name(GgmlType t) { return traits(t).name; }
std::optional<GgmlType> type_from_name(std::string_view name);  // case-insensitive: "q4_k", "F16"

// Bytes of one row of n elements (n must be a multiple of the block size).
inline size_t row_bytes(GgmlType t, int64_t n) {
    const TypeTraits& tt = traits(t);
    return size_t(n / tt.block_size) * tt.type_size;
}
inline bool is_quantized(GgmlType t) { return traits(t).block_size > 1; }

}  // namespace qinfer
