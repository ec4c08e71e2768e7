// Corrupted-file corpus: truncations, flipped bytes and targeted field edits of
// a real reference model, the vocab-only file and small writer-made files. Every
// variant must either be rejected with qinfer::Error or load into a File whose
// tensors and strings all lie inside the buffer. Never a crash, a hang or any
// other exception (bad_alloc included). Run under ASan+UBSan by scripts/test.sh;
// buffers are allocated to the exact truncated size so that an over-read hits
// the sanitizer's red zone.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "testutil.h"

using namespace qinfer;
using gguf::ValueType;

namespace {

bool inside(const uint8_t* base, size_t size, const void* p, uint64_t n) {
    auto* q = static_cast<const uint8_t*>(p);
    return q >= base && q <= base + size && n <= uint64_t(base + size - q);
}

void check_value(const uint8_t* base, size_t size, const gguf::Value& v, const std::string& key) {
    if (v.type == ValueType::STRING) {
        ASSERT_TRUE(inside(base, size, v.str.data(), v.str.size())) << key;
    }
    for (std::string_view s : v.strings) ASSERT_TRUE(inside(base, size, s.data(), s.size())) << key;
    for (const gguf::Value& n : v.nested) check_value(base, size, n, key);
    if (v.elems) {
        auto tt = v.elem_type;
        uint64_t es = tt == ValueType::U8 || tt == ValueType::I8 || tt == ValueType::BOOL ? 1
                      : tt == ValueType::U16 || tt == ValueType::I16                  ? 2
                      : tt == ValueType::U64 || tt == ValueType::I64 || tt == ValueType::F64 ? 8 : 4;
        ASSERT_TRUE(inside(base, size, v.elems, v.count * es)) << key;
    }
}

// Parses `n` bytes from an exactly-sized copy. Returns "" if it loaded (after
// checking the invariants of a loaded file) or the error message.
std::string parse_outcome(const uint8_t* src, size_t n) {
    std::unique_ptr<uint8_t[]> buf(new uint8_t[n ? n : 1]);
    if (n) std::memcpy(buf.get(), src, n);
    std::unique_ptr<gguf::File> f;
    try {
        f = gguf::File::parse_memory(buf.get(), n, "c.gguf");
    } catch (const Error& e) {
        std::string msg = e.what();
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        EXPECT_EQ(msg.rfind("gguf: c.gguf: ", 0), 0u) << msg;
        return msg.empty() ? "?" : msg;
    }
    for (const auto& kv : f->metadata()) check_value(buf.get(), n, kv.value, kv.key);
    for (const auto& t : f->tensors()) {
        EXPECT_TRUE(inside(buf.get(), n, t.data, t.nbytes)) << t.name;
        EXPECT_EQ(t.nbytes, row_bytes(t.type, t.ne[0]) * uint64_t(t.rows())) << t.name;
        EXPECT_EQ(t.offset % f->alignment(), 0u) << t.name;
        EXPECT_EQ(f->find_tensor(t.name), &t);
    }
    return "";
}

// In place, for full-size buffers (a std::vector's heap block ends at its data).
std::string parse_outcome(const std::vector<uint8_t>& b) {
    try {
        auto f = gguf::File::parse_memory(b.data(), b.size(), "c.gguf");
        for (const auto& t : f->tensors()) EXPECT_TRUE(inside(b.data(), b.size(), t.data, t.nbytes)) << t.name;
        for (const auto& kv : f->metadata()) check_value(b.data(), b.size(), kv.value, kv.key);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// End of the metadata = start of the tensor infos: re-encoding the metadata
// alone reproduces it byte for byte (see gguf_writer_test).
size_t metadata_end(const gguf::File& f) {
    gguf::Writer w;
    w.copy_metadata(f);
    return w.to_bytes().size();
}

// Byte offsets of the fields of each tensor info record.
struct InfoFields { size_t name, n_dims, dims, type, offset; };
std::vector<InfoFields> info_fields(const gguf::File& f) {
    std::vector<InfoFields> out;
    size_t p = metadata_end(f);
    for (const auto& t : f.tensors()) {
        InfoFields i;
        i.name = p;
        i.n_dims = p + 8 + t.name.size();
        i.dims = i.n_dims + 4;
        i.type = i.dims + 8 * t.n_dims;
        i.offset = i.type + 4;
        out.push_back(i);
        p = i.offset + 8;
    }
    return out;
}

template <class T> void poke(std::vector<uint8_t>& b, size_t at, T v) { std::memcpy(b.data() + at, &v, sizeof v); }

size_t find(const std::vector<uint8_t>& b, std::string_view s, size_t from = 0) {
    auto it = std::search(b.begin() + ptrdiff_t(from), b.end(), s.begin(), s.end());
    return it == b.end() ? std::string::npos : size_t(it - b.begin());
}

// A small file with every kind of metadata and a few tensors.
std::vector<uint8_t> synthetic(uint32_t alignment) {
    static std::vector<uint8_t> data(4096);
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7);
    gguf::Writer w;
    if (alignment != 32) w.set_alignment(alignment);
    w.set_string("general.architecture", "qwen3");
    w.set_u32("k.aa", 1);
    w.set_u32("k.ab", 2);
    w.set_i8("k.i8", -1);
    w.set_u64("k.u64", 5);
    w.set_f64("k.f64", 0.5);
    w.set_bool("k.bool", true);
    std::vector<int32_t> ia = {1, 2, 3};
    w.set_array("k.ai32", ia);
    std::vector<std::string> sa = {"a", "bb", ""};
    w.set_string_array("k.astr", std::span<const std::string>(sa));
    gguf::Value nested;
    nested.type = ValueType::ARRAY;
    nested.elem_type = ValueType::ARRAY;
    nested.count = 2;
    nested.nested.resize(2);
    for (auto& n : nested.nested) n.type = ValueType::ARRAY, n.elem_type = ValueType::STRING, n.strings = {"x", "y"}, n.count = 2;
    w.set_value("k.nested", nested);
    w.add_tensor("t0", GgmlType::F32, {8, 2}, data.data());
    w.add_tensor("t1", GgmlType::Q8_0, {64}, data.data());
    w.add_tensor("t2", GgmlType::F16, {3}, data.data());
    w.add_tensor("t3", GgmlType::Q4_K, {256}, data.data());
    return w.to_bytes();
}

}  // namespace

TEST(GgufCorrupt, SyntheticEveryTruncationAndByteFlip) {
    for (uint32_t align : {32u, 8u}) {
        std::vector<uint8_t> b = synthetic(align);
        ASSERT_EQ(parse_outcome(b), "");
        auto f = gguf::File::parse_memory(b.data(), b.size(), "s");
        const auto& last = f->tensors().back();
        const size_t need = last.file_offset + last.nbytes;  // padding after the last tensor is optional
        for (size_t n = 0; n < b.size(); ++n) {
            std::string out = parse_outcome(b.data(), n);
            if (n < need) {
                ASSERT_NE(out, "") << "truncated to " << n << " bytes of " << b.size() << " loaded";
            }
        }
        // Every byte of header, metadata and tensor infos, three ways.
        for (size_t at = 0; at < last.file_offset; ++at)
            for (uint8_t mask : {0x01, 0x80, 0xFF}) {
                b[at] ^= mask;
                parse_outcome(b);
                b[at] ^= mask;
            }
    }
}

TEST(GgufCorrupt, SyntheticTargetedEdits) {
    std::vector<uint8_t> b = synthetic(32);
    auto f = gguf::File::parse_memory(b.data(), b.size(), "s");
    auto fields = info_fields(*f);
    auto expect = [&](std::vector<uint8_t> v, const std::string& what) {
        std::string out = parse_outcome(v);
        EXPECT_NE(out.find(what), std::string::npos) << "expected '" << what << "', got '" << out << "'";
    };
    // Duplicate key and tensor names (same length, one letter changed).
    auto d = b;
    d[find(d, "k.ab") + 3] = 'a';
    expect(d, "duplicate key 'k.aa'");
    d = b;
    d[fields[1].name + 8 + 1] = '0';
    expect(d, "duplicate tensor name 't0'");
    // Huge counts and lengths.
    d = b; poke<uint64_t>(d, 8, 1ull << 62); expect(d, "tensor_count");
    d = b; poke<uint64_t>(d, 16, ~0ull); expect(d, "kv_count");
    d = b; poke<uint64_t>(d, 24, ~0ull); expect(d, "string length 18446744073709551615 of name of key #0");
    d = b; poke<uint64_t>(d, find(d, "k.astr") + 6 + 4 + 4, 1ull << 40); expect(d, "array 'k.astr' with 1099511627776 elements");
    d = b; poke<uint64_t>(d, find(d, "k.ai32") + 6 + 4 + 4, 1ull << 31); expect(d, "array 'k.ai32'");
    // Tensor infos: n_dims, dims, type, offset.
    d = b; poke<uint32_t>(d, fields[0].n_dims, 5); expect(d, "tensor 't0' has n_dims 5 > 4");
    d = b; poke<int64_t>(d, fields[0].dims + 8, -2); expect(d, "tensor 't0' dim 1 is negative (-2)");
    d = b; poke<int64_t>(d, fields[0].dims, 1ll << 62); poke<int64_t>(d, fields[0].dims + 8, 1ll << 40);
    expect(d, "tensor 't0' element count overflows");
    d = b; poke<uint32_t>(d, fields[2].type, 4); expect(d, "tensor 't2' has unknown/removed ggml type 4");
    d = b; poke<uint32_t>(d, fields[2].type, 99); expect(d, "unknown/removed ggml type 99");
    d = b; poke<uint32_t>(d, fields[2].type, uint32_t(GgmlType::Q4_0)); expect(d, "row length 3 not a multiple of block size 32");
    d = b; poke<uint64_t>(d, fields[3].offset, f->tensors()[3].offset + 1); expect(d, "tensor 't3' offset");
    d = b; poke<uint64_t>(d, fields[3].offset, f->tensors()[3].offset + 4096); expect(d, "tensor 't3' data");
    d = b; poke<uint64_t>(d, fields[1].offset, 0); expect(d, "overlap");
}

TEST(GgufCorrupt, ReferenceModel) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    std::vector<uint8_t> b = test::read_bytes(test::reference_path("tiny-qwen3.q4_k_m.gguf"));
    auto f = gguf::File::parse_memory(b.data(), b.size(), "ref");
    auto fields = info_fields(*f);
    const size_t infos_begin = fields.front().name, infos_end = fields.back().offset + 8;
    const size_t data_begin = f->tensors().front().file_offset;
    const auto& last = f->tensors().back();
    const size_t need = last.file_offset + last.nbytes;

