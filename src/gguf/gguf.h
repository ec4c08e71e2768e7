// GGUF reader (spec/gguf.md): validates everything it reads and memory-maps
// tensor data. A model may span several shard files; `File` presents them as
// one: metadata from shard 0, tensors from all shards.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mapped_file.h"
#include "quant/types.h"

namespace qinfer::gguf {

enum class ValueType : uint32_t {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Strings and array elements are views into the mapped file
// (not NUL-terminated): they live as long as the File.
struct Value {
    ValueType type = ValueType::U8;
    // scalars (the field matching `type` is set; integers are also widened into i/u)
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    std::string_view str;
    // arrays
    ValueType elem_type = ValueType::U8;
    uint64_t count = 0;
    const uint8_t* elems = nullptr;          // raw little-endian elements (numeric/bool arrays)
    std::vector<std::string_view> strings;   // string arrays
    std::vector<Value> nested;               // arrays of arrays (spec allows; no known key uses)

    bool is_integer() const;
    bool is_array() const { return type == ValueType::ARRAY; }
    // Element accessors for numeric/bool arrays (index < count); throw on other arrays.
    // int_at returns u64 elements bit-cast; a float that is not representable as an
    // int64 (NaN, huge) is an error, not undefined behaviour.
    int64_t int_at(uint64_t idx) const;
    double float_at(uint64_t idx) const;
};

struct TensorInfo {
    std::string name;
    GgmlType type = GgmlType::F32;
    uint32_t n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};
    uint64_t offset = 0;          // relative to its shard's data section
    uint64_t file_offset = 0;     // absolute byte offset in its shard file
    uint64_t nbytes = 0;
    uint32_t shard = 0;
    const uint8_t* data = nullptr;  // points into the mapped shard

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
};

struct KeyValue {
    std::string key;
    Value value;
};

class File {
public:
    File(const File&) = delete;  // the indexes hold views into this object
    File& operator=(const File&) = delete;

    // Opens a GGUF file; if its name is `<prefix>-00001-of-0000N.gguf`, opens all shards.
    // Throws qinfer::Error with "gguf: <file>: <message> (offset O)" on any problem.
    static std::unique_ptr<File> open(const std::string& path);
    // Parse from memory (fuzzing, tests). `name` is used in messages. The buffer must outlive File.
    static std::unique_ptr<File> parse_memory(const uint8_t* data, size_t size, const std::string& name);

    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    const std::string& path() const { return path_; }
    size_t n_shards() const { return shards_.empty() ? 1 : shards_.size(); }
    uint64_t total_file_bytes() const { return total_file_bytes_; }

    const std::vector<KeyValue>& metadata() const { return kvs_; }
    const Value* find(std::string_view key) const;
    bool has(std::string_view key) const { return find(key) != nullptr; }

    // Typed getters. Integers: any integer type is accepted when the value fits.
    // Missing key -> default (if given) or Error naming the key.
    std::optional<uint64_t> get_uint(std::string_view key) const;
    std::optional<int64_t> get_int(std::string_view key) const;
    std::optional<double> get_float(std::string_view key) const;
    std::optional<bool> get_bool(std::string_view key) const;
    std::optional<std::string_view> get_string(std::string_view key) const;
    uint64_t require_uint(std::string_view key) const;
    double require_float(std::string_view key) const;
    std::string_view require_string(std::string_view key) const;
    // Array of strings (e.g. tokenizer.ggml.tokens); nullptr if absent, Error if wrong type.
    const std::vector<std::string_view>* get_string_array(std::string_view key) const;

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(std::string_view name) const;

    // Warnings collected during parsing (non-canonical layout, odd bool bytes, ...).
    const std::vector<std::string>& warnings() const { return warnings_; }

private:
    File() = default;
    // Parses one shard; shard 0's metadata becomes the file's. n_shards > 1 also
    // checks the shard's split.no / split.count keys.
    void parse_shard(const uint8_t* data, size_t size, const std::string& name, uint32_t shard_idx,
                     uint32_t n_shards);
    void index();

    std::string path_;
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    uint64_t total_file_bytes_ = 0;
    std::vector<MappedFile> shards_;
    std::vector<KeyValue> kvs_;
    std::unordered_map<std::string_view, size_t> kv_index_;
    std::vector<TensorInfo> tensors_;
    std::unordered_map<std::string_view, size_t> tensor_index_;  // views into the mapped files
    std::vector<std::string> warnings_;
};

}  // namespace qinfer::gguf
