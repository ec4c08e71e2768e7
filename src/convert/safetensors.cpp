#include "convert/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/fp16.h"
#include "common/platform.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace qinfer::convert {

namespace {

struct DtypeInfo {
    const char* name;
    StDtype type;
    size_t size;
};
const DtypeInfo kDtypes[] = {
    {"F64", StDtype::F64, 8},   {"F32", StDtype::F32, 4},   {"F16", StDtype::F16, 2},
    {"BF16", StDtype::BF16, 2}, {"I64", StDtype::I64, 8},   {"I32", StDtype::I32, 4},
    {"I16", StDtype::I16, 2},   {"I8", StDtype::I8, 1},     {"U8", StDtype::U8, 1},
    {"BOOL", StDtype::BOOL, 1}, {"F8_E4M3", StDtype::F8_E4M3, 1}, {"F8_E5M2", StDtype::F8_E5M2, 1},
    {"U16", StDtype::U16, 2},   {"U32", StDtype::U32, 4},   {"U64", StDtype::U64, 8},
};

// The reference implementation refuses headers above 100 MB; a real index of a
// 1000-tensor shard is well under 1 MB.
constexpr uint64_t kMaxHeader = 100ull << 20;

}  // namespace

const char* st_dtype_name(StDtype t) {
    for (const DtypeInfo& d : kDtypes)
        if (d.type == t) return d.name;
    return "?";
}

size_t st_dtype_size(StDtype t) {
    for (const DtypeInfo& d : kDtypes)
        if (d.type == t) return d.size;
    return 0;
}

bool st_is_float(StDtype t) {
    return t == StDtype::F32 || t == StDtype::F16 || t == StDtype::BF16 || t == StDtype::F64;
}

int64_t StTensor::n_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string StTensor::shape_str() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), map_(path) {
    parse(map_.data(), map_.size());
}

SafetensorsFile::SafetensorsFile(const uint8_t* data, size_t size, const std::string& name) : path_(name) {
    parse(data, size);
}