    // Truncations: every byte of the header and the first keys, every 5th byte of
    // the tensor infos (each cut re-parses 263 KB of token strings; the synthetic
    // test above covers every byte of a small file), sampled offsets elsewhere.
    std::vector<size_t> cuts;
    for (size_t n = 0; n < 2048; ++n) cuts.push_back(n);
    for (size_t n = infos_begin - 64; n < data_begin + 64; n += 5) cuts.push_back(n);
    std::mt19937_64 rng(1);
    for (int i = 0; i < 400; ++i) cuts.push_back(2048 + rng() % (infos_begin - 2048));
    for (int i = 0; i < 100; ++i) cuts.push_back(data_begin + rng() % (b.size() - data_begin));
    cuts.push_back(need - 1);
    cuts.push_back(need);
    for (size_t n : cuts) {
        std::string out = parse_outcome(b.data(), n);
        if (n < need) {
            ASSERT_NE(out, "") << "truncated to " << n << " bytes loaded";
        }
    }
    EXPECT_EQ(parse_outcome(b.data(), need), "");

    // Flipped bytes: every header byte and every tensor-info byte, sampled metadata bytes.
    auto flip = [&](size_t at) {
        static const uint8_t masks[] = {0x01, 0x40, 0xFF, 0x10, 0x80};
        uint8_t mask = masks[at % 5];
        b[at] ^= mask;
        parse_outcome(b);
        b[at] ^= mask;
    };
    for (size_t at = 0; at < 64; ++at) flip(at);
    for (size_t at = infos_begin; at < infos_end; at += 3) flip(at);
    for (int i = 0; i < 300; ++i) flip(64 + rng() % (infos_begin - 64));

