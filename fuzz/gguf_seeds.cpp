// Writes the seed corpus for gguf_fuzz: small synthetic files covering every
// metadata type, nested arrays, alignment and split keys, plus a miniature of
// each GGUF given on the command line (same keys and tensor names/types, arrays
// cut to a few entries, tensors cut to one block). Real models are megabytes;
// the fuzzer explores far more per second from kilobyte seeds.
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"

using namespace qinfer;
using gguf::ValueType;

namespace {

void synthetic(const std::string& dir) {
    static uint8_t data[4096];
    for (size_t i = 0; i < sizeof data; ++i) data[i] = uint8_t(i * 13);
    {
        gguf::Writer w;
        w.set_string("general.architecture", "qwen3");
        w.set_u8("a.u8", 1), w.set_i8("a.i8", -1), w.set_u16("a.u16", 2), w.set_i16("a.i16", -2);
        w.set_u32("a.u32", 3), w.set_i32("a.i32", -3), w.set_u64("a.u64", 4), w.set_i64("a.i64", -4);
        w.set_f32("a.f32", 0.5f), w.set_f64("a.f64", 0.25), w.set_bool("a.bool", true), w.set_string("a.str", "s");
        std::vector<int32_t> ia = {1, 2, 3};
        w.set_array("a.ai32", ia);
        std::vector<std::string> sa = {"x", "", "yz"};
        w.set_string_array("a.astr", std::span<const std::string>(sa));
        w.set_bool_array("a.abool", {true, false});
        gguf::Value n;
        n.type = ValueType::ARRAY, n.elem_type = ValueType::ARRAY, n.count = 2, n.nested.resize(2);
        for (auto& e : n.nested) e.type = ValueType::ARRAY, e.elem_type = ValueType::U16, e.count = 2, e.elems = data;
        w.set_value("a.nested", n);
        w.add_tensor("t.f32", GgmlType::F32, {4, 2}, data);
        w.add_tensor("t.q4k", GgmlType::Q4_K, {256}, data);
        w.add_tensor("t.q80", GgmlType::Q8_0, {32, 1, 1, 2}, data);
        w.add_tensor("t.empty", GgmlType::F16, {0}, data);
        w.write(dir + "/synthetic-all-types.gguf");
        w.set_alignment(64);
        w.write(dir + "/synthetic-align64.gguf");
    }
    {
        gguf::Writer w;
        w.set_u16("split.no", 0), w.set_u16("split.count", 1), w.set_i32("split.tensors.count", 1);
        w.add_tensor("t", GgmlType::BF16, {2}, data);
        w.write(dir + "/synthetic-split-keys.gguf");
    }
    gguf::Writer().write(dir + "/synthetic-empty.gguf");
}

gguf::Value shrink(const gguf::Value& v, uint64_t keep) {
    gguf::Value s = v;
    if (!v.is_array()) return s;
    s.count = std::min(v.count, keep);
    if (!s.strings.empty()) s.strings.resize(size_t(s.count));
    if (!s.nested.empty()) s.nested.resize(size_t(s.count));
    return s;
}

void miniature(const std::string& src, const std::string& dst) {
    auto f = gguf::File::open(src);
    gguf::Writer w;
    for (const auto& kv : f->metadata()) w.set_value(kv.key, shrink(kv.value, 8));
    size_t n = 0;
    for (const auto& t : f->tensors()) {
        if (++n > 24) break;  // enough to cover each kind of tensor name and type
        int64_t ne[4] = {int64_t(traits(t.type).block_size), 1, 1, 1};
        w.add_tensor(t.name, t.type, std::span<const int64_t>(ne, t.n_dims ? t.n_dims : 1), t.data);
    }
    w.write(dst);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: gguf_seeds OUT_DIR [MODEL.gguf...]\n");
        return 2;
    }
    try {
        std::string dir = argv[1];
        std::filesystem::create_directories(dir);
        synthetic(dir);
        for (int i = 2; i < argc; ++i)
            miniature(argv[i], dir + "/mini-" + std::filesystem::path(argv[i]).filename().string());
    } catch (const Error& e) {
        std::fprintf(stderr, "gguf_seeds: %s\n", e.what());
        return 1;
    }
    return 0;
}
