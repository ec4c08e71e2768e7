// GGUF writer: write -> read round trips (metadata of every type, tensors from
// pointers and producers, alignment, split files), and a rewrite of a real
// reference model that must come out byte-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "testutil.h"

using namespace qinfer;
using gguf::ValueType;

namespace {

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    uint32_t x = seed * 2654435761u + 1;
    for (auto& b : v) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        b = uint8_t(x);
    }
    return v;
}

std::string tmp(const std::string& name) { return test::temp_dir() + "/" + name; }

}  // namespace

TEST(GgufWriter, MetadataOfEveryTypeRoundTrips) {
    gguf::Writer w;
    w.set_u8("t.u8", 200);
    w.set_i8("t.i8", -100);
    w.set_u16("t.u16", 60000);
    w.set_i16("t.i16", -30000);
    w.set_u32("t.u32", 4000000000u);
    w.set_i32("t.i32", -2000000000);
    w.set_u64("t.u64", 18000000000000000000ull);
    w.set_i64("t.i64", -9000000000000000000ll);
    w.set_f32("t.f32", 1.5e-6f);
    w.set_f64("t.f64", -3.25e300);
    w.set_bool("t.true", true);
    w.set_bool("t.false", false);
    w.set_string("t.str", "hello, мир");
    w.set_string("t.empty", "");
    w.set_string("t.nul", std::string_view("a\0b", 3));
    std::vector<int32_t> i32s = {1, -2, 3, 2147483647};
    w.set_array("t.ai32", i32s);
    std::vector<float> f32s = {0.5f, -1.f, 1e10f};
    w.set_array("t.af32", f32s);
    std::vector<uint64_t> u64s = {0, ~0ull};
    w.set_array("t.au64", u64s);
    std::vector<double> f64s = {};
    w.set_array("t.af64_empty", f64s);
    w.set_bool_array("t.abool", {true, false, true});
    std::vector<std::string> strs = {"a", "", "b c", std::string(1000, 'x')};
    w.set_string_array("t.astr", std::span<const std::string>(strs));
    // Nested: [[1,2],[3]] of u16, plus an inner array of strings.
    uint16_t a12[] = {1, 2}, a3[] = {3};
    gguf::Value nested;
    nested.type = ValueType::ARRAY;
    nested.elem_type = ValueType::ARRAY;
    nested.nested.resize(3);
    nested.nested[0].type = nested.nested[1].type = nested.nested[2].type = ValueType::ARRAY;
    nested.nested[0].elem_type = nested.nested[1].elem_type = ValueType::U16;
    nested.nested[0].count = 2, nested.nested[0].elems = reinterpret_cast<const uint8_t*>(a12);
    nested.nested[1].count = 1, nested.nested[1].elems = reinterpret_cast<const uint8_t*>(a3);
    nested.nested[2].elem_type = ValueType::STRING;
    nested.nested[2].strings = {"x", "yz"};
    nested.nested[2].count = 2;
    nested.count = 3;
    w.set_value("t.nested", nested);
    w.set_u32("t.replaced", 1);
    w.set_string("t.replaced", "now a string");  // keeps its position, changes type
    w.set_u8("t.removed", 1);
    EXPECT_TRUE(w.remove("t.removed"));
    EXPECT_FALSE(w.remove("t.removed"));

    std::vector<uint8_t> bytes = w.to_bytes();
    EXPECT_EQ(bytes.size(), w.file_size());
    auto f = gguf::File::parse_memory(bytes.data(), bytes.size(), "mem");
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->metadata().size(), w.n_kv());
    EXPECT_EQ(f->metadata().size(), 23u);
    EXPECT_TRUE(f->tensors().empty());
    EXPECT_TRUE(f->warnings().empty());
    EXPECT_EQ(f->find("t.u8")->type, ValueType::U8);
    EXPECT_EQ(f->get_uint("t.u8"), 200u);
    EXPECT_EQ(f->find("t.i8")->type, ValueType::I8);
    EXPECT_EQ(f->get_int("t.i8"), -100);
    EXPECT_EQ(f->get_uint("t.u16"), 60000u);
    EXPECT_EQ(f->get_int("t.i16"), -30000);
    EXPECT_EQ(f->get_uint("t.u32"), 4000000000u);
    EXPECT_EQ(f->get_int("t.i32"), -2000000000);
    EXPECT_EQ(f->find("t.u64")->u, 18000000000000000000ull);
    EXPECT_EQ(f->get_int("t.i64"), -9000000000000000000ll);
    EXPECT_EQ(f->find("t.f32")->type, ValueType::F32);
    EXPECT_EQ(float(*f->get_float("t.f32")), 1.5e-6f);
    EXPECT_EQ(*f->get_float("t.f64"), -3.25e300);
    EXPECT_EQ(f->get_bool("t.true"), true);
    EXPECT_EQ(f->get_bool("t.false"), false);
    EXPECT_EQ(f->get_string("t.str"), "hello, мир");
    EXPECT_EQ(f->get_string("t.empty"), "");
    EXPECT_EQ(f->get_string("t.nul"), std::string_view("a\0b", 3));
    const gguf::Value* ai = f->find("t.ai32");
    ASSERT_TRUE(ai && ai->is_array());
    EXPECT_EQ(ai->elem_type, ValueType::I32);
    ASSERT_EQ(ai->count, 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ai->int_at(i), i32s[i]);
    const gguf::Value* af = f->find("t.af32");
    ASSERT_EQ(af->count, 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(af->float_at(i), f32s[i]);
    EXPECT_EQ(uint64_t(f->find("t.au64")->int_at(1)), ~0ull);
    EXPECT_EQ(f->find("t.af64_empty")->count, 0u);
    EXPECT_EQ(f->find("t.af64_empty")->elem_type, ValueType::F64);
    const gguf::Value* ab = f->find("t.abool");
    ASSERT_EQ(ab->count, 3u);
    EXPECT_EQ(ab->int_at(0), 1);
    EXPECT_EQ(ab->int_at(1), 0);
    const auto* as = f->get_string_array("t.astr");
    ASSERT_NE(as, nullptr);
    ASSERT_EQ(as->size(), strs.size());
    for (size_t i = 0; i < strs.size(); ++i) EXPECT_EQ((*as)[i], strs[i]);
    const gguf::Value* nv = f->find("t.nested");
    ASSERT_EQ(nv->elem_type, ValueType::ARRAY);
    ASSERT_EQ(nv->nested.size(), 3u);
    EXPECT_EQ(nv->nested[0].int_at(1), 2);
    EXPECT_EQ(nv->nested[1].int_at(0), 3);
    ASSERT_EQ(nv->nested[2].strings.size(), 2u);
    EXPECT_EQ(nv->nested[2].strings[1], "yz");
    EXPECT_EQ(f->get_string("t.replaced"), "now a string");
    EXPECT_EQ(f->metadata()[f->metadata().size() - 1].key, "t.replaced");  // last still, only once
    EXPECT_FALSE(f->has("t.removed"));

    // Copying every key from the reader gives the same bytes again (including nested).
    gguf::Writer w2;
    w2.copy_metadata(*f);
    EXPECT_EQ(w2.to_bytes(), bytes);
    gguf::Writer w3;
    w3.copy_metadata(*f, [](std::string_view k) { return k.substr(0, 4) == "t.af"; });
    EXPECT_EQ(w3.n_kv(), 2u);
}

