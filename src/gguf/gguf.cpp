#include "gguf/gguf.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <unordered_set>

#include "common/error.h"

// Error paths are kept out of line so the per-string fast path stays small.
#if defined(__GNUC__)
#define QINFER_GGUF_COLD __attribute__((noinline, cold))
#else
#define QINFER_GGUF_COLD
#endif

namespace qinfer::gguf {

namespace {

constexpr uint64_t kMaxStringLen = 1ull << 30;   // ggml GGUF_MAX_STRING_LENGTH
constexpr uint64_t kMaxArrayCount = 1ull << 30;
constexpr int kMaxNestedDepth = 8;
constexpr size_t kMaxTensorName = 63;            // ggml GGML_MAX_NAME (64) includes the NUL
// Up-front reservations are capped: counts are only bounded by the file size, and a
// corrupted count in a multi-GB file must not turn into a multi-GB allocation.
// String arrays get a larger cap: Qwen vocabularies have 150k-250k entries, and
// growing a vector of views step by step costs more page faults than parsing.
constexpr uint64_t kMaxReserve = 1u << 16;
constexpr uint64_t kMaxReserveStrings = 1u << 20;

size_t scalar_size(ValueType t) {
    switch (t) {
        case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
        case ValueType::U16: case ValueType::I16: return 2;
        case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
        case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
        default: return 0;
    }
}

bool valid_value_type(uint32_t t) { return t <= 12; }

// Cursor over one shard's bytes; every read is bounds-checked and failures
// name the file, the field being read (with the key or tensor it belongs to)
// and the byte offset. The context is kept as parts and only formatted on error:
// a model has hundreds of thousands of strings and thousands of tensors.
class Reader {
public:
    enum class Ctx { None, KeyIndex, Key, TensorIndex, Tensor };

    Reader(const uint8_t* data, size_t size, const std::string& name) : d_(data), n_(size), name_(name) {}

    [[noreturn]] void error(const std::string& msg, uint64_t at) const {
        fail(strfmt("gguf: %s: %s (offset %llu)", name_.c_str(), msg.c_str(), (unsigned long long)at));
    }
    [[noreturn]] void error(const std::string& msg) const { error(msg, pos_); }

    // What is being parsed, for messages: "key #3", "key 'general.name'", "tensor 'x'".
    void set_context(Ctx kind, uint64_t index = 0, std::string_view name = {}) {
        ctx_ = kind, ctx_index_ = index, ctx_name_ = name;
    }
    std::string context() const {
        switch (ctx_) {
            case Ctx::KeyIndex: return strfmt("key #%llu", (unsigned long long)ctx_index_);
            case Ctx::Key: return "key '" + std::string(ctx_name_) + "'";
            case Ctx::TensorIndex: return strfmt("tensor #%llu", (unsigned long long)ctx_index_);
            case Ctx::Tensor: return "tensor '" + std::string(ctx_name_) + "'";
            default: return "";
        }
    }

    size_t pos() const { return pos_; }
    size_t size() const { return n_; }
    size_t remaining() const { return n_ - pos_; }
    const uint8_t* ptr() const { return d_ + pos_; }

    void need(uint64_t bytes, const char* what) {
        if (bytes > remaining()) eof(what);
    }
    template <class T> T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, d_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }
    std::string_view read_string(const char* what) {
        size_t at = pos_;
        uint64_t len = read<uint64_t>(what);
        if (len > remaining() || len > kMaxStringLen) bad_string(what, len, at);
        std::string_view s(reinterpret_cast<const char*>(d_ + pos_), size_t(len));
        pos_ += size_t(len);
        return s;
    }
    void skip(uint64_t bytes, const char* what) {
        need(bytes, what);
        pos_ += size_t(bytes);
    }

private:
    [[noreturn]] QINFER_GGUF_COLD void eof(const char* what) const {
        std::string ctx = context();
        error(ctx.empty() ? strfmt("unexpected end of file while reading %s", what)
                          : strfmt("unexpected end of file while reading %s of %s", what, ctx.c_str()));
    }
    [[noreturn]] QINFER_GGUF_COLD void bad_string(const char* what, uint64_t len, size_t at) const {
        std::string ctx = context();
        error(strfmt("string length %llu of %s%s%s exceeds the %s", (unsigned long long)len, what,
                     ctx.empty() ? "" : " of ", ctx.c_str(), len > remaining() ? "remaining file size" : "limit of 1 GiB"),
              at);
    }

