#include "common/platform.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <thread>
#include <utility>

#ifdef _WIN32
#include <windows.h>
#include <shellapi.h>
#include <fcntl.h>
#include <io.h>
#include <cwchar>
#endif

namespace qinfer {

#ifdef _WIN32
namespace {

std::string narrow(const wchar_t* w, size_t len) {
    if (len == 0) return {};
    int n = WideCharToMultiByte(CP_UTF8, 0, w, int(len), nullptr, 0, nullptr, nullptr);
    std::string s(size_t(n > 0 ? n : 0), '\0');
    if (n > 0) WideCharToMultiByte(CP_UTF8, 0, w, int(len), s.data(), n, nullptr, nullptr);
    return s;
}

std::wstring widen(const std::string& s) {
    if (s.empty()) return {};
    int n = MultiByteToWideChar(CP_UTF8, 0, s.data(), int(s.size()), nullptr, 0);
    std::wstring w(size_t(n > 0 ? n : 0), L'\0');
    if (n > 0) MultiByteToWideChar(CP_UTF8, 0, s.data(), int(s.size()), w.data(), n);
    return w;
}

}  // namespace
#endif

#ifdef _WIN32
namespace {
UINT g_saved_output_cp = 0, g_saved_input_cp = 0;
// The code pages belong to the console, not to qinfer: give the shell back its own.
void restore_console() {
    if (g_saved_output_cp) SetConsoleOutputCP(g_saved_output_cp);
    if (g_saved_input_cp) SetConsoleCP(g_saved_input_cp);
}
}  // namespace
#endif

void platform_init_console() {
#ifdef _WIN32
    g_saved_output_cp = GetConsoleOutputCP();  // 0 without a console
    g_saved_input_cp = GetConsoleCP();
    if (g_saved_output_cp || g_saved_input_cp) std::atexit(restore_console);
    SetConsoleOutputCP(CP_UTF8);
    SetConsoleCP(CP_UTF8);
    // Piped or redirected input is read as bytes, as on POSIX: text mode would
    // turn CRLF into LF and stop at a Ctrl+Z byte, changing the prompt.
    if (!_isatty(_fileno(stdin))) _setmode(_fileno(stdin), _O_BINARY);
#endif
}

std::vector<char*> platform_utf8_args(int argc, char** argv) {
#ifdef _WIN32
    // The wide command line is what the caller typed. Its own split is used even
    // where it differs from the C runtime's in odd quoting cases: falling back
    // to the ANSI argv would silently turn Chinese text into '?'.
    static std::vector<std::string> storage;
    int wargc = 0;
    LPWSTR* wargv = CommandLineToArgvW(GetCommandLineW(), &wargc);
    if (wargv && wargc > 0) {
        storage.clear();
        for (int i = 0; i < wargc; ++i) storage.push_back(narrow(wargv[i], std::wcslen(wargv[i])));
        LocalFree(wargv);
        std::vector<char*> out;
        for (auto& s : storage) out.push_back(s.data());
        out.push_back(nullptr);
        return out;
    }
#endif
    std::vector<char*> out(argv, argv + argc);
    out.push_back(nullptr);
    return out;
}

int physical_cores() {
#if defined(__linux__)
    // Count distinct (physical id, core id) pairs.
    std::ifstream in("/proc/cpuinfo");
    std::set<std::pair<int, int>> cores;
    std::string line;
    int phys = 0;
    while (std::getline(in, line)) {
        if (line.rfind("physical id", 0) == 0) phys = std::stoi(line.substr(line.find(':') + 1));
        else if (line.rfind("core id", 0) == 0) cores.insert({phys, std::stoi(line.substr(line.find(':') + 1))});
    }
    if (!cores.empty()) return int(cores.size());
#elif defined(_WIN32)
    // One RelationProcessorCore record per physical core.
    DWORD len = 0;
    GetLogicalProcessorInformationEx(RelationProcessorCore, nullptr, &len);
    if (len > 0) {
        std::vector<char> buf(len);
        auto* info = reinterpret_cast<SYSTEM_LOGICAL_PROCESSOR_INFORMATION_EX*>(buf.data());
        if (GetLogicalProcessorInformationEx(RelationProcessorCore, info, &len)) {
            int cores = 0;
            for (DWORD off = 0; off < len;) {
                auto* rec = reinterpret_cast<SYSTEM_LOGICAL_PROCESSOR_INFORMATION_EX*>(buf.data() + off);
                if (rec->Relationship == RelationProcessorCore) ++cores;
                if (rec->Size == 0) break;
                off += rec->Size;
            }
            if (cores > 0) return cores;
        }
    }
#endif
    unsigned n = std::thread::hardware_concurrency();
    return n ? int(n) : 1;
}

std::filesystem::path utf8_path(const std::string& utf8) {
    return std::filesystem::path(std::u8string(utf8.begin(), utf8.end()));
}

std::string path_utf8(const std::filesystem::path& p) {
    const std::u8string s = p.u8string();
    return std::string(s.begin(), s.end());
}

FILE* utf8_fopen(const std::string& path, const char* mode) {
#ifdef _WIN32
    return _wfopen(widen(path).c_str(), widen(mode).c_str());
#else
    return std::fopen(path.c_str(), mode);
#endif
}

bool read_stdin_line(std::string& line) {
    line.clear();
#ifdef _WIN32
    HANDLE in = GetStdHandle(STD_INPUT_HANDLE);
    DWORD mode = 0;
    if (in != INVALID_HANDLE_VALUE && GetConsoleMode(in, &mode)) {
        std::wstring w;
        for (;;) {
            wchar_t c;
            DWORD got = 0;
            if (!ReadConsoleW(in, &c, 1, &got, nullptr) || got == 0) {
                if (w.empty()) return false;
                break;
            }
            if (c == L'\n') break;
            if (c == 0x1A && w.empty()) return false;  // Ctrl+Z: end of input
            w += c;
        }
        if (!w.empty() && w.back() == L'\r') w.pop_back();
        line = narrow(w.data(), w.size());
        return true;
    }
#endif
    if (!std::getline(std::cin, line)) return false;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return true;
}

}  // namespace qinfer
