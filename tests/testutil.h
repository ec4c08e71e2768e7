// Helpers shared by the tests: where the reference data is, reading golden files,
// running the qinfer binary.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace qinfer::test {

std::string reference_dir();                       // ../shared/reference (absolute)
std::string reference_path(const std::string& name);
std::string source_dir();
std::string qinfer_binary();
bool reference_available();                        // false -> tests GTEST_SKIP with a message

std::string read_text(const std::string& path);
std::vector<uint8_t> read_bytes(const std::string& path);
std::vector<float> read_f32(const std::string& path);

// Runs a shell command, returns exit code; stdout (and stderr if merge) into *out.
int run_command(const std::string& cmd, std::string* out, bool merge_stderr = false);

// A fresh temporary directory, removed at process exit.
std::string temp_dir();

// Indices of row[0, n) from the largest value down, the lower index first
// among equals (-0 equals +0), NaN last: the order of Backend::top_k and the
// sampler's candidates, computed the plain way.
std::vector<int32_t> logit_order(const float* row, int64_t n);

// Environment switches for backend A/B tests (POSIX setenv / Windows _putenv_s).
void set_env(const char* name, const char* value);
void unset_env(const char* name);

}  // namespace qinfer::test

// In a test body: skips the test when the reference file `path` is absent
// (../shared/reference is not part of the repository).
#define QINFER_SKIP_WITHOUT_REFERENCE_FILE(path)                                                  \
    do {                                                                                           \
        if (!std::filesystem::exists(path)) GTEST_SKIP() << "reference model missing: " << (path); \
    } while (0)