    const uint8_t* d_;
    size_t n_;
    size_t pos_ = 0;
    const std::string& name_;
    Ctx ctx_ = Ctx::None;
    uint64_t ctx_index_ = 0;
    std::string_view ctx_name_;
};

void read_scalar(Reader& r, ValueType t, Value& v, const std::string& key, std::vector<std::string>& warnings) {
    v.type = t;
    const char* what = "value";
    switch (t) {
        case ValueType::U8: v.u = r.read<uint8_t>(what); v.i = int64_t(v.u); break;
        case ValueType::I8: v.i = r.read<int8_t>(what); v.u = uint64_t(v.i); break;
        case ValueType::U16: v.u = r.read<uint16_t>(what); v.i = int64_t(v.u); break;
        case ValueType::I16: v.i = r.read<int16_t>(what); v.u = uint64_t(v.i); break;
        case ValueType::U32: v.u = r.read<uint32_t>(what); v.i = int64_t(v.u); break;
        case ValueType::I32: v.i = r.read<int32_t>(what); v.u = uint64_t(v.i); break;
        case ValueType::U64: v.u = r.read<uint64_t>(what); v.i = int64_t(v.u); break;
        case ValueType::I64: v.i = r.read<int64_t>(what); v.u = uint64_t(v.i); break;
        case ValueType::F32: v.f = r.read<float>(what); break;
        case ValueType::F64: v.f = r.read<double>(what); break;
        case ValueType::BOOL: {
            uint8_t b = r.read<uint8_t>(what);
            if (b > 1) warnings.push_back(strfmt("key '%s': bool byte %u treated as true", key.c_str(), b));
            v.u = b ? 1 : 0;
            v.i = int64_t(v.u);
            break;
        }
        case ValueType::STRING: v.str = r.read_string(what); break;
        default: r.error(strfmt("key '%s' has invalid value type %u", key.c_str(), uint32_t(t)));
    }
}

// The body of an ARRAY value: element type, count, elements (spec §5.2).
// Nested arrays repeat this body per element, without a type tag.
void read_array(Reader& r, Value& v, const std::string& key, int depth, std::vector<std::string>& warnings) {
    v.type = ValueType::ARRAY;
    size_t at = r.pos();
    uint32_t et = r.read<uint32_t>("array element type");
    if (!valid_value_type(et)) r.error(strfmt("array '%s' has invalid element type %u", key.c_str(), et), at);
    v.elem_type = ValueType(et);
    v.count = r.read<uint64_t>("array count");
    // The cheapest possible encoding per element bounds the count by the bytes left.
    uint64_t min_elem = v.elem_type == ValueType::STRING ? 8
                        : v.elem_type == ValueType::ARRAY ? 12
                                                         : scalar_size(v.elem_type);
    if (v.count > kMaxArrayCount || v.count > r.remaining() / min_elem)
        r.error(strfmt("array '%s' with %llu elements of type %s exceeds the remaining file size", key.c_str(),
                       (unsigned long long)v.count, value_type_name(v.elem_type)), at);
    if (v.elem_type == ValueType::STRING) {
        v.strings.reserve(size_t(std::min(v.count, kMaxReserveStrings)));
        for (uint64_t k = 0; k < v.count; ++k) v.strings.push_back(r.read_string("array element"));
    } else if (v.elem_type == ValueType::ARRAY) {
        if (depth >= kMaxNestedDepth)
            r.error(strfmt("array '%s' is nested more than %d levels deep", key.c_str(), kMaxNestedDepth), at);
        v.nested.reserve(size_t(std::min(v.count, kMaxReserve)));
        for (uint64_t k = 0; k < v.count; ++k) {
            v.nested.emplace_back();
            read_array(r, v.nested.back(), key, depth + 1, warnings);
        }
    } else {
        v.elems = r.ptr();
        r.skip(v.count * min_elem, "array elements");
        if (v.elem_type == ValueType::BOOL)
            for (uint64_t k = 0; k < v.count; ++k)
                if (v.elems[k] > 1) {
                    warnings.push_back(strfmt("key '%s': bool array byte %u treated as true", key.c_str(), v.elems[k]));
                    break;
                }
    }
}

}  // namespace