    // Targeted edits.
    auto expect = [&](std::vector<uint8_t> v, const std::string& what) {
        std::string out = parse_outcome(v);
        EXPECT_NE(out.find(what), std::string::npos) << "expected '" << what << "', got '" << out << "'";
    };
    auto expect_error = [&](std::vector<uint8_t> v) { EXPECT_NE(parse_outcome(v), ""); };
    auto d = b;
    d[find(d, "tokenizer.ggml.eos_token_id") + 15] = 'b';
    expect(d, "duplicate key 'tokenizer.ggml.bos_token_id'");
    d = b;
    d[find(d, "blk.1.attn_k.weight", infos_begin) + 4] = '0';
    expect(d, "duplicate tensor name 'blk.0.attn_k.weight'");
    size_t tok = find(b, "tokenizer.ggml.tokens") + 21 + 4 + 4;  // the count of the token array
    d = b; poke<uint64_t>(d, tok, 1ull << 40); expect(d, "array 'tokenizer.ggml.tokens' with 1099511627776 elements");
    d = b; poke<uint64_t>(d, tok, 8219); expect_error(d);  // misparses the next key: any error will do
    d = b; poke<uint64_t>(d, tok + 8, 1ull << 50); expect(d, "string length 1125899906842624 of array element of key 'tokenizer.ggml.tokens'");
    d = b; poke<uint64_t>(d, 8, 1ull << 50); expect(d, "tensor_count");
    d = b; poke<uint64_t>(d, 16, 1ull << 20); expect(d, "kv_count 1048576 cannot fit");
    d = b; poke<uint64_t>(d, 16, 26); expect_error(d);
    size_t k = fields.size() - 1;
    d = b; poke<uint64_t>(d, fields[k].offset, 1ull << 40); expect(d, "data [");
    d = b; poke<uint64_t>(d, fields[k].offset, f->tensors()[k].offset + 8); expect(d, "is not a multiple of alignment 32");
    d = b; poke<uint32_t>(d, fields[k].type, 31); expect(d, "unknown/removed ggml type 31");
    size_t e = size_t(f->find_tensor("token_embd.weight") - f->tensors().data());
    ASSERT_EQ(f->tensors()[e].n_dims, 2u);
    d = b; poke<uint32_t>(d, fields[e].n_dims, 7); expect(d, "n_dims 7 > 4");
    d = b; poke<int64_t>(d, fields[e].dims + 8, -8218); expect(d, "tensor 'token_embd.weight' dim 1 is negative");
    d = b; poke<int64_t>(d, fields[e].dims + 8, 1ll << 60); expect(d, "tensor 'token_embd.weight' element count overflows");  // q6_K: < 1 byte per element
    d = b; poke<int64_t>(d, fields[e].dims, 1ll << 60); expect(d, "tensor 'token_embd.weight' element count overflows");
    d = b; poke<int64_t>(d, fields[e].dims + 8, 8219); expect(d, "token_embd.weight");  // runs into the next tensor or off the end
}

