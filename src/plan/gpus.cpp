#include "plan/gpus.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "common/error.h"

namespace qinfer {

namespace {
constexpr uint64_t MiB = uint64_t(1) << 20;
constexpr uint64_t GiB = uint64_t(1) << 30;

std::string lower(std::string_view s) {
    std::string r(s);
    for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
    return r;
}
}  // namespace

const std::vector<GpuPreset>& gpu_presets() {
    // Nominal memory of the card. What is allocatable is a little less (the
    // driver keeps some; an H200 shows 143771 MiB in nvidia-smi, 143155 MiB in
    // cudaMemGetInfo): the safety margin covers the difference.
    static const std::vector<GpuPreset> presets = {
        {"rtx3060-laptop", "GeForce RTX 3060 Laptop GPU (6 GB)", 6 * GiB},
        {"rtx4060-laptop", "GeForce RTX 4060 Laptop GPU (8 GB)", 8 * GiB},
        {"rtx4070-laptop", "GeForce RTX 4070 Laptop GPU (8 GB)", 8 * GiB},
        {"rtx4080-laptop", "GeForce RTX 4080 Laptop GPU (12 GB)", 12 * GiB},
        {"rtx4090-laptop", "GeForce RTX 4090 Laptop GPU (16 GB)", 16 * GiB},
        {"rtx3060", "GeForce RTX 3060 (12 GB)", 12 * GiB},
        {"rtx3070", "GeForce RTX 3070 (8 GB)", 8 * GiB},
        {"rtx3080", "GeForce RTX 3080 (10 GB)", 10 * GiB},
        {"rtx3090", "GeForce RTX 3090 (24 GB)", 24 * GiB},
        {"rtx4060", "GeForce RTX 4060 (8 GB)", 8 * GiB},
        {"rtx4060ti-16g", "GeForce RTX 4060 Ti (16 GB)", 16 * GiB},
        {"rtx4070", "GeForce RTX 4070 (12 GB)", 12 * GiB},
        {"rtx4080", "GeForce RTX 4080 (16 GB)", 16 * GiB},
        {"rtx4090", "GeForce RTX 4090 (24 GB)", 24 * GiB},
        {"rtx5090", "GeForce RTX 5090 (32 GB)", 32 * GiB},
        {"a100-40g", "A100 40 GB", 40 * GiB},
        {"a100-80g", "A100 80 GB", 80 * GiB},
        {"h100", "H100 80 GB", 80 * GiB},
        {"h200", "H200 141 GB (143771 MiB in nvidia-smi)", 143771 * MiB},
    };
    return presets;
}

std::optional<uint64_t> gpu_preset_bytes(std::string_view name) {
    const std::string n = lower(name);
    for (const GpuPreset& p : gpu_presets())
        if (n == p.name) return p.bytes;
    return std::nullopt;
}

uint64_t parse_bytes(std::string_view s, const char* what) {
    auto bad = [&]() -> uint64_t {
        fail(strfmt("%s: '%.*s' is not a byte size (examples: 8GiB, 7.5G, 8000MB, 8589934592)", what,
                    int(s.size()), s.data()));
    };
    size_t i = 0;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    if (i == 0) return bad();
    const std::string num(s.substr(0, i));
    if (num.find('.') != num.rfind('.') || num == ".") return bad();
    std::string unit = lower(s.substr(i));
    while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());

    double mult = 0;
    if (unit.empty() || unit == "b") mult = 1;
    const char* prefixes = "kmgt";
    for (int p = 0; p < 4 && mult == 0; ++p) {
        const char c = prefixes[p];
        const double bin = std::pow(1024.0, p + 1), dec = std::pow(1000.0, p + 1);
        if (unit == std::string(1, c) || unit == std::string(1, c) + "ib") mult = bin;
        else if (unit == std::string(1, c) + "b") mult = dec;
    }
    if (mult == 0) return bad();
    if (mult == 1 && num.find('.') != std::string::npos) return bad();  // fractional bytes
    const double v = std::strtod(num.c_str(), nullptr) * mult;
    if (!(v >= 0) || v >= 9.0e18) return bad();
    return uint64_t(v + 0.5);
}

std::string format_bytes(uint64_t b) {
    if (b < 1024) return strfmt("%llu B", (unsigned long long)b);
    const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
    double v = double(b);
    int u = -1;
    while (v >= 1024 && u < 3) {
        v /= 1024;
        ++u;
    }
    return strfmt("%.2f %s", v, units[u]);
}

}  // namespace qinfer