TEST(GgufWriter, TensorsRoundTripWithPointersAndProducers) {
    for (uint32_t align : {32u, 64u, 8u, 4096u}) {
        gguf::Writer w;
        if (align != 32) w.set_alignment(align);
        EXPECT_EQ(w.alignment(), align);
        w.set_string("general.architecture", "test");
        struct T { const char* name; GgmlType type; std::vector<int64_t> ne; size_t nbytes; };
        std::vector<T> ts = {
            {"a.f32", GgmlType::F32, {7}, 28},
            {"b.f16", GgmlType::F16, {3, 5}, 30},
            {"c.q4k", GgmlType::Q4_K, {512, 3}, 2 * 144 * 3},
            {"d.q8", GgmlType::Q8_0, {64, 2, 3}, 2 * 34 * 6},
            {"e.empty", GgmlType::F32, {0, 4}, 0},
            {"f.4d", GgmlType::I8, {2, 3, 4, 5}, 120},
            {"g.scalar", GgmlType::F32, {}, 4},
        };
        std::vector<std::vector<uint8_t>> datas;
        datas.reserve(ts.size());  // producers keep pointers to the elements
        for (size_t i = 0; i < ts.size(); ++i) {
            datas.push_back(pattern(ts[i].nbytes, uint32_t(i + align)));
            std::span<const int64_t> ne(ts[i].ne);
            if (i % 2 == 0) {
                w.add_tensor(ts[i].name, ts[i].type, ne, datas[i].data());
            } else {
                // Producer in uneven chunks of 7 bytes.
                const std::vector<uint8_t>* d = &datas[i];
                w.add_tensor(ts[i].name, ts[i].type, ne, [d](const gguf::ByteSink& out) {
                    for (size_t p = 0; p < d->size(); p += 7) out(d->data() + p, std::min<size_t>(7, d->size() - p));
                });
            }
        }
        std::string path = tmp("tensors" + std::to_string(align) + ".gguf");
        w.write(path);
        EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
        EXPECT_EQ(std::filesystem::file_size(path), w.file_size());
        auto f = gguf::File::open(path);
        EXPECT_EQ(f->alignment(), align);
        EXPECT_TRUE(f->warnings().empty()) << f->warnings()[0];
        ASSERT_EQ(f->tensors().size(), ts.size());
        uint64_t expect_offset = 0;
        for (size_t i = 0; i < ts.size(); ++i) {
            const gguf::TensorInfo& ti = f->tensors()[i];
            EXPECT_EQ(ti.name, ts[i].name);
            EXPECT_EQ(ti.type, ts[i].type);
            EXPECT_EQ(ti.n_dims, ts[i].ne.size());
            for (size_t j = 0; j < 4; ++j) EXPECT_EQ(ti.ne[j], j < ts[i].ne.size() ? ts[i].ne[j] : 1);
            EXPECT_EQ(ti.nbytes, ts[i].nbytes) << ti.name;
            EXPECT_EQ(ti.offset, expect_offset) << ti.name;
            EXPECT_EQ(ti.file_offset % align, 0u);
            expect_offset += (ts[i].nbytes + align - 1) / align * align;
            if (ti.nbytes) {
                EXPECT_EQ(std::memcmp(ti.data, datas[i].data(), ti.nbytes), 0) << ti.name;
            }
        }
        // Canonical: file ends exactly after the last tensor's padding, padding is zero.
        const auto& last = f->tensors().back();
        EXPECT_EQ(last.file_offset + (last.nbytes + align - 1) / align * align, f->total_file_bytes());
        auto bytes = test::read_bytes(path);
        for (uint64_t p = last.file_offset + last.nbytes; p < bytes.size(); ++p) ASSERT_EQ(bytes[p], 0);
        EXPECT_EQ(bytes, w.to_bytes());
        // header_bytes() is exactly what precedes the first tensor's data.
        auto head = w.header_bytes();
        ASSERT_EQ(head.size(), f->tensors()[0].file_offset);
        EXPECT_TRUE(std::equal(head.begin(), head.end(), bytes.begin()));
    }
}