const char* value_type_name(ValueType t) {
    static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                  "string", "array", "u64", "i64", "f64"};
    uint32_t i = uint32_t(t);
    return i <= 12 ? names[i] : "invalid";
}

bool Value::is_integer() const {
    switch (type) {
        case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
        case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64: return true;
        default: return false;
    }
}

int64_t Value::int_at(uint64_t idx) const {
    if (type != ValueType::ARRAY) fail("gguf: int_at on a value that is not an array");
    if (idx >= count) fail(strfmt("gguf: array index %llu out of range (%llu elements)", (unsigned long long)idx,
                                  (unsigned long long)count));
    if (scalar_size(elem_type) == 0 || !elems)
        fail(strfmt("gguf: array of %s is not numeric", value_type_name(elem_type)));
    const uint8_t* p = elems + idx * scalar_size(elem_type);
    auto from_float = [](double x) -> int64_t {
        // Casting NaN or an out-of-range float to an integer is undefined behaviour.
        if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0))
            fail(strfmt("gguf: array element %g is not representable as an integer", x));
        return int64_t(x);
    };
    switch (elem_type) {
        case ValueType::U8: case ValueType::BOOL: return *p;
        case ValueType::I8: return int8_t(*p);
        case ValueType::U16: { uint16_t x; std::memcpy(&x, p, 2); return x; }
        case ValueType::I16: { int16_t x; std::memcpy(&x, p, 2); return x; }
        case ValueType::U32: { uint32_t x; std::memcpy(&x, p, 4); return x; }
        case ValueType::I32: { int32_t x; std::memcpy(&x, p, 4); return x; }
        case ValueType::U64: { uint64_t x; std::memcpy(&x, p, 8); return int64_t(x); }
        case ValueType::I64: { int64_t x; std::memcpy(&x, p, 8); return x; }
        case ValueType::F32: { float x; std::memcpy(&x, p, 4); return from_float(x); }
        case ValueType::F64: { double x; std::memcpy(&x, p, 8); return from_float(x); }
        default: fail("gguf: not a numeric array");
    }
}

double Value::float_at(uint64_t idx) const {
    if (type == ValueType::ARRAY && idx < count && elems) {
        const uint8_t* p = elems + idx * scalar_size(elem_type);
        if (elem_type == ValueType::F32) { float x; std::memcpy(&x, p, 4); return x; }
        if (elem_type == ValueType::F64) { double x; std::memcpy(&x, p, 8); return x; }
        if (elem_type == ValueType::U64) { uint64_t x; std::memcpy(&x, p, 8); return double(x); }
    }
    return double(int_at(idx));
}

std::unique_ptr<File> File::parse_memory(const uint8_t* data, size_t size, const std::string& name) {
    std::unique_ptr<File> f(new File());
    f->path_ = name;
    f->total_file_bytes_ = size;
    f->parse_shard(data, size, name, 0, 1);
    f->index();
    return f;
}

