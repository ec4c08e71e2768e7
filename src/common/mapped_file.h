// Read-only memory map of a whole file. Opening a multi-GB GGUF costs a
// page-table update, not a copy; tensor data is paged in on first touch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace qinfer {

class MappedFile {
public:
    MappedFile() = default;
    explicit MappedFile(const std::string& path);  // throws Error
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    MappedFile(MappedFile&& o) noexcept;
    MappedFile& operator=(MappedFile&& o) noexcept;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    void release();
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
#ifdef _WIN32
    void* file_ = nullptr;
    void* mapping_ = nullptr;
#endif
};

bool file_exists(const std::string& path);

}  // namespace qinfer
