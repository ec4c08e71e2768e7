#include "gguf/writer.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/error.h"

namespace qinfer::gguf {

// GGUF is little-endian; we write host bytes as they are.
static_assert(std::endian::native == std::endian::little, "GGUF writer assumes a little-endian host");

namespace {

constexpr size_t kMaxTensorName = 63;  // ggml GGML_MAX_NAME (64) includes the NUL
constexpr int kMaxNestedDepth = 8;     // same limit as the reader

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

size_t scalar_size(ValueType t) {
    switch (t) {
        case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
        case ValueType::U16: case ValueType::I16: return 2;
        case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
        case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
        default: return 0;
    }
}

// resize + memcpy rather than insert(): GCC 12 reports false -Warray-bounds on the latter.
void put_bytes(std::vector<uint8_t>& b, const void* p, size_t n) {
    if (n == 0) return;
    size_t at = b.size();
    b.resize(at + n);
    std::memcpy(b.data() + at, p, n);
}
template <class T> void put(std::vector<uint8_t>& b, T v) { put_bytes(b, &v, sizeof(T)); }
void put_str(std::vector<uint8_t>& b, std::string_view s) {
    put<uint64_t>(b, s.size());
    put_bytes(b, s.data(), s.size());
}

std::vector<uint8_t> tagged(ValueType t) {
    std::vector<uint8_t> b(4);
    uint32_t id = uint32_t(t);
    std::memcpy(b.data(), &id, 4);
    return b;
}

// elem_type, count, elements: the body of an ARRAY value (also of a nested element).
void encode_array_body(std::vector<uint8_t>& b, const Value& v, std::string_view key, int depth) {
    if (depth > kMaxNestedDepth)
        fail(strfmt("gguf writer: array '%.*s' nested too deeply", int(key.size()), key.data()));
    put<uint32_t>(b, uint32_t(v.elem_type));
    switch (v.elem_type) {
        case ValueType::STRING:
            put<uint64_t>(b, v.strings.size());
            for (std::string_view s : v.strings) put_str(b, s);
            break;
        case ValueType::ARRAY:
            put<uint64_t>(b, v.nested.size());
            for (const Value& n : v.nested) encode_array_body(b, n, key, depth + 1);
            break;
        default: {
            size_t es = scalar_size(v.elem_type);
            if (es == 0)
                fail(strfmt("gguf writer: array '%.*s' has invalid element type %u", int(key.size()), key.data(),
                            uint32_t(v.elem_type)));
            if (v.count > 0 && !v.elems)
                fail(strfmt("gguf writer: array '%.*s' has no element data", int(key.size()), key.data()));
            put<uint64_t>(b, v.count);
            put_bytes(b, v.elems, size_t(v.count * es));
        }
    }
}

std::filesystem::path fs_path(const std::string& utf8) {
    return std::filesystem::path(std::u8string(utf8.begin(), utf8.end()));
}

}  // namespace

// ---------------------------------------------------------------- metadata

void Writer::put(std::string_view key, std::vector<uint8_t> encoded) {
    if (key.empty()) fail("gguf writer: metadata key is empty");
    if (key == "general.alignment") {
        uint32_t tag = 0, a = 0;
        if (encoded.size() == 8) std::memcpy(&tag, encoded.data(), 4), std::memcpy(&a, encoded.data() + 4, 4);
        if (encoded.size() != 8 || tag != uint32_t(ValueType::U32)) fail("gguf writer: general.alignment must be u32");
        if (a == 0 || (a & (a - 1)) != 0) fail(strfmt("gguf writer: general.alignment %u is not a power of two", a));
    }
    std::string k(key);
    auto it = kv_index_.find(k);
    if (it != kv_index_.end()) {
        kvs_[it->second].encoded = std::move(encoded);
        return;
    }
    kv_index_.emplace(k, kvs_.size());
    kvs_.push_back(Kv{std::move(k), std::move(encoded)});
}

#define QINFER_SET_SCALAR(fn, T, VT)                 \
    void Writer::fn(std::string_view key, T v) {     \
        std::vector<uint8_t> b = tagged(ValueType::VT); \
        gguf::put<T>(b, v);                           \
        put(key, std::move(b));                       \
    }
QINFER_SET_SCALAR(set_u8, uint8_t, U8)
QINFER_SET_SCALAR(set_i8, int8_t, I8)
QINFER_SET_SCALAR(set_u16, uint16_t, U16)
QINFER_SET_SCALAR(set_i16, int16_t, I16)
QINFER_SET_SCALAR(set_u32, uint32_t, U32)
QINFER_SET_SCALAR(set_i32, int32_t, I32)
QINFER_SET_SCALAR(set_u64, uint64_t, U64)
QINFER_SET_SCALAR(set_i64, int64_t, I64)
QINFER_SET_SCALAR(set_f32, float, F32)
QINFER_SET_SCALAR(set_f64, double, F64)
#undef QINFER_SET_SCALAR

void Writer::set_bool(std::string_view key, bool v) {
    std::vector<uint8_t> b = tagged(ValueType::BOOL);
    b.push_back(v ? 1 : 0);
    put(key, std::move(b));
}

void Writer::set_string(std::string_view key, std::string_view v) {
    std::vector<uint8_t> b = tagged(ValueType::STRING);
    put_str(b, v);
    put(key, std::move(b));
}

void Writer::set_array(std::string_view key, ValueType elem_type, const void* elems, uint64_t count) {
    Value v;
    v.type = ValueType::ARRAY;
    v.elem_type = elem_type;
    v.count = count;
    v.elems = static_cast<const uint8_t*>(elems);
    if (elem_type == ValueType::STRING || elem_type == ValueType::ARRAY)
        fail(strfmt("gguf writer: set_array('%.*s') takes numeric elements; use set_string_array/set_value",
                    int(key.size()), key.data()));
    set_value(key, v);
}

void Writer::set_bool_array(std::string_view key, const std::vector<bool>& v) {
    std::vector<uint8_t> bytes(v.size());
    for (size_t i = 0; i < v.size(); ++i) bytes[i] = v[i] ? 1 : 0;
    set_array(key, ValueType::BOOL, bytes.data(), bytes.size());
}

void Writer::set_string_array(std::string_view key, std::span<const std::string> v) {
    std::vector<uint8_t> b = tagged(ValueType::ARRAY);
    gguf::put<uint32_t>(b, uint32_t(ValueType::STRING));
    gguf::put<uint64_t>(b, v.size());
    for (const std::string& s : v) put_str(b, s);
    put(key, std::move(b));
}

void Writer::set_string_array(std::string_view key, std::span<const std::string_view> v) {
    std::vector<uint8_t> b = tagged(ValueType::ARRAY);
    gguf::put<uint32_t>(b, uint32_t(ValueType::STRING));
    gguf::put<uint64_t>(b, v.size());
    for (std::string_view s : v) put_str(b, s);
    put(key, std::move(b));
}

void Writer::set_value(std::string_view key, const Value& v) {
    std::vector<uint8_t> b = tagged(v.type);
    switch (v.type) {
        case ValueType::U8: gguf::put<uint8_t>(b, uint8_t(v.u)); break;
        case ValueType::I8: gguf::put<int8_t>(b, int8_t(v.i)); break;
        case ValueType::U16: gguf::put<uint16_t>(b, uint16_t(v.u)); break;
        case ValueType::I16: gguf::put<int16_t>(b, int16_t(v.i)); break;
        case ValueType::U32: gguf::put<uint32_t>(b, uint32_t(v.u)); break;
        case ValueType::I32: gguf::put<int32_t>(b, int32_t(v.i)); break;
        case ValueType::U64: gguf::put<uint64_t>(b, v.u); break;
        case ValueType::I64: gguf::put<int64_t>(b, v.i); break;
        case ValueType::F32: gguf::put<float>(b, float(v.f)); break;
        case ValueType::F64: gguf::put<double>(b, v.f); break;
        case ValueType::BOOL: b.push_back(v.u ? 1 : 0); break;
        case ValueType::STRING: put_str(b, v.str); break;
        case ValueType::ARRAY: encode_array_body(b, v, key, 0); break;
        default:
            fail(strfmt("gguf writer: key '%.*s' has invalid value type %u", int(key.size()), key.data(),
                        uint32_t(v.type)));
    }
    put(key, std::move(b));
}

void Writer::copy_metadata(const File& f, const std::function<bool(std::string_view)>& keep) {
    for (const KeyValue& kv : f.metadata())
        if (!keep || keep(kv.key)) set(kv);
}

bool Writer::remove(std::string_view key) {
    auto it = kv_index_.find(std::string(key));
    if (it == kv_index_.end()) return false;
    kvs_.erase(kvs_.begin() + ptrdiff_t(it->second));
    kv_index_.clear();
    for (size_t i = 0; i < kvs_.size(); ++i) kv_index_.emplace(kvs_[i].key, i);
    return true;
}

uint32_t Writer::alignment() const {
    auto it = kv_index_.find("general.alignment");
    if (it == kv_index_.end()) return 32;
    uint32_t a;
    std::memcpy(&a, kvs_[it->second].encoded.data() + 4, 4);
    return a;
}

// ---------------------------------------------------------------- tensors

Writer::Tensor& Writer::new_tensor(std::string_view name, GgmlType type, std::span<const int64_t> ne) {
    std::string nm(name);
    if (nm.size() > kMaxTensorName)
        fail(strfmt("gguf writer: tensor name '%s' is too long (%zu >= 64)", nm.c_str(), nm.size()));
    if (tensor_index_.count(nm)) fail(strfmt("gguf writer: duplicate tensor name '%s'", nm.c_str()));
    if (ne.size() > 4) fail(strfmt("gguf writer: tensor '%s' has n_dims %zu > 4", nm.c_str(), ne.size()));
    auto tt = type_traits(uint32_t(type));
    if (!tt) fail(strfmt("gguf writer: tensor '%s' has unknown ggml type %u", nm.c_str(), uint32_t(type)));
    Tensor t{nm, type, uint32_t(ne.size()), {1, 1, 1, 1}, 0, nullptr, {}};
    for (size_t j = 0; j < ne.size(); ++j) {
        if (ne[j] < 0) fail(strfmt("gguf writer: tensor '%s' dim %zu is negative", nm.c_str(), j));
        t.ne[j] = ne[j];
    }
    if (t.ne[0] % tt->block_size != 0)
        fail(strfmt("gguf writer: tensor '%s' row length %lld not a multiple of block size %u for type %s", nm.c_str(),
                    (long long)t.ne[0], tt->block_size, tt->name));
    // Same overflow rule as the reader: bytes and elements must fit in int64.
    const uint64_t lim = uint64_t(std::numeric_limits<int64_t>::max());
    uint64_t nb = uint64_t(t.ne[0] / tt->block_size);
    bool overflow = nb != 0 && tt->type_size > lim / nb;
    nb *= tt->type_size;
    uint64_t elems = uint64_t(t.ne[0]);
    for (int j = 1; j < 4 && !overflow; ++j) {
        uint64_t d = uint64_t(t.ne[j]);
        if (d != 0 && (nb > lim / d || elems > lim / d)) overflow = true;
        nb *= d;
        elems *= d;
    }
    if (overflow) fail(strfmt("gguf writer: tensor '%s' size overflows", nm.c_str()));
    t.nbytes = nb;
    tensor_index_.emplace(nm, tensors_.size());
    tensors_.push_back(std::move(t));
    return tensors_.back();
}

void Writer::add_tensor(std::string_view name, GgmlType type, std::span<const int64_t> ne, const void* data) {
    Tensor& t = new_tensor(name, type, ne);
    if (!data && t.nbytes > 0) {
        std::string nm = t.name;
        tensor_index_.erase(nm);
        tensors_.pop_back();
        fail(strfmt("gguf writer: tensor '%s' has no data", nm.c_str()));
    }
    t.data = data;
}

void Writer::add_tensor(std::string_view name, GgmlType type, std::span<const int64_t> ne, TensorProducer produce) {
    Tensor& t = new_tensor(name, type, ne);
    t.produce = std::move(produce);
}

uint64_t Writer::data_size() const {
    uint64_t a = alignment(), total = 0;
    for (const Tensor& t : tensors_) total += align_up(t.nbytes, a);
    return total;
}

uint64_t Writer::file_size() const { return header_bytes().size() + data_size(); }

std::vector<uint8_t> Writer::header_bytes() const {
    std::vector<const Kv*> kvs;
    for (const Kv& kv : kvs_) kvs.push_back(&kv);
    return header(kvs, 0, tensors_.size());
}

// ---------------------------------------------------------------- output

std::vector<uint8_t> Writer::header(const std::vector<const Kv*>& kvs, size_t first, size_t last) const {
    std::vector<uint8_t> b;
    put_bytes(b, "GGUF", 4);
    gguf::put<uint32_t>(b, 3);
    gguf::put<uint64_t>(b, last - first);
    gguf::put<uint64_t>(b, kvs.size());
    for (const Kv* kv : kvs) {
        put_str(b, kv->key);
        put_bytes(b, kv->encoded.data(), kv->encoded.size());
    }
    const uint64_t a = alignment();
    uint64_t offset = 0;
    for (size_t i = first; i < last; ++i) {
        const Tensor& t = tensors_[i];
        put_str(b, t.name);
        gguf::put<uint32_t>(b, t.n_dims);
        for (uint32_t j = 0; j < t.n_dims; ++j) gguf::put<int64_t>(b, t.ne[j]);
        gguf::put<uint32_t>(b, uint32_t(t.type));
        gguf::put<uint64_t>(b, offset);
        offset += align_up(t.nbytes, a);
    }
    if (last > first) b.resize(size_t(align_up(b.size(), a)), 0);
    return b;
}

void Writer::emit(const ByteSink& out, const std::vector<const Kv*>& kvs, size_t first, size_t last) const {
    std::vector<uint8_t> head = header(kvs, first, last);
    out(head.data(), head.size());
    const uint64_t a = alignment();
    static const uint8_t zeros[256] = {};
    for (size_t i = first; i < last; ++i) {
        const Tensor& t = tensors_[i];
        if (t.produce) {
            uint64_t written = 0;
            t.produce([&](const void* p, size_t n) {
                if (n > t.nbytes - written)
                    fail(strfmt("gguf writer: tensor '%s': producer wrote more than %llu bytes", t.name.c_str(),
                                (unsigned long long)t.nbytes));
                written += n;
                if (n) out(p, n);
            });
            if (written != t.nbytes)
                fail(strfmt("gguf writer: tensor '%s': producer wrote %llu of %llu bytes", t.name.c_str(),
                            (unsigned long long)written, (unsigned long long)t.nbytes));
        } else if (t.nbytes) {
            out(t.data, size_t(t.nbytes));
        }
        uint64_t pad = align_up(t.nbytes, a) - t.nbytes;
        while (pad > 0) {
            size_t n = size_t(std::min<uint64_t>(pad, sizeof zeros));
            out(zeros, n);
            pad -= n;
        }
    }
}

void Writer::write_file(const std::string& path, const std::vector<const Kv*>& kvs, size_t first,
                        size_t last) const {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(fs_path(tmp), std::ios::binary | std::ios::trunc);
        if (!f) fail(strfmt("gguf writer: %s: cannot create file", tmp.c_str()));
        try {
            emit([&](const void* p, size_t n) {
                f.write(static_cast<const char*>(p), std::streamsize(n));
                if (!f) fail(strfmt("gguf writer: %s: write failed (disk full?)", tmp.c_str()));
            }, kvs, first, last);
            f.close();
            if (!f) fail(strfmt("gguf writer: %s: write failed on close", tmp.c_str()));
        } catch (...) {
            f.close();
            std::error_code ec;
            std::filesystem::remove(fs_path(tmp), ec);
            throw;
        }
    }
    std::error_code ec;
    std::filesystem::rename(fs_path(tmp), fs_path(path), ec);
#ifdef _WIN32
    if (ec) {  // some Windows runtimes do not replace an existing file
        std::error_code ec2;
        std::filesystem::remove(fs_path(path), ec2);
        ec.clear();
        std::filesystem::rename(fs_path(tmp), fs_path(path), ec);
    }
#endif
    if (ec) {
        std::filesystem::remove(fs_path(tmp), ec);
        fail(strfmt("gguf writer: %s: cannot rename %s into place", path.c_str(), tmp.c_str()));
    }
}