std::unique_ptr<File> File::open(const std::string& path) {
    std::unique_ptr<File> f(new File());
    f->path_ = path;
    // `<prefix>-00001-of-0000N.gguf`: open every shard (spec/gguf.md §10).
    static const std::regex split_re(R"((.*)-(\d{5})-of-(\d{5})\.gguf$)");
    std::smatch m;
    std::vector<std::string> paths{path};
    if (std::regex_match(path, m, split_re)) {
        int idx = std::stoi(m[2].str());
        int count = std::stoi(m[3].str());
        if (count < 1) fail(strfmt("gguf: %s: invalid shard count 0 in the file name", path.c_str()));
        if (idx != 1)
            fail(strfmt("gguf: %s: this is shard %d of a split model; open the first shard (%s-00001-of-%05d.gguf)",
                        path.c_str(), idx, m[1].str().c_str(), count));
        for (int i = 2; i <= count; ++i) paths.push_back(strfmt("%s-%05d-of-%05d.gguf", m[1].str().c_str(), i, count));
    }
    for (size_t i = 0; i < paths.size(); ++i) {
        if (i > 0 && !file_exists(paths[i])) fail(strfmt("gguf: %s: missing shard %s", path.c_str(), paths[i].c_str()));
        f->shards_.emplace_back(paths[i]);
    }
    for (size_t i = 0; i < paths.size(); ++i) {
        const MappedFile& mf = f->shards_[i];
        f->total_file_bytes_ += mf.size();
        f->parse_shard(mf.data(), mf.size(), paths[i], uint32_t(i), uint32_t(paths.size()));
    }
    f->index();
    if (f->has("split.count")) {
        uint64_t count = f->get_uint("split.count").value_or(0);
        if (count > 1 && paths.size() == 1)
            fail(strfmt("gguf: %s: split.count is %llu but the file name is not <prefix>-00001-of-%05llu.gguf; "
                        "keep the original shard names", path.c_str(), (unsigned long long)count,
                        (unsigned long long)count));
        auto expected = f->get_uint("split.tensors.count");
        if (expected && *expected != f->tensors_.size())
            fail(strfmt("gguf: %s: split.tensors.count %llu but %zu tensors found", path.c_str(),
                        (unsigned long long)*expected, f->tensors_.size()));
    }
    return f;
}

