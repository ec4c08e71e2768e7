// SHA-256 (src/common/sha256, part of the core library that gguf_* tests link):
// FIPS 180-4 test vectors for both implementations, the two cross-checked on
// every length and chunking, and whole-file hashes against MANIFEST.md.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "common/sha256.h"
#include "testutil.h"

using namespace qinfer;

namespace {
std::string portable_hex(const std::string& s) {
    Sha256Portable h;
    h.update(s.data(), s.size());
    return to_hex(h.finish());
}
}  // namespace

TEST(Sha256, KnownVectors) {
    struct V { std::string in; const char* hex; };
    const V vs[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrst"
         "nopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
        {std::string(1000000, 'a'), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
    };
    for (const V& v : vs) {
        EXPECT_EQ(portable_hex(v.in), v.hex) << v.in.size() << " bytes";
        EXPECT_EQ(sha256_hex(v.in.data(), v.in.size()), v.hex) << Sha256::backend();
    }
}

TEST(Sha256, BackendsAgreeOnEveryLengthAndChunking) {
    std::mt19937 rng(3);
    std::string data(300, '\0');
    for (char& c : data) c = char(rng());
    for (size_t n = 0; n <= data.size(); ++n) {
        std::string ref = sha256_hex(data.data(), n);
        EXPECT_EQ(portable_hex(data.substr(0, n)), ref) << n;
        // Same input in uneven pieces.
        Sha256Portable p;
        Sha256 q;
        for (size_t at = 0; at < n;) {
            size_t k = std::min<size_t>(1 + rng() % 70, n - at);
            p.update(data.data() + at, k);
            q.update(data.data() + at, k);
            at += k;
        }
        EXPECT_EQ(to_hex(p.finish()), ref) << n;
        EXPECT_EQ(to_hex(q.finish()), ref) << n;
    }
}

TEST(Sha256, ReferenceFilesMatchManifest) {
    if (!test::reference_available()) GTEST_SKIP() << "reference data not found";
    EXPECT_EQ(sha256_file_hex(test::reference_path("tiny-qwen3.q4_k_m.gguf")),
              "4c57a74c4247b0be0835cebff7f4948b15e50f2d07b23597b1876bfd6180c101");
    EXPECT_EQ(sha256_file_hex(test::reference_path("tokenize-cases.txt")),
              "cd795dc5cb13d639d88ee54b694da111baac437ffc4299b2e5daebe27bd24ff8");
    auto bytes = test::read_bytes(test::reference_path("vocab-qwen35.gguf"));
    Sha256Portable p;
    p.update(bytes.data(), bytes.size());
    EXPECT_EQ(to_hex(p.finish()), "d0a1054b40029471d447454a293797bb6bfc2a1ed6c6cbc88f4ccc04e5552713");
}
