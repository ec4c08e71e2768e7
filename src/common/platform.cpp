#include "common/platform.h"

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

#ifdef _WIN32
#include <windows.h>
#include <shellapi.h>
#endif

namespace qinfer {

void platform_init_console() {
#ifdef _WIN32
    SetConsoleOutputCP(CP_UTF8);
    SetConsoleCP(CP_UTF8);
#endif
}

std::vector<char*> platform_utf8_args(int argc, char** argv) {
#ifdef _WIN32
    static std::vector<std::string> storage;
    int wargc = 0;
    LPWSTR* wargv = CommandLineToArgvW(GetCommandLineW(), &wargc);
    if (wargv && wargc == argc) {
        storage.clear();
        for (int i = 0; i < wargc; ++i) {
            int n = WideCharToMultiByte(CP_UTF8, 0, wargv[i], -1, nullptr, 0, nullptr, nullptr);
            std::string s(size_t(n > 0 ? n - 1 : 0), '\0');
            WideCharToMultiByte(CP_UTF8, 0, wargv[i], -1, s.data(), n, nullptr, nullptr);
            storage.push_back(std::move(s));
        }
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
#endif
    unsigned n = std::thread::hardware_concurrency();
    return n ? int(n) : 1;
}

}  // namespace qinfer