void File::parse_shard(const uint8_t* data, size_t size, const std::string& name, uint32_t shard_idx,
                       uint32_t n_shards) {
    Reader r(data, size, name);

    // ---- header (§3)
    if (size < 24) r.error(strfmt("file too small for a GGUF header (%zu bytes)", size), 0);
    if (std::memcmp(data, "GGUF", 4) != 0) {
        std::string shown;
        for (int k = 0; k < 4; ++k) shown += (data[k] >= 32 && data[k] < 127) ? char(data[k]) : '?';
        r.error(strfmt("invalid magic '%s', expected 'GGUF'", shown.c_str()), 0);
    }
    r.skip(4, "magic");
    uint32_t version = r.read<uint32_t>("version");
    if (version == 0) r.error("bad version 0", 4);
    if (version == 1) r.error("GGUF v1 is not supported (obsolete since 2023; re-convert the model)", 4);
    if ((version & 0xFFFFu) == 0) r.error("big-endian GGUF files are not supported", 4);
    if (version > 3) r.error(strfmt("version %u is newer than supported (3)", version), 4);
    if (shard_idx == 0) version_ = version;

    uint64_t n_tensors = r.read<uint64_t>("tensor_count");
    uint64_t n_kv = r.read<uint64_t>("kv_count");
    // Minimum encodings: a tensor info is >= 24 bytes, a key/value >= 14 (§3.2).
    if (n_tensors > r.remaining() / 24)
        r.error(strfmt("tensor_count %llu cannot fit in a file of %zu bytes", (unsigned long long)n_tensors, size), 8);
    if (n_kv > r.remaining() / 14 || n_kv * 14 + n_tensors * 24 > r.remaining())
        r.error(strfmt("kv_count %llu cannot fit in a file of %zu bytes", (unsigned long long)n_kv, size), 16);

    // ---- metadata (§5)
    std::vector<KeyValue> kvs;
    kvs.reserve(size_t(std::min(n_kv, kMaxReserve)));
    std::unordered_set<std::string_view> seen_keys;  // views into the mapped file
    uint32_t alignment = 32;
    for (uint64_t k = 0; k < n_kv; ++k) {
        size_t at = r.pos();
        r.set_context(Reader::Ctx::KeyIndex, k);
        std::string_view key = r.read_string("name");
        if (key.empty()) r.error(strfmt("key #%llu is empty", (unsigned long long)k), at);
        if (!seen_keys.insert(key).second) r.error(strfmt("duplicate key '%.*s'", int(key.size()), key.data()), at);
        KeyValue kv;
        kv.key = std::string(key);
        r.set_context(Reader::Ctx::Key, k, key);
        size_t tat = r.pos();
        uint32_t vt = r.read<uint32_t>("value type");
        if (!valid_value_type(vt)) r.error(strfmt("key '%s' has invalid value type %u", kv.key.c_str(), vt), tat);
        if (ValueType(vt) == ValueType::ARRAY) read_array(r, kv.value, kv.key, 0, warnings_);
        else read_scalar(r, ValueType(vt), kv.value, kv.key, warnings_);
        if (kv.key == "general.alignment") {
            if (kv.value.type != ValueType::U32)
                r.error(strfmt("general.alignment must be u32, not %s", value_type_name(kv.value.type)), tat);
            uint64_t a = kv.value.u;
            if (a == 0 || (a & (a - 1)) != 0)
                r.error(strfmt("general.alignment %llu is not a power of two", (unsigned long long)a), tat);
            alignment = uint32_t(a);
            if (a % 8 != 0) warnings_.push_back(strfmt("%s: general.alignment %u is not a multiple of 8", name.c_str(), alignment));
        }
        if (n_shards > 1 && (kv.key == "split.no" || kv.key == "split.count")) {
            // Every shard says which one it is and how many there are (§10).
            uint64_t expect = kv.key == "split.no" ? shard_idx : n_shards;
            if (!kv.value.is_integer() || kv.value.i < 0 || kv.value.u != expect)
                r.error(strfmt("shard has %s %lld, expected %llu", kv.key.c_str(), (long long)kv.value.i,
                               (unsigned long long)expect), at);
        }
        kvs.push_back(std::move(kv));
    }
    if (shard_idx == 0) alignment_ = alignment;

    // ---- tensor infos (§6)
    r.set_context(Reader::Ctx::None);
    const size_t first_new = tensors_.size();
    tensors_.reserve(first_new + size_t(std::min(n_tensors, kMaxReserve)));
    tensor_index_.reserve(first_new + size_t(std::min(n_tensors, kMaxReserve)));
    std::vector<uint64_t> info_at;  // where each info record starts, for messages
    for (uint64_t t = 0; t < n_tensors; ++t) {
        size_t at = r.pos();
        info_at.push_back(at);
        r.set_context(Reader::Ctx::TensorIndex, t);
        TensorInfo ti;
        std::string_view nm = r.read_string("name");
        if (nm.size() > kMaxTensorName)
            r.error(strfmt("tensor name #%llu is too long (%zu >= 64)", (unsigned long long)t, nm.size()), at);
        // Keyed by the name's bytes in the mapped file, which outlive the parse.
        if (!tensor_index_.emplace(nm, tensors_.size()).second)
            r.error(strfmt("duplicate tensor name '%.*s'", int(nm.size()), nm.data()), at);
        ti.name = std::string(nm);
        r.set_context(Reader::Ctx::Tensor, t, nm);
        ti.shard = shard_idx;
        size_t dat = r.pos();
        ti.n_dims = r.read<uint32_t>("n_dims");
        if (ti.n_dims > 4) r.error(strfmt("tensor '%s' has n_dims %u > 4", ti.name.c_str(), ti.n_dims), dat);
        for (uint32_t j = 0; j < ti.n_dims; ++j) {
            size_t nat = r.pos();
            int64_t ne = r.read<int64_t>("dimension");
            if (ne < 0) r.error(strfmt("tensor '%s' dim %u is negative (%lld)", ti.name.c_str(), j, (long long)ne), nat);
            ti.ne[j] = ne;
        }
        int64_t total = 1;
        for (int j = 0; j < 4; ++j) {
            if (ti.ne[j] != 0 && total > std::numeric_limits<int64_t>::max() / ti.ne[j])
                r.error(strfmt("tensor '%s' element count overflows", ti.name.c_str()), dat);
            total *= ti.ne[j];
        }
        size_t tat = r.pos();
        uint32_t type = r.read<uint32_t>("type");
        auto tt = type_traits(type);
        if (!tt) r.error(strfmt("tensor '%s' has unknown/removed ggml type %u", ti.name.c_str(), type), tat);
        ti.type = GgmlType(type);
        if (ti.ne[0] % tt->block_size != 0)
            r.error(strfmt("tensor '%s' row length %lld not a multiple of block size %u for type %s", ti.name.c_str(),
                           (long long)ti.ne[0], tt->block_size, tt->name), dat);
        // nbytes = (ne0/bs)*ts*ne1*ne2*ne3 must fit in int64 (so offset arithmetic cannot wrap).
        const uint64_t lim = uint64_t(std::numeric_limits<int64_t>::max());
        uint64_t nb = uint64_t(ti.ne[0] / tt->block_size);
        bool overflow = nb != 0 && tt->type_size > lim / nb;
        nb *= tt->type_size;
        for (int j = 1; j < 4 && !overflow; ++j) {
            if (ti.ne[j] != 0 && nb > lim / uint64_t(ti.ne[j])) overflow = true;
            nb *= uint64_t(ti.ne[j]);
        }
        if (overflow) r.error(strfmt("tensor '%s' has a size in bytes that overflows", ti.name.c_str()), dat);
        ti.nbytes = nb;
        size_t oat = r.pos();
        ti.offset = r.read<uint64_t>("offset");
        if (ti.offset % alignment != 0)
            r.error(strfmt("tensor '%s' offset %llu is not a multiple of alignment %u", ti.name.c_str(),
                           (unsigned long long)ti.offset, alignment), oat);
        tensors_.push_back(std::move(ti));
    }
    r.set_context(Reader::Ctx::None);

    // ---- data section (§8): bounds, then canonical layout or at least no overlap
    uint64_t data_start = r.pos();
    if (n_tensors > 0) data_start = (data_start + alignment - 1) / alignment * alignment;
    uint64_t expected = 0;
    bool canonical = true;
    for (size_t t = first_new; t < tensors_.size(); ++t) {
        TensorInfo& ti = tensors_[t];
        if (data_start > size || ti.offset > size - data_start || ti.nbytes > size - data_start - ti.offset)
            r.error(strfmt("tensor '%s' data [%llu, %llu) is outside the file (size %zu)", ti.name.c_str(),
                           (unsigned long long)(data_start + ti.offset),
                           (unsigned long long)(data_start + ti.offset + ti.nbytes), size),
                    info_at[t - first_new]);
        ti.file_offset = data_start + ti.offset;
        ti.data = data + ti.file_offset;
        if (ti.offset != expected) canonical = false;
        expected = ti.offset + (ti.nbytes + alignment - 1) / alignment * alignment;
    }
    if (!canonical) {
        warnings_.push_back(strfmt("%s: tensor data is not laid out canonically", name.c_str()));
        // Non-canonical layouts are tolerated, overlaps are not.
        std::vector<size_t> order;
        for (size_t t = first_new; t < tensors_.size(); ++t) order.push_back(t);
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
        uint64_t end = 0;
        size_t end_by = order.empty() ? 0 : order[0];
        for (size_t t : order) {
            const TensorInfo& ti = tensors_[t];
            if (ti.nbytes > 0 && ti.offset < end)
                r.error(strfmt("tensors '%s' and '%s' overlap", tensors_[end_by].name.c_str(), ti.name.c_str()),
                        info_at[t - first_new]);
            if (ti.offset + ti.nbytes > end) end = ti.offset + ti.nbytes, end_by = t;
        }
    }

    if (shard_idx == 0) kvs_ = std::move(kvs);
}

