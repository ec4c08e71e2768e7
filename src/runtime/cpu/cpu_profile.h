// Wall time per op kind on the CPU backend, for finding where a decode step
// goes (QINFER_CPU_PROFILE=1; printed to stderr when the backend is destroyed).
// CPU ops run when they are issued, so the time between an op's start and end
// is its cost; held-back matmul groups are timed when they run.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace qinfer {

class OpProfile {
public:
    // A profile when QINFER_CPU_PROFILE is set to something other than 0, else null.
    static std::unique_ptr<OpProfile> from_env();
    ~OpProfile();  // prints the table

    void add(const std::string& op, int64_t ns, double bytes) {
        Entry& e = ops_[op];
        e.calls += 1;
        e.ns += ns;
        e.bytes += bytes;
    }

private:
    struct Entry {
        int64_t calls = 0, ns = 0;
        double bytes = 0;
    };
    std::map<std::string, Entry> ops_;
};

// Times one op into `p` (no-op when p is null: every op carries one, so it
// costs a null check). `bytes` are the weight bytes it reads, for a GB/s column.
class OpTimer {
public:
    OpTimer(OpProfile* p, const char* op, double bytes = 0) : p_(p), op_(op), bytes_(bytes) {
        if (p_) t0_ = std::chrono::steady_clock::now();
    }
    ~OpTimer() {
        if (p_)
            p_->add(op_, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
                             .count(),
                    bytes_);
    }
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;

private:
    OpProfile* p_;
    const char* op_;  // outlives the timer (a literal or the caller's string)
    double bytes_;
    std::chrono::steady_clock::time_point t0_;
};

}  // namespace qinfer
