#include "common/mapped_file.h"

#include "common/error.h"
#include "common/platform.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#ifdef _WIN32
#include <windows.h>
#else
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace qinfer {

#ifdef _WIN32
// The system's message for the last error, e.g. "The system cannot find the file specified."
static std::string last_error() {
    const DWORD code = GetLastError();
    wchar_t* msg = nullptr;
    const DWORD n = FormatMessageW(FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS,
                                   nullptr, code, 0, reinterpret_cast<wchar_t*>(&msg), 0, nullptr);
    std::string s;
    if (n > 0 && msg) {
        int len = WideCharToMultiByte(CP_UTF8, 0, msg, int(n), nullptr, 0, nullptr, nullptr);
        s.resize(size_t(len > 0 ? len : 0));
        if (len > 0) WideCharToMultiByte(CP_UTF8, 0, msg, int(n), s.data(), len, nullptr, nullptr);
    }
    if (msg) LocalFree(msg);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '.')) s.pop_back();
    return s.empty() ? strfmt("error %lu", (unsigned long)code) : s;
}
#endif

MappedFile::MappedFile(const std::string& path) : path_(path) {
#ifdef _WIN32
    // FILE_SHARE_DELETE too: a model being read must not stop a writer from
    // replacing the file (rename over it), as on POSIX.
    HANDLE f = CreateFileW(utf8_path(path).c_str(), GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_DELETE, nullptr,
                           OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr);
    if (f == INVALID_HANDLE_VALUE) fail(strfmt("%s: cannot open file: %s", path.c_str(), last_error().c_str()));
    BY_HANDLE_FILE_INFORMATION fi;
    if (GetFileInformationByHandle(f, &fi) && (fi.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY)) {
        CloseHandle(f);
        fail(strfmt("%s: not a regular file", path.c_str()));
    }
    LARGE_INTEGER sz;
    if (!GetFileSizeEx(f, &sz)) {
        CloseHandle(f);
        fail(strfmt("%s: cannot get file size", path.c_str()));
    }
    file_ = f;
    size_ = size_t(sz.QuadPart);
    if (size_ == 0) return;
    HANDLE m = CreateFileMappingW(f, nullptr, PAGE_READONLY, 0, 0, nullptr);
    if (!m) {
        const std::string why = last_error();
        release();
        fail(strfmt("%s: cannot map file: %s", path.c_str(), why.c_str()));
    }
    mapping_ = m;
    data_ = static_cast<const uint8_t*>(MapViewOfFile(m, FILE_MAP_READ, 0, 0, 0));
    if (!data_) {
        const std::string why = last_error();
        release();
        fail(strfmt("%s: cannot map file: %s", path.c_str(), why.c_str()));
    }
#else
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(strfmt("%s: cannot open file: %s", path.c_str(), std::strerror(errno)));
    struct stat st{};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(strfmt("%s: not a regular file", path.c_str()));
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
        void* p = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            ::close(fd);
            fail(strfmt("%s: mmap failed: %s", path.c_str(), std::strerror(errno)));
        }
        data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
#endif
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
    if (this != &o) {
        release();
        path_ = std::move(o.path_);
        data_ = o.data_;
        size_ = o.size_;
        o.data_ = nullptr;
        o.size_ = 0;
#ifdef _WIN32
        file_ = o.file_;
        mapping_ = o.mapping_;
        o.file_ = o.mapping_ = nullptr;
#endif
    }
    return *this;
}

void MappedFile::release() {
#ifdef _WIN32
    if (data_) UnmapViewOfFile(data_);
    if (mapping_) CloseHandle(mapping_);
    if (file_) CloseHandle(file_);
    file_ = mapping_ = nullptr;
#else
    if (data_) munmap(const_cast<uint8_t*>(data_), size_);
#endif
    data_ = nullptr;
    size_ = 0;
}

bool file_exists(const std::string& path) {
    std::error_code ec;
    return std::filesystem::is_regular_file(utf8_path(path), ec);
}

}  // namespace qinfer