void File::index() {
    kv_index_.clear();
    for (size_t i = 0; i < kvs_.size(); ++i) kv_index_.emplace(kvs_[i].key, i);
    // tensor_index_ is filled while parsing (duplicate names are rejected there).
}

const Value* File::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<uint64_t> File::get_uint(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_integer() && v->type != ValueType::BOOL)
        fail(strfmt("gguf: %s: key '%.*s' has type %s, expected an integer", path_.c_str(), int(key.size()), key.data(),
                    value_type_name(v->type)));
    if (v->i < 0 && v->type != ValueType::U64)
        fail(strfmt("gguf: %s: key '%.*s' is negative (%lld)", path_.c_str(), int(key.size()), key.data(), (long long)v->i));
    return v->u;
}

std::optional<int64_t> File::get_int(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_integer())
        fail(strfmt("gguf: %s: key '%.*s' has type %s, expected an integer", path_.c_str(), int(key.size()), key.data(),
                    value_type_name(v->type)));
    if (v->type == ValueType::U64 && v->i < 0)
        fail(strfmt("gguf: %s: key '%.*s' value %llu does not fit in int64", path_.c_str(), int(key.size()), key.data(),
                    (unsigned long long)v->u));
    return v->i;
}

std::optional<double> File::get_float(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type == ValueType::F32 || v->type == ValueType::F64) return v->f;
    if (v->type == ValueType::U64) return double(v->u);
    if (v->is_integer()) return double(v->i);
    fail(strfmt("gguf: %s: key '%.*s' has type %s, expected a number", path_.c_str(), int(key.size()), key.data(),
                value_type_name(v->type)));
}

