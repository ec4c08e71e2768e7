#include "runtime/cpu/cpu_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace qinfer {

std::unique_ptr<OpProfile> OpProfile::from_env() {
    const char* v = std::getenv("QINFER_CPU_PROFILE");
    if (!v || !*v || std::string(v) == "0") return nullptr;
    return std::make_unique<OpProfile>();
}

OpProfile::~OpProfile() {
    if (ops_.empty()) return;
    std::vector<std::pair<std::string, Entry>> rows(ops_.begin(), ops_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
    int64_t total = 0;
    for (const auto& r : rows) total += r.second.ns;
    std::fprintf(stderr, "CPU op profile (wall time; %.1f ms in all)\n%-34s %8s %10s %9s %6s %8s\n", total * 1e-6, "op",
                 "calls", "ms", "us/call", "%", "GB/s");
    for (const auto& [op, e] : rows)
        std::fprintf(stderr, "%-34s %8lld %10.2f %9.2f %5.1f%% %8.1f\n", op.c_str(), (long long)e.calls, e.ns * 1e-6,
                     e.ns * 1e-3 / double(e.calls), 100.0 * double(e.ns) / double(std::max<int64_t>(total, 1)),
                     e.ns > 0 ? e.bytes / double(e.ns) : 0.0);
}

}  // namespace qinfer