void Writer::write(const std::string& path) const {
    std::vector<const Kv*> kvs;
    for (const Kv& kv : kvs_) kvs.push_back(&kv);
    write_file(path, kvs, 0, tensors_.size());
}

std::vector<uint8_t> Writer::to_bytes() const {
    std::vector<const Kv*> kvs;
    for (const Kv& kv : kvs_) kvs.push_back(&kv);
    std::vector<uint8_t> bytes;
    emit([&](const void* p, size_t n) { put_bytes(bytes, p, n); }, kvs, 0, tensors_.size());
    return bytes;
}

std::vector<std::string> Writer::write_split(const std::string& prefix, uint64_t max_shard_bytes) const {
    const uint64_t a = alignment();
    std::vector<std::pair<size_t, size_t>> shards;  // [first, last) tensor ranges
    size_t first = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
        uint64_t nb = align_up(tensors_[i].nbytes, a);
        if (i > first && bytes + nb > max_shard_bytes) {
            shards.emplace_back(first, i);
            first = i;
            bytes = 0;
        }
        bytes += nb;
    }
    if (first < tensors_.size() || shards.empty()) shards.emplace_back(first, tensors_.size());
    if (shards.size() > 65535) fail("gguf writer: more than 65535 shards");
    if (tensors_.size() > size_t(std::numeric_limits<int32_t>::max())) fail("gguf writer: too many tensors to split");

    auto make_kv = [](const char* key, std::vector<uint8_t> enc) { return Kv{key, std::move(enc)}; };
    std::vector<std::string> paths;
    const uint16_t count = uint16_t(shards.size());
    for (size_t s = 0; s < shards.size(); ++s) {
        std::vector<uint8_t> no = tagged(ValueType::U16), cnt = tagged(ValueType::U16),
                             tc = tagged(ValueType::I32);
        gguf::put<uint16_t>(no, uint16_t(s));
        gguf::put<uint16_t>(cnt, count);
        gguf::put<int32_t>(tc, int32_t(tensors_.size()));
        Kv split_kvs[3] = {make_kv("split.no", std::move(no)), make_kv("split.count", std::move(cnt)),
                           make_kv("split.tensors.count", std::move(tc))};
        std::vector<const Kv*> kvs;
        for (const Kv& kv : kvs_) {
            if (kv.key.rfind("split.", 0) == 0) continue;  // replaced by this split's own keys
            if (s == 0 || kv.key == "general.alignment") kvs.push_back(&kv);
        }
        for (const Kv& kv : split_kvs) kvs.push_back(&kv);
        std::string path = strfmt("%s-%05zu-of-%05zu.gguf", prefix.c_str(), s + 1, shards.size());
        write_file(path, kvs, shards[s].first, shards[s].second);
        paths.push_back(path);
    }
    return paths;
}

}  // namespace qinfer::gguf