void SafetensorsFile::parse(const uint8_t* data, size_t size) {
    auto bad = [&](const std::string& msg) { fail(strfmt("safetensors: %s: %s", path_.c_str(), msg.c_str())); };
    if (size < 8) bad(strfmt("file too small (%zu bytes) for a safetensors header", size));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | data[i];
    if (hlen > size - 8) bad(strfmt("header length %llu exceeds the file size %zu", (unsigned long long)hlen, size));
    if (hlen > kMaxHeader) bad(strfmt("header length %llu is larger than 100 MB", (unsigned long long)hlen));
    const char* hdr = reinterpret_cast<const char*>(data + 8);
    json j;
    try {
        j = json::parse(hdr, hdr + hlen);
    } catch (const json::exception& e) {
        bad(std::string("header is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) bad("header is not a JSON object");
    const uint8_t* base = data + 8 + hlen;
    const uint64_t data_size = size - 8 - hlen;

    struct Span { uint64_t b, e; const std::string* name; };
    std::vector<Span> spans;
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (it.key() == "__metadata__") continue;
        const std::string& name = it.key();
        const json& v = it.value();
        auto tbad = [&](const std::string& msg) { bad(strfmt("tensor '%s': %s", name.c_str(), msg.c_str())); };
        if (!v.is_object()) tbad("entry is not an object");
        if (!v.contains("dtype") || !v["dtype"].is_string()) tbad("missing or non-string 'dtype'");
        if (!v.contains("shape") || !v["shape"].is_array()) tbad("missing or non-array 'shape'");
        if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
            tbad("'data_offsets' must be an array [begin, end]");
        StTensor t;
        t.name = name;
        const std::string ds = v["dtype"].get<std::string>();
        const DtypeInfo* di = nullptr;
        for (const DtypeInfo& d : kDtypes)
            if (ds == d.name) di = &d;
        if (!di) tbad("unknown dtype '" + ds + "'");
        t.dtype = di->type;
        if (v["shape"].size() > 8) tbad("more than 8 dimensions");
        uint64_t n = 1;
        for (const json& d : v["shape"]) {
            if (!d.is_number_unsigned()) tbad("shape entries must be non-negative integers");
            uint64_t x = d.get<uint64_t>();
            if (x != 0 && n > (uint64_t(1) << 62) / x) tbad("element count overflows");
            n *= x;
            t.shape.push_back(int64_t(x));
        }
        const json& off = v["data_offsets"];
        // JSON parsing stores non-negative integers as unsigned.
        if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            tbad("data_offsets must be non-negative integers");
        uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
        if (b > e) tbad(strfmt("data_offsets [%llu, %llu) are reversed", (unsigned long long)b, (unsigned long long)e));
        if (e > data_size)
            tbad(strfmt("data [%llu, %llu) lies outside the data section (%llu bytes); file truncated?",
                        (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_size));
        if (e - b != n * di->size)
            tbad(strfmt("holds %llu bytes but dtype %s and shape %s need %llu", (unsigned long long)(e - b), di->name,
                        t.shape_str().c_str(), (unsigned long long)(n * di->size)));
        t.data = base + b;
        t.nbytes = e - b;
        t.file = &path_;
        tensors_.push_back(std::move(t));
        spans.push_back({b, e, nullptr});
    }
    for (size_t i = 0; i < tensors_.size(); ++i) spans[i].name = &tensors_[i].name;
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.b < b.b; });
    for (size_t i = 1; i < spans.size(); ++i)
        if (spans[i].b < spans[i - 1].e && spans[i].e > spans[i].b)
            bad(strfmt("tensors '%s' and '%s' overlap", spans[i - 1].name->c_str(), spans[i].name->c_str()));
}

void Checkpoint::add(std::unique_ptr<SafetensorsFile> f) {
    for (const StTensor& t : f->tensors()) {
        auto [it, inserted] = by_name_.emplace(t.name, &t);
        if (!inserted)
            fail(strfmt("safetensors: tensor '%s' appears in both %s and %s", t.name.c_str(), it->second->file->c_str(),
                        f->path().c_str()));
        order_.push_back(&t);
    }
    files_.push_back(std::move(f));
}

std::unique_ptr<Checkpoint> Checkpoint::open_dir(const std::string& dir) {
    std::unique_ptr<Checkpoint> ck(new Checkpoint());
    const fs::path d = utf8_path(dir);
    const fs::path index = d / "model.safetensors.index.json";
    std::error_code ec;
    if (fs::exists(index, ec)) {
        json j;
        try {
            std::ifstream in(index, std::ios::binary);
            j = json::parse(in);
        } catch (const json::exception& e) {
            fail(strfmt("safetensors: %s: not valid JSON: %s", path_utf8(index).c_str(), e.what()));
        }
        if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
            fail(strfmt("safetensors: %s: missing object 'weight_map'", path_utf8(index).c_str()));
        std::set<std::string> shards;
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            if (!it.value().is_string())
                fail(strfmt("safetensors: %s: weight_map entry '%s' is not a file name", path_utf8(index).c_str(),
                            it.key().c_str()));
            const std::string s = it.value().get<std::string>();
            if (s.empty() || s.find('/') != std::string::npos || s.find('\\') != std::string::npos || s == "..")
                fail(strfmt("safetensors: %s: shard name '%s' must be a plain file name", path_utf8(index).c_str(),
                            s.c_str()));
            shards.insert(s);
        }
        for (const std::string& s : shards) {
            fs::path p = d / utf8_path(s);
            if (!fs::exists(p, ec))
                fail(strfmt("safetensors: shard '%s' named by %s is missing", path_utf8(p).c_str(),
                            path_utf8(index).c_str()));
            ck->add(std::make_unique<SafetensorsFile>(path_utf8(p)));
        }
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            const StTensor* t = ck->find(it.key());
            if (!t || *t->file != path_utf8(d / utf8_path(it.value().get<std::string>())))
                fail(strfmt("safetensors: tensor '%s' is listed in %s for shard '%s' but is not in it",
                            it.key().c_str(), path_utf8(index).c_str(), it.value().get<std::string>().c_str()));
        }
        return ck;
    }
    std::vector<fs::path> files;
    if (fs::is_directory(d, ec))
        for (const auto& e : fs::directory_iterator(d, ec))
            if (e.path().extension() == ".safetensors") files.push_back(e.path());
    if (files.empty())
        fail(strfmt("safetensors: no model.safetensors.index.json and no *.safetensors files in '%s'", dir.c_str()));
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files) ck->add(std::make_unique<SafetensorsFile>(path_utf8(p)));
    return ck;
}

const StTensor* Checkpoint::find(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
}

void st_read_f32(const StTensor& t, int64_t first, int64_t n, float* dst) {
    if (first < 0 || n < 0 || first + n > t.n_elements())
        fail(strfmt("safetensors: read of elements [%lld, %lld) outside tensor '%s'", (long long)first,
                    (long long)(first + n), t.name.c_str()));
    const uint8_t* p = t.data + uint64_t(first) * st_dtype_size(t.dtype);
    switch (t.dtype) {
        case StDtype::F32: std::memcpy(dst, p, size_t(n) * 4); break;
        case StDtype::F16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                dst[i] = fp16_to_fp32(h);
            }
            break;
        case StDtype::BF16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                dst[i] = bf16_to_fp32(h);
            }
            break;
        case StDtype::F64:
            for (int64_t i = 0; i < n; ++i) {
                double x;
                std::memcpy(&x, p + 8 * i, 8);
                dst[i] = float(x);
            }
            break;
        default:
            fail(strfmt("safetensors: tensor '%s' in %s has dtype %s; only F32, F16, BF16 and F64 can be converted",
                        t.name.c_str(), t.file ? t.file->c_str() : "?", st_dtype_name(t.dtype)));
    }
}

}  // namespace qinfer::convert