TEST(GgufWriter, RejectsInvalidInput) {
    gguf::Writer w;
    float x[4] = {};
    EXPECT_THROW(w.set_u32("", 1), Error);
    EXPECT_THROW(w.set_u64("general.alignment", 32), Error);
    EXPECT_THROW(w.set_alignment(48), Error);
    EXPECT_THROW(w.set_alignment(0), Error);
    EXPECT_THROW(w.add_tensor(std::string(64, 'n'), GgmlType::F32, {1}, x), Error);
    w.add_tensor(std::string(63, 'n'), GgmlType::F32, {1}, x);
    EXPECT_THROW(w.add_tensor(std::string(63, 'n'), GgmlType::F32, {1}, x), Error);  // duplicate
    EXPECT_THROW(w.add_tensor("five", GgmlType::F32, {1, 1, 1, 1, 1}, x), Error);
    EXPECT_THROW(w.add_tensor("neg", GgmlType::F32, {-1}, x), Error);
    EXPECT_THROW(w.add_tensor("block", GgmlType::Q4_K, {128}, x), Error);
    EXPECT_THROW(w.add_tensor("badtype", GgmlType(4), {1}, x), Error);
    EXPECT_THROW(w.add_tensor("overflow", GgmlType::F32, {1ll << 40, 1ll << 40}, x), Error);
    EXPECT_THROW(w.add_tensor("nodata", GgmlType::F32, {4}, static_cast<const void*>(nullptr)), Error);
    EXPECT_EQ(w.n_tensors(), 1u);
    w.add_tensor("nodata", GgmlType::F32, {4}, x);  // the failed add left no trace

    // A producer that writes the wrong amount fails the write and leaves no file behind.
    for (size_t n : {12, 20}) {
        gguf::Writer bad;
        std::vector<uint8_t> buf(n);
        bad.add_tensor("t", GgmlType::F32, {4}, [&](const gguf::ByteSink& out) { out(buf.data(), buf.size()); });
        std::string path = tmp("bad-producer.gguf");
        try {
            bad.write(path);
            ADD_FAILURE() << "no error for a producer writing " << n << " bytes";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("'t'"), std::string::npos) << e.what();
        }
        EXPECT_FALSE(std::filesystem::exists(path));
        EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    }
    EXPECT_THROW(w.write(test::temp_dir() + "/no/such/dir/x.gguf"), Error);
}

