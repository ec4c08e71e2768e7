// GGUF reader: every entry of the error catalogue (spec/gguf.md §12) on a
// hand-built file, with the message and the byte offset it must name; the
// tolerated oddities (v2, non-canonical layout, odd bools); split models; getters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "testutil.h"

using namespace qinfer;
using gguf::ValueType;

namespace {

// Builds raw GGUF bytes field by field, so that invalid files can be expressed.
struct Bytes {
    std::vector<uint8_t> b;
    template <class T> Bytes& put(T v) {
        uint8_t raw[sizeof(T)];
        std::memcpy(raw, &v, sizeof(T));
        b.insert(b.end(), raw, raw + sizeof(T));
        return *this;
    }
    Bytes& u32(uint32_t v) { return put(v); }
    Bytes& u64(uint64_t v) { return put(v); }
    Bytes& i64(int64_t v) { return put(v); }
    Bytes& str(std::string_view s) {
        u64(s.size());
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        b.insert(b.end(), {'G', 'G', 'U', 'F'});
        return u32(version).u64(n_tensors).u64(n_kv);
    }
    Bytes& kv_u32(std::string_view k, uint32_t v) { return str(k).u32(uint32_t(ValueType::U32)).u32(v); }
    Bytes& tensor(std::string_view name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
        str(name).u32(uint32_t(ne.size()));
        for (int64_t d : ne) i64(d);
        return u32(type).u64(offset);
    }
    Bytes& pad_to(size_t a) {
        b.resize((b.size() + a - 1) / a * a, 0);
        return *this;
    }
    Bytes& zeros(size_t n) {
        b.resize(b.size() + n, 0);
        return *this;
    }
    size_t size() const { return b.size(); }
};

std::string error_of(const std::vector<uint8_t>& bytes) {
    try {
        gguf::File::parse_memory(bytes.data(), bytes.size(), "t.gguf");
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// The message must contain `what` and name the file and the byte offset.
void expect_error(const std::vector<uint8_t>& bytes, const std::string& what, size_t offset) {
    std::string msg = error_of(bytes);
    EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "', got: " << msg;
    EXPECT_EQ(msg.rfind("gguf: t.gguf: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(strfmt("(offset %zu)", offset)), std::string::npos) << "expected offset " << offset << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message must be one line: " << msg;
}

std::unique_ptr<gguf::File> parse(const std::vector<uint8_t>& b) {
    return gguf::File::parse_memory(b.data(), b.size(), "t.gguf");
}

}  // namespace

TEST(GgufReader, HeaderErrors) {
    expect_error(std::vector<uint8_t>(23, 0), "file too small for a GGUF header", 0);
    expect_error(std::vector<uint8_t>{}, "file too small", 0);
    Bytes m;
    m.b = {'G', 'G', 'U', 'X'};
    m.u32(3).u64(0).u64(0);
    expect_error(m.b, "invalid magic 'GGUX', expected 'GGUF'", 0);
    m.b[0] = 0x01;
    expect_error(m.b, "invalid magic '?GUX'", 0);
    expect_error(Bytes().header(0, 0, 0).b, "bad version 0", 4);
    expect_error(Bytes().header(0, 0, 1).b, "GGUF v1 is not supported", 4);
    expect_error(Bytes().header(0, 0, 0x03000000).b, "big-endian GGUF files are not supported", 4);
    expect_error(Bytes().header(0, 0, 0x02000000).b, "big-endian", 4);
    expect_error(Bytes().header(0, 0, 4).b, "version 4 is newer than supported (3)", 4);
    expect_error(Bytes().header(1000, 0).zeros(100).b, "tensor_count 1000 cannot fit in a file of 124 bytes", 8);
    expect_error(Bytes().header(0, ~0ull).b, "kv_count 18446744073709551615 cannot fit", 16);
    expect_error(Bytes().header(3, 3).zeros(100).b, "kv_count 3 cannot fit", 16);  // 3*14 + 3*24 > 100
    // v2 has the same layout as v3 and is accepted.
    auto f = parse(Bytes().header(0, 1, 2).kv_u32("a", 7).b);
    EXPECT_EQ(f->version(), 2u);
    EXPECT_EQ(f->get_uint("a"), 7u);
    // Empty file: header only.
    EXPECT_TRUE(parse(Bytes().header(0, 0).b)->metadata().empty());
}

TEST(GgufReader, MetadataErrors) {
    // Offsets: the header is 24 bytes; key #0 starts at 24.
    expect_error(Bytes().header(0, 1).u64(20).zeros(6).b, "string length 20 of name of key #0 exceeds the remaining file size", 24);
    expect_error(Bytes().header(0, 1).str("abcde").zeros(1).b, "unexpected end of file while reading value type of key 'abcde'", 37);
    expect_error(Bytes().header(0, 1).str("k").u32(uint32_t(ValueType::U64)).zeros(1).b,
                 "unexpected end of file while reading value of key 'k'", 37);
    expect_error(Bytes().header(0, 1).str("").u32(4).u32(0).b, "key #0 is empty", 24);
    expect_error(Bytes().header(0, 2).kv_u32("a", 1).kv_u32("a", 2).b, "duplicate key 'a'", 41);
    expect_error(Bytes().header(0, 1).str("a").u32(13).u32(0).b, "key 'a' has invalid value type 13", 33);
    expect_error(Bytes().header(0, 1).str("a").u32(0x80000000u).u32(0).b, "invalid value type 2147483648", 33);
    // Arrays.
    expect_error(Bytes().header(0, 1).str("a").u32(9).u32(13).u64(0).b, "array 'a' has invalid element type 13", 37);
    expect_error(Bytes().header(0, 1).str("a").u32(9).u32(4).u64(1000).zeros(8).b,
                 "array 'a' with 1000 elements of type u32 exceeds the remaining file size", 37);
    expect_error(Bytes().header(0, 1).str("a").u32(9).u32(4).u64(1ull << 62).zeros(8).b, "elements of type u32", 37);
    expect_error(Bytes().header(0, 1).str("a").u32(9).u32(8).u64(2).str("x").u64(100).b,
                 "string length 100 of array element of key 'a' exceeds the remaining file size", 58);
    // Nested arrays: 8 levels of arrays-of-arrays parse, 9 do not.
    for (int levels : {8, 9}) {
        Bytes n;
        n.header(0, 1).str("a").u32(9);
        for (int d = 0; d < levels; ++d) n.u32(9).u64(1);
        n.u32(4).u64(1).u32(42);
        if (levels == 8) {
            auto f = parse(n.b);
            const gguf::Value* v = f->find("a");
            for (int d = 0; d < levels; ++d) {
                ASSERT_EQ(v->elem_type, ValueType::ARRAY);
                ASSERT_EQ(v->nested.size(), 1u);
                v = &v->nested[0];
            }
            EXPECT_EQ(v->int_at(0), 42);
        } else {
            expect_error(n.b, "array 'a' is nested more than 8 levels deep", 37 + 8 * 12);
        }
    }
    // general.alignment.
    Bytes al;
    al.header(0, 1).str("general.alignment").u32(uint32_t(ValueType::U64)).u64(32);
    expect_error(al.b, "general.alignment must be u32, not u64", 49);
    expect_error(Bytes().header(0, 1).kv_u32("general.alignment", 48).b, "general.alignment 48 is not a power of two", 49);
    expect_error(Bytes().header(0, 1).kv_u32("general.alignment", 0).b, "general.alignment 0 is not a power of two", 49);
    auto f = parse(Bytes().header(0, 1).kv_u32("general.alignment", 4).b);
    EXPECT_EQ(f->alignment(), 4u);
    ASSERT_EQ(f->warnings().size(), 1u);
    EXPECT_NE(f->warnings()[0].find("not a multiple of 8"), std::string::npos);
    // A bool byte other than 0/1 is true, with a warning.
    Bytes bo;
    bo.header(0, 1).str("b").u32(uint32_t(ValueType::BOOL)).b.push_back(2);
    bo.zeros(4);
    f = parse(bo.b);
    EXPECT_EQ(f->get_bool("b"), true);
    EXPECT_EQ(f->warnings().size(), 1u);
}

TEST(GgufReader, TensorInfoErrors) {
    // Tensor info #0 starts at 24; n_dims at 24+9 for a one-letter name.
    auto one = [](std::string_view name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
        Bytes b;
        b.header(1, 0).tensor(name, ne, type, offset).pad_to(32).zeros(64);
        return b.b;
    };
    expect_error(one(std::string(64, 'n'), {4}, 0, 0), "tensor name #0 is too long (64 >= 64)", 24);
    EXPECT_NO_THROW(parse(one(std::string(63, 'n'), {4}, 0, 0)));
    expect_error(one("a", {1, 1, 1, 1, 1}, 0, 0), "tensor 'a' has n_dims 5 > 4", 33);
    expect_error(one("a", {4, -1}, 0, 0), "tensor 'a' dim 1 is negative (-1)", 45);
    expect_error(one("a", {int64_t(1) << 32, int64_t(1) << 32}, 0, 0), "tensor 'a' element count overflows", 33);
    expect_error(one("a", {std::numeric_limits<int64_t>::max(), 2}, 0, 0), "element count overflows", 33);
    for (uint32_t bad : {4u, 5u, 31u, 33u, 36u, 38u, 43u, 1000u, 0xFFFFFFFFu})
        expect_error(one("a", {256}, bad, 0), strfmt("tensor 'a' has unknown/removed ggml type %u", bad), 45);
    expect_error(one("a", {100}, 12, 0), "tensor 'a' row length 100 not a multiple of block size 256 for type Q4_K", 33);
    expect_error(one("a", {int64_t(1) << 61}, 28, 0), "tensor 'a' has a size in bytes that overflows", 33);   // F64
    expect_error(one("a", {int64_t(1) << 62, 4}, 24, 0), "element count overflows", 33);
    expect_error(one("a", {int64_t(1) << 60, 2}, 0, 0), "size in bytes that overflows", 33);                  // F32, 2^63 bytes
    expect_error(one("a", {4}, 0, 16), "tensor 'a' offset 16 is not a multiple of alignment 32", 49);
    // Data outside the file: info ends at 57 -> data_start 64; file size 128.
    expect_error(one("a", {100}, 0, 0), "tensor 'a' data [64, 464) is outside the file (size 128)", 24);
    expect_error(one("a", {4}, 0, 64), "tensor 'a' data [128, 144) is outside the file", 24);
    expect_error(one("a", {4}, 0, uint64_t(1) << 63), "is outside the file", 24);
    expect_error(one("a", {4}, 0, ~uint64_t(31)), "is outside the file", 24);
    // Truncated inside a tensor info.
    expect_error(Bytes().header(1, 0).str("abc").u32(2).i64(4).zeros(1).b,
                 "unexpected end of file while reading dimension of tensor 'abc'", 47);
    // Duplicate names; second info starts at 24 + 9+4+8+4+8 = 57.
    Bytes d;
    d.header(2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).pad_to(32).zeros(64);
    expect_error(d.b, "duplicate tensor name 'a'", 57);
}

TEST(GgufReader, DataLayout) {
    // Overlap: a = 64 bytes at 0, b at 32.
    Bytes o;
    o.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad_to(32).zeros(128);
    expect_error(o.b, "tensors 'a' and 'b' overlap", 57);
    // A small tensor inside a big one, listed later and first in memory.
    Bytes o2;
    o2.header(3, 0).tensor("big", {64}, 0, 64).tensor("small", {4}, 0, 0).tensor("in", {4}, 0, 128).pad_to(32).zeros(512);
    std::string msg = error_of(o2.b);
    EXPECT_NE(msg.find("tensors 'big' and 'in' overlap"), std::string::npos) << msg;
    // Non-canonical but valid (reversed order): loads, with a warning.
    Bytes r;
    r.header(2, 0).tensor("a", {16}, 0, 64).tensor("b", {16}, 0, 0).pad_to(32);
    size_t data_start = r.size();
    for (int i = 0; i < 128; ++i) r.b.push_back(uint8_t(i));
    auto f = parse(r.b);
    ASSERT_EQ(f->warnings().size(), 1u);
    EXPECT_NE(f->warnings()[0].find("not laid out canonically"), std::string::npos);
    EXPECT_EQ(f->find_tensor("a")->file_offset, data_start + 64);
    EXPECT_EQ(f->find_tensor("a")->data[0], 64);
    EXPECT_EQ(f->find_tensor("b")->data[0], 0);
    // The padding after the last tensor is optional; zero-sized tensors are legal.
    Bytes np;
    np.header(2, 0).tensor("z", {0, 3}, 0, 0).tensor("a", {5}, 0, 0).pad_to(32).zeros(20);
    f = parse(np.b);
    EXPECT_EQ(f->find_tensor("a")->nbytes, 20u);
    EXPECT_EQ(f->find_tensor("z")->nbytes, 0u);
    EXPECT_EQ(f->find_tensor("z")->n_elements(), 0);
    EXPECT_TRUE(f->warnings().empty());
    // Alignment from general.alignment applies to data_start and offsets.
    Bytes a64;
    a64.header(1, 1).kv_u32("general.alignment", 64).tensor("a", {4}, 0, 0).pad_to(64);
    size_t ds = a64.size();
    a64.zeros(16);
    f = parse(a64.b);
    EXPECT_EQ(f->find_tensor("a")->file_offset, ds);
    EXPECT_EQ(ds % 64, 0u);
    a64.b[ds - 1] = 0;  // still fine: padding content is not checked
    a64.b.resize(ds - 1 + 16);
    EXPECT_NE(error_of(a64.b).find("outside the file"), std::string::npos);
}

TEST(GgufReader, TypedGetters) {
    gguf::Writer w;
    w.set_string("s", "text");
    w.set_i32("neg", -5);
    w.set_u64("big", ~0ull);
    w.set_u16("u16", 7);
    w.set_f32("nan", std::nanf(""));
    std::vector<float> fl = {1.5f, std::nanf(""), 1e30f};
    w.set_array("fa", fl);
    std::vector<uint32_t> ua = {1, 2};
    w.set_array("ua", ua);
    std::vector<std::string> sa = {"x"};
    w.set_string_array("sa", std::span<const std::string>(sa));
    auto bytes = w.to_bytes();
    auto f = gguf::File::parse_memory(bytes.data(), bytes.size(), "g.gguf");
    auto err = [&](auto fn) -> std::string {
        try { fn(); } catch (const Error& e) { return e.what(); }
        return "(no error)";
    };
    EXPECT_NE(err([&] { f->get_uint("s"); }).find("gguf: g.gguf: key 's' has type string, expected an integer"), std::string::npos);
    EXPECT_NE(err([&] { f->get_uint("neg"); }).find("key 'neg' is negative (-5)"), std::string::npos);
    EXPECT_EQ(f->get_int("neg"), -5);
    EXPECT_EQ(f->get_uint("big"), ~0ull);
    EXPECT_NE(err([&] { f->get_int("big"); }).find("does not fit in int64"), std::string::npos);
    EXPECT_EQ(*f->get_float("big"), 18446744073709551615.0);
    EXPECT_EQ(f->get_uint("u16"), 7u);
    EXPECT_EQ(*f->get_float("u16"), 7.0);
    EXPECT_NE(err([&] { f->get_string("u16"); }).find("key 'u16' has type u16, expected string"), std::string::npos);
    EXPECT_NE(err([&] { f->require_uint("missing"); }).find("required key 'missing' is missing"), std::string::npos);
    EXPECT_NE(err([&] { f->require_string("missing"); }).find("required key 'missing' is missing"), std::string::npos);
    EXPECT_NE(err([&] { f->get_string_array("ua"); }).find("key 'ua' is not an array of strings"), std::string::npos);
    EXPECT_EQ(f->get_string_array("missing"), nullptr);
    EXPECT_TRUE(std::isnan(*f->get_float("nan")));
    const gguf::Value* fa = f->find("fa");
    EXPECT_EQ(fa->int_at(0), 1);
    EXPECT_TRUE(std::isnan(fa->float_at(1)));
    EXPECT_THROW(fa->int_at(1), Error);  // NaN is not an integer (and casting it would be UB)
    EXPECT_THROW(fa->int_at(2), Error);  // 1e30 does not fit
    EXPECT_THROW(fa->int_at(3), Error);  // out of range
    EXPECT_THROW(f->find("sa")->int_at(0), Error);
    EXPECT_THROW(f->find("s")->int_at(0), Error);
    EXPECT_EQ(f->find("ua")->float_at(1), 2.0);
}

TEST(GgufReader, OpenErrors) {
    std::string dir = test::temp_dir();
    std::string msg;
    try { gguf::File::open(dir + "/does-not-exist.gguf"); } catch (const Error& e) { msg = e.what(); }
    EXPECT_NE(msg.find("does-not-exist.gguf: cannot open file"), std::string::npos) << msg;
    msg.clear();
    try { gguf::File::open(dir); } catch (const Error& e) { msg = e.what(); }
    EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
    gguf::Writer().write(dir + "/empty-model.gguf");
    EXPECT_EQ(gguf::File::open(dir + "/empty-model.gguf")->metadata().size(), 0u);
}

TEST(GgufReader, SplitModels) {
    namespace fs = std::filesystem;
    std::string dir = test::temp_dir() + "/split";
    fs::create_directories(dir);
    std::vector<float> x(64, 1.f);
    gguf::Writer w;
    w.set_string("general.architecture", "test");
    for (int i = 0; i < 6; ++i) w.add_tensor("t" + std::to_string(i), GgmlType::F32, {64}, x.data());
    auto paths = w.write_split(dir + "/m", 512);  // 2 tensors per shard
    ASSERT_EQ(paths.size(), 3u);
    EXPECT_EQ(gguf::File::open(paths[0])->tensors().size(), 6u);
    auto msg_of = [](const std::string& p) -> std::string {
        try { gguf::File::open(p); } catch (const Error& e) { return e.what(); }
        return "(no error)";
    };
    EXPECT_NE(msg_of(paths[1]).find("this is shard 2 of a split model; open the first shard"), std::string::npos);
    // Renamed first shard: split.count says there are others.
    fs::copy_file(paths[0], dir + "/renamed.gguf");
    EXPECT_NE(msg_of(dir + "/renamed.gguf").find("split.count is 3 but the file name is not"), std::string::npos)
        << msg_of(dir + "/renamed.gguf");
    // Shards in the wrong place: shard 3's file holds shard 2.
    fs::copy_file(paths[2], dir + "/saved", fs::copy_options::overwrite_existing);
    fs::copy_file(paths[1], paths[2], fs::copy_options::overwrite_existing);
    std::string m = msg_of(paths[0]);
    EXPECT_NE(m.find("m-00003-of-00003.gguf: shard has split.no 1, expected 2"), std::string::npos) << m;
    // Missing shard.
    fs::remove(paths[2]);
    EXPECT_NE(msg_of(paths[0]).find("missing shard " + paths[2]), std::string::npos) << msg_of(paths[0]);
    fs::copy_file(dir + "/saved", paths[2]);
    EXPECT_NO_THROW(gguf::File::open(paths[0]));

    // Hand-made shards with inconsistent split keys.
    auto shard = [&](const std::string& path, int no, int count, int total, std::vector<std::string> names) {
        gguf::Writer s;
        s.set_u16("split.no", uint16_t(no));
        s.set_u16("split.count", uint16_t(count));
        s.set_i32("split.tensors.count", total);
        for (const auto& n : names) s.add_tensor(n, GgmlType::F32, {64}, x.data());
        s.write(path);
    };
    std::string p1 = dir + "/h-00001-of-00002.gguf", p2 = dir + "/h-00002-of-00002.gguf";
    shard(p1, 0, 2, 3, {"a"});
    shard(p2, 1, 2, 3, {"b"});
    EXPECT_NE(msg_of(p1).find("split.tensors.count 3 but 2 tensors found"), std::string::npos) << msg_of(p1);
    shard(p2, 1, 2, 3, {"b", "a"});
    EXPECT_NE(msg_of(p1).find("duplicate tensor name 'a'"), std::string::npos) << msg_of(p1);
    shard(p2, 1, 3, 2, {"b"});
    EXPECT_NE(msg_of(p1).find("shard has split.count 3, expected 2"), std::string::npos) << msg_of(p1);
    shard(p1, 0, 2, 2, {"a"});
    shard(p2, 1, 2, 2, {"b"});
    auto f = gguf::File::open(p1);
    EXPECT_EQ(f->n_shards(), 2u);
    EXPECT_EQ(f->find_tensor("b")->shard, 1u);
    // The first shard may hold no tensors at all (gguf-split --no-tensor-first-split).
    shard(p1, 0, 2, 1, {});
    shard(p2, 1, 2, 1, {"b"});
    EXPECT_EQ(gguf::File::open(p1)->tensors().size(), 1u);
}
