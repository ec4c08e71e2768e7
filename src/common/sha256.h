// SHA-256 (FIPS 180-4) for `qinfer info --sha256` and download checks.
// Sha256 uses OpenSSL's EVP when the build has it (QINFER_HAVE_OPENSSL) and our
// own implementation otherwise; Sha256Portable is always ours, so tests can
// compare the two.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace qinfer {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256Portable {
public:
    Sha256Portable();
    void update(const void* data, size_t n);
    Sha256Digest finish();  // the object must not be updated afterwards

private:
    void block(const uint8_t* p);
    uint32_t h_[8];
    uint8_t buf_[64];
    size_t buf_len_ = 0;
    uint64_t total_ = 0;
};

class Sha256 {
public:
    Sha256();
    ~Sha256();
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;
    void update(const void* data, size_t n);
    Sha256Digest finish();
    static const char* backend();  // "openssl" or "portable"

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

std::string to_hex(const Sha256Digest& d);
std::string sha256_hex(const void* data, size_t n);
// Hash of a whole file (memory-mapped, hashed in 1 MiB steps). Throws Error.
std::string sha256_file_hex(const std::string& path);

}  // namespace qinfer