TEST(GgufWriter, SplitFilesOpenAsOneModel) {
    gguf::Writer w;
    w.set_string("general.architecture", "test");
    w.set_alignment(64);
    std::vector<std::vector<uint8_t>> datas;
    for (int i = 0; i < 10; ++i) datas.push_back(pattern(size_t(100 * (i + 1)), uint32_t(i)));
    for (int i = 0; i < 10; ++i)
        w.add_tensor("t" + std::to_string(i), GgmlType::I8, {int64_t(datas[size_t(i)].size())}, datas[size_t(i)].data());
    auto paths = w.write_split(tmp("split"), 1500);
    ASSERT_GT(paths.size(), 2u);
    EXPECT_EQ(paths[0], tmp("split") + "-00001-of-" + strfmt("%05zu", paths.size()) + ".gguf");
    auto f = gguf::File::open(paths[0]);
    EXPECT_EQ(f->n_shards(), paths.size());
    EXPECT_EQ(f->get_string("general.architecture"), "test");
    EXPECT_EQ(f->get_uint("split.count"), paths.size());
    EXPECT_EQ(f->get_uint("split.no"), 0u);
    EXPECT_EQ(f->alignment(), 64u);
    ASSERT_EQ(f->tensors().size(), 10u);
    for (int i = 0; i < 10; ++i) {
        const auto* t = f->find_tensor("t" + std::to_string(i));
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->nbytes, datas[size_t(i)].size());
        EXPECT_EQ(std::memcmp(t->data, datas[size_t(i)].data(), t->nbytes), 0);
    }
    EXPECT_GT(f->tensors().back().shard, 0u);
    // Later shards carry only split.* and the alignment.
    auto bytes1 = test::read_bytes(paths[1]);
    auto s1 = gguf::File::parse_memory(bytes1.data(), bytes1.size(), paths[1]);
    std::vector<std::string> keys;
    for (const auto& kv : s1->metadata()) keys.push_back(kv.key);
    EXPECT_EQ(keys, (std::vector<std::string>{"general.alignment", "split.no", "split.count", "split.tensors.count"}));
    EXPECT_EQ(s1->get_uint("split.no"), 1u);
    EXPECT_EQ(s1->get_uint("split.tensors.count"), 10u);
    for (const auto& p : paths) EXPECT_LE(std::filesystem::file_size(p), 1500u + 4096u);
}

// Rewriting a real llama.cpp-written model through reader + writer reproduces the
// file byte for byte (same key order, canonical layout, zero padding).
TEST(GgufWriter, RewritesReferenceModelByteIdentical) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    for (const char* name : {"tiny-qwen3.q4_k_m.gguf", "tiny-qwen35.q4_k_m.gguf"}) {
        std::string src = test::reference_path(name);
        auto f = gguf::File::open(src);
        gguf::Writer w;
        w.copy_metadata(*f);
        for (const auto& t : f->tensors())
            w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne, t.n_dims), t.data);
        std::string out = tmp(std::string("rewrite-") + name);
        w.write(out);
        EXPECT_EQ(w.file_size(), f->total_file_bytes()) << name;
        EXPECT_TRUE(test::read_bytes(out) == test::read_bytes(src)) << name << " differs after rewrite";
    }
}
