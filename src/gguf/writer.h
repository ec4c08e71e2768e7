// GGUF v3 writer (spec/gguf.md). Metadata is encoded when it is set (it is
// small: even a 150k-entry token array is a few MB); tensor data is streamed to
// the file one tensor at a time at write(), so a multi-GB model never has to be
// in memory. Layout is canonical: tensors in the order they were added, each
// starting at a multiple of general.alignment and zero-padded to the next one.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/gguf.h"

namespace qinfer::gguf {

// Receives a tensor's bytes in order, in pieces of any size.
using ByteSink = std::function<void(const void* data, size_t n)>;
// Produces exactly nbytes of one tensor by calling `write` any number of times.
using TensorProducer = std::function<void(const ByteSink& write)>;

class Writer {
public:
    Writer() = default;

    // ---- metadata. Setting a key again replaces its value and keeps its position.
    void set_u8(std::string_view key, uint8_t v);
    void set_i8(std::string_view key, int8_t v);
    void set_u16(std::string_view key, uint16_t v);
    void set_i16(std::string_view key, int16_t v);
    void set_u32(std::string_view key, uint32_t v);
    void set_i32(std::string_view key, int32_t v);
    void set_u64(std::string_view key, uint64_t v);
    void set_i64(std::string_view key, int64_t v);
    void set_f32(std::string_view key, float v);
    void set_f64(std::string_view key, double v);
    void set_bool(std::string_view key, bool v);
    void set_string(std::string_view key, std::string_view v);
    // Numeric or bool array from `count` packed little-endian elements of `elem_type`
    // (bool: one byte each, 0 or 1).
    void set_array(std::string_view key, ValueType elem_type, const void* elems, uint64_t count);
    template <class T> void set_array(std::string_view key, std::span<const T> v) {
        set_array(key, value_type_of(static_cast<const T*>(nullptr)), v.data(), v.size());
    }
    template <class T> void set_array(std::string_view key, const std::vector<T>& v) {
        set_array(key, std::span<const T>(v));
    }
    void set_bool_array(std::string_view key, const std::vector<bool>& v);
    void set_string_array(std::string_view key, std::span<const std::string> v);
    void set_string_array(std::string_view key, std::span<const std::string_view> v);
    // Any value as the reader returns it (including nested arrays): copies a key
    // from another file verbatim.
    void set_value(std::string_view key, const Value& v);
    void set(const KeyValue& kv) { set_value(kv.key, kv.value); }
    // Every key of `f` for which keep(key) is true (default: all).
    void copy_metadata(const File& f, const std::function<bool(std::string_view)>& keep = {});
    bool remove(std::string_view key);
    bool has(std::string_view key) const { return kv_index_.count(std::string(key)) != 0; }
    size_t n_kv() const { return kvs_.size(); }

    // general.alignment (u32, power of two). Absent -> 32 and no key is written.
    void set_alignment(uint32_t a) { set_u32("general.alignment", a); }
    uint32_t alignment() const;

    // ---- tensors, written in the order added. `ne` has 1..4 dims, ne[0] first.
    // `data` must stay valid until write() returns.
    void add_tensor(std::string_view name, GgmlType type, std::span<const int64_t> ne, const void* data);
    void add_tensor(std::string_view name, GgmlType type, std::span<const int64_t> ne, TensorProducer produce);
    void add_tensor(std::string_view name, GgmlType type, std::initializer_list<int64_t> ne, const void* data) {
        add_tensor(name, type, std::span<const int64_t>(ne.begin(), ne.size()), data);
    }
    void add_tensor(std::string_view name, GgmlType type, std::initializer_list<int64_t> ne, TensorProducer produce) {
        add_tensor(name, type, std::span<const int64_t>(ne.begin(), ne.size()), std::move(produce));
    }
    size_t n_tensors() const { return tensors_.size(); }
    // Bytes of tensor data (sum of each tensor's size padded to the alignment).
    uint64_t data_size() const;
    // Exact size of the file write() produces.
    uint64_t file_size() const;
    // What write() emits before the first tensor's bytes: header, metadata, tensor
    // infos and the padding up to the data section. Lets a tool lay out the data
    // itself (e.g. a sparse test file: these bytes, then resize to file_size()).
    std::vector<uint8_t> header_bytes() const;

    // Writes the file (via `<path>.tmp`, renamed on success, so a failure never
    // leaves a truncated model behind). Throws Error naming the file.
    void write(const std::string& path) const;
    // The whole file in memory (tests, fuzz seeds; small files only).
    std::vector<uint8_t> to_bytes() const;

    // Writes `<prefix>-0000i-of-0000N.gguf` shards (spec §10): tensors in order,
    // a new shard whenever the next tensor would push a shard's data past
    // max_shard_bytes (every shard holds at least one tensor). Shard 0 carries all
    // metadata; others only split.* (and general.alignment). Returns the paths.
    std::vector<std::string> write_split(const std::string& prefix, uint64_t max_shard_bytes) const;

private:
    struct Tensor {
        std::string name;
        GgmlType type;
        uint32_t n_dims;
        int64_t ne[4];
        uint64_t nbytes;
        const void* data;          // or:
        TensorProducer produce;
    };
    struct Kv {
        std::string key;
        std::vector<uint8_t> encoded;  // type tag + value, as in the file
    };

    static ValueType value_type_of(const uint8_t*) { return ValueType::U8; }
    static ValueType value_type_of(const int8_t*) { return ValueType::I8; }
    static ValueType value_type_of(const uint16_t*) { return ValueType::U16; }
    static ValueType value_type_of(const int16_t*) { return ValueType::I16; }
    static ValueType value_type_of(const uint32_t*) { return ValueType::U32; }
    static ValueType value_type_of(const int32_t*) { return ValueType::I32; }
    static ValueType value_type_of(const uint64_t*) { return ValueType::U64; }
    static ValueType value_type_of(const int64_t*) { return ValueType::I64; }
    static ValueType value_type_of(const float*) { return ValueType::F32; }
    static ValueType value_type_of(const double*) { return ValueType::F64; }

    void put(std::string_view key, std::vector<uint8_t> encoded);
    Tensor& new_tensor(std::string_view name, GgmlType type, std::span<const int64_t> ne);
    // Header + metadata + tensor infos + padding for the tensors [first, last).
    std::vector<uint8_t> header(const std::vector<const Kv*>& kvs, size_t first, size_t last) const;
    void emit(const ByteSink& out, const std::vector<const Kv*>& kvs, size_t first, size_t last) const;
    void write_file(const std::string& path, const std::vector<const Kv*>& kvs, size_t first, size_t last) const;

    std::vector<Kv> kvs_;
    std::unordered_map<std::string, size_t> kv_index_;
    std::vector<Tensor> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace qinfer::gguf
