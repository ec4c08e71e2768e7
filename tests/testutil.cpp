#include "testutil.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sys/wait.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace qinfer::test {

std::string reference_dir() {
    if (const char* env = std::getenv("QINFER_REFERENCE_DIR")) return env;
    return QINFER_REFERENCE_DIR;
}
std::string reference_path(const std::string& name) { return reference_dir() + "/" + name; }
std::string source_dir() { return QINFER_SOURCE_DIR; }
std::string qinfer_binary() { return QINFER_BINARY; }
bool reference_available() { return fs::exists(reference_path("MANIFEST.md")); }

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::string s = read_text(path);
    return std::vector<uint8_t>(s.begin(), s.end());
}

std::vector<float> read_f32(const std::string& path) {
    std::string s = read_text(path);
    std::vector<float> v(s.size() / 4);
    std::memcpy(v.data(), s.data(), v.size() * 4);
    return v;
}

int run_command(const std::string& cmd, std::string* out, bool merge_stderr) {
    std::string full = cmd + (merge_stderr ? " 2>&1" : "");
    FILE* p = popen(full.c_str(), "r");
    if (!p) return -1;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0)
        if (out) out->append(buf, n);
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string temp_dir() {
    static std::string dir;
    static std::once_flag once;
    std::call_once(once, [] {
        std::string tmpl = (fs::temp_directory_path() / "qinfer-test-XXXXXX").string();
        if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        dir = tmpl;
        std::atexit([] { std::error_code ec; fs::remove_all(dir, ec); });
    });
    return dir;
}

void set_env(const char* name, const char* value) {
#ifdef _WIN32
    _putenv_s(name, value);
#else
    setenv(name, value, 1);
#endif
}

void unset_env(const char* name) {
#ifdef _WIN32
    _putenv_s(name, "");
#else
    unsetenv(name);
#endif
}

std::vector<int32_t> logit_order(const float* row, int64_t n) {
    std::vector<int32_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[size_t(i)] = int32_t(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        const float x = row[a], y = row[b];
        if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
        return x > y;
    });
    return order;
}

}  // namespace qinfer::test