TEST(GgufCorrupt, ReferenceVocabAndRandomDamage) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    std::vector<uint8_t> v = test::read_bytes(test::reference_path("vocab-qwen35.gguf"));
    auto f = gguf::File::parse_memory(v.data(), v.size(), "vocab");
    const size_t meta_end = metadata_end(*f);  // llama.cpp pads even a tensor-less file
    std::mt19937_64 rng(7);
    for (int i = 0; i < 60; ++i) {
        size_t n = rng() % meta_end;
        ASSERT_NE(parse_outcome(v.data(), n), "") << n;
    }
    for (size_t n = meta_end; n <= v.size(); ++n) EXPECT_EQ(parse_outcome(v.data(), n), "");

    // Random multi-byte damage to a small reference model, restored after each try.
    std::vector<uint8_t> b = test::read_bytes(test::reference_path("tiny-qwen35.q4_k_m.gguf"));
    auto g = gguf::File::parse_memory(b.data(), b.size(), "ref");
    const size_t region = g->tensors().front().file_offset;
    for (int iter = 0; iter < 300; ++iter) {
        std::vector<std::pair<size_t, uint8_t>> saved;
        int n_bytes = 1 + int(rng() % 8);
        for (int j = 0; j < n_bytes; ++j) {
            // Bias towards the header and tensor infos, where every byte matters.
            size_t at = (rng() % 3 == 0) ? rng() % 64 : region - 1 - rng() % std::min<size_t>(region, 12000);
            saved.emplace_back(at, b[at]);
            b[at] = uint8_t(rng());
        }
        parse_outcome(b);
        for (auto it = saved.rbegin(); it != saved.rend(); ++it) b[it->first] = it->second;
    }
    EXPECT_EQ(parse_outcome(b), "");
}