std::optional<bool> File::get_bool(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != ValueType::BOOL && !v->is_integer())
        fail(strfmt("gguf: %s: key '%.*s' has type %s, expected bool", path_.c_str(), int(key.size()), key.data(),
                    value_type_name(v->type)));
    return v->u != 0;
}

std::optional<std::string_view> File::get_string(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != ValueType::STRING)
        fail(strfmt("gguf: %s: key '%.*s' has type %s, expected string", path_.c_str(), int(key.size()), key.data(),
                    value_type_name(v->type)));
    return v->str;
}

uint64_t File::require_uint(std::string_view key) const {
    auto v = get_uint(key);
    if (!v) fail(strfmt("gguf: %s: required key '%.*s' is missing", path_.c_str(), int(key.size()), key.data()));
    return *v;
}

double File::require_float(std::string_view key) const {
    auto v = get_float(key);
    if (!v) fail(strfmt("gguf: %s: required key '%.*s' is missing", path_.c_str(), int(key.size()), key.data()));
    return *v;
}

std::string_view File::require_string(std::string_view key) const {
    auto v = get_string(key);
    if (!v) fail(strfmt("gguf: %s: required key '%.*s' is missing", path_.c_str(), int(key.size()), key.data()));
    return *v;
}

const std::vector<std::string_view>* File::get_string_array(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return nullptr;
    if (v->type != ValueType::ARRAY || v->elem_type != ValueType::STRING)
        fail(strfmt("gguf: %s: key '%.*s' is not an array of strings", path_.c_str(), int(key.size()), key.data()));
    return &v->strings;
}

}  // namespace qinfer::gguf
