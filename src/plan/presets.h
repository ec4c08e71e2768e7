// Models that are not on disk: shape presets (spec/models.md §0, §5.1, §9.3)
// and the tensor table that llama.cpp's converter plus llama-quantize would
// write for them at a given file type (spec/quants.md §9: which tensor gets
// which type, including the use_more_bits promotions and shape fallbacks).
// Used by `qinfer plan --arch-preset` and the worked examples in
// docs/memory-planning.md; checked against the reference tiny GGUFs.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/model_desc.h"

namespace qinfer {

// llama-quantize ftypes we can predict (plus the plain float conversions).
enum class FileType { F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S };
const char* file_type_name(FileType ft);                          // "q4_k_m"
std::optional<FileType> file_type_from_name(std::string_view s);  // case-insensitive
std::vector<std::string> file_type_names();

// The tensor table of a file with these hyperparameters at file type `ft`:
// no MTP layer, no imatrix, no per-tensor overrides. Tensors come in
// llama-quantize's visiting order (globals, then by layer, by name within a layer).
std::vector<TensorEntry> synthesize_tensors(const HParams& hp, FileType ft);

// Shape presets by name ("qwen35-4b", "qwen3-4b", "qwen35-tiny", ...).
std::vector<std::string> shape_preset_names();
std::optional<HParams> shape_preset(std::string_view name);

// "qwen35-4b-q4_k_m", or a shape name alone (Q4_K_M). Throws Error listing
// the known presets and file types on an unknown name.
ModelDesc preset_model(std::string_view spec);

}  // namespace qinfer
