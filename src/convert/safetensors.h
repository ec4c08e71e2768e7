// Reader for Hugging Face safetensors checkpoints: one file or several shards
// listed by model.safetensors.index.json. Files are memory-mapped; every header
// field is validated (offsets inside the file, dtype sizes against shapes, no
// overlaps) before a tensor's bytes are touched.
//
// Format: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {...}}, then the data; offsets are relative to the data start.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mapped_file.h"

namespace qinfer::convert {

enum class StDtype { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2, U16, U32, U64 };
const char* st_dtype_name(StDtype t);
size_t st_dtype_size(StDtype t);

struct StTensor {
    std::string name;
    StDtype dtype = StDtype::F32;
    std::vector<int64_t> shape;   // PyTorch order: shape[0] is the slowest dimension
    const uint8_t* data = nullptr;
    uint64_t nbytes = 0;
    const std::string* file = nullptr;  // the shard it lives in (for messages)

    int64_t n_elements() const;
    std::string shape_str() const;  // "[2048, 1024]"
};

// One .safetensors file.
class SafetensorsFile {
public:
    // Throws Error "safetensors: <path>: <problem>".
    explicit SafetensorsFile(const std::string& path);
    // Parse from memory (tests); `data` must outlive the object.
    SafetensorsFile(const uint8_t* data, size_t size, const std::string& name);

    const std::string& path() const { return path_; }
    const std::vector<StTensor>& tensors() const { return tensors_; }

private:
    void parse(const uint8_t* data, size_t size);
    std::string path_;
    MappedFile map_;
    std::vector<StTensor> tensors_;
};

// All tensors of a checkpoint folder, by name.
class Checkpoint {
public:
    // Opens model.safetensors.index.json (and every shard it names) if present,
    // else every *.safetensors file in `dir`. Missing shards, tensors listed in
    // the index but absent from their shard, and duplicate names are errors.
    static std::unique_ptr<Checkpoint> open_dir(const std::string& dir);

    const StTensor* find(const std::string& name) const;
    const std::vector<const StTensor*>& tensors() const { return order_; }
    size_t n_files() const { return files_.size(); }

private:
    void add(std::unique_ptr<SafetensorsFile> f);
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::unordered_map<std::string, const StTensor*> by_name_;
    std::vector<const StTensor*> order_;
};

// Converts elements [first, first + n) of a float tensor (F32, F16, BF16, F64) to
// f32. Throws Error for other dtypes.
void st_read_f32(const StTensor& t, int64_t first, int64_t n, float* dst);
bool st_is_float(StDtype t);

}  // namespace qinfer::convert
