// Server counters for GET /metrics (Prometheus text format 0.0.4).
//
// Updated from the HTTP threads and the scheduler thread at once, so every
// field is atomic or behind the histogram's own mutex; rendering reads a
// consistent-enough snapshot (counters may be a step apart, which Prometheus
// tolerates).
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace qinfer::server {

class Histogram {
public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double v);
    // "<name>_bucket{le=...} n" lines, _sum and _count.
    std::string render(const std::string& name, const std::string& help) const;
    uint64_t count() const;

private:
    mutable std::mutex mu_;
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
    double sum_ = 0;
    uint64_t n_ = 0;
};

struct Metrics {
    Metrics();

    // Requests by outcome.
    std::atomic<uint64_t> requests_ok{0}, requests_client_error{0}, requests_rejected{0},
        requests_cancelled{0}, requests_server_error{0};
    // Tokens.
    std::atomic<uint64_t> prompt_tokens{0};            // as submitted
    std::atomic<uint64_t> prompt_tokens_cached{0};     // reused from the prompt cache / slot
    std::atomic<uint64_t> prompt_tokens_processed{0};  // actually run through the model
    std::atomic<uint64_t> generated_tokens{0};
    std::atomic<uint64_t> forward_steps{0};
    std::atomic<uint64_t> batch_tokens{0};  // tokens over all forward passes (/ steps = mean batch)
    std::atomic<uint64_t> offloaded_steps{0};  // forward passes that ran host-memory layers on the GPU
    std::atomic<uint64_t> argmax_steps{0};     // forward passes whose tokens the backend picked (greedy)
    std::atomic<uint64_t> candidate_steps{0};  // forward passes that sent back each row's best few logits
    // Where the scheduler thread's time goes, in microseconds: model forward
    // passes, sampling + streaming the sampled tokens, prompt-cache snapshots
    // (save and restore).
    std::atomic<uint64_t> forward_us{0}, sample_us{0}, snapshot_us{0};
    // Gauges (set by the scheduler).
    std::atomic<int64_t> queue_depth{0}, active_sequences{0}, n_slots{0};
    std::atomic<uint64_t> state_bytes_allocated{0}, state_bytes_in_use{0};
    std::atomic<uint64_t> cache_bytes{0}, cache_entries{0}, cache_hits{0}, cache_misses{0};

    Histogram ttft_seconds;       // request received -> first token sampled
    Histogram token_seconds;      // time between consecutive tokens of one sequence
    Histogram queue_seconds;      // time spent waiting for a slot

    std::string render() const;
};

}  // namespace qinfer::server
