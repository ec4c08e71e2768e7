#include "server/metrics.h"

#include <cinttypes>

#include "common/error.h"

namespace qinfer::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) i++;
    counts_[i]++;
    sum_ += v;
    n_++;
}

uint64_t Histogram::count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); i++) {
        cum += counts_[i];
        s += strfmt("%s_bucket{le=\"%g\"} %" PRIu64 "\n", name.c_str(), bounds_[i], cum);
    }
    cum += counts_.back();
    s += strfmt("%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name.c_str(), cum);
    s += strfmt("%s_sum %.6f\n%s_count %" PRIu64 "\n", name.c_str(), sum_, name.c_str(), n_);
    return s;
}

Metrics::Metrics()
    : ttft_seconds({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      token_seconds({0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1}),
      queue_seconds({0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60}) {}

namespace {
void counter(std::string& s, const char* name, const char* help, uint64_t v) {
    s += strfmt("# HELP %s %s\n# TYPE %s counter\n%s %" PRIu64 "\n", name, help, name, name, v);
}
void gauge(std::string& s, const char* name, const char* help, int64_t v) {
    s += strfmt("# HELP %s %s\n# TYPE %s gauge\n%s %" PRId64 "\n", name, help, name, name, v);
}
void seconds(std::string& s, const char* name, const char* help, uint64_t us) {
    s += strfmt("# HELP %s %s\n# TYPE %s counter\n%s %.6f\n", name, help, name, name, double(us) * 1e-6);
}

}  // namespace

std::string Metrics::render() const {
    std::string s;
    s += "# HELP qinfer_requests_total Completed HTTP requests by outcome.\n# TYPE qinfer_requests_total counter\n";
    s += strfmt("qinfer_requests_total{outcome=\"ok\"} %" PRIu64 "\n", requests_ok.load());
    s += strfmt("qinfer_requests_total{outcome=\"client_error\"} %" PRIu64 "\n", requests_client_error.load());
    s += strfmt("qinfer_requests_total{outcome=\"rejected\"} %" PRIu64 "\n", requests_rejected.load());
    s += strfmt("qinfer_requests_total{outcome=\"cancelled\"} %" PRIu64 "\n", requests_cancelled.load());
    s += strfmt("qinfer_requests_total{outcome=\"server_error\"} %" PRIu64 "\n", requests_server_error.load());
    counter(s, "qinfer_prompt_tokens_total", "Prompt tokens submitted.", prompt_tokens.load());
    counter(s, "qinfer_prompt_tokens_cached_total", "Prompt tokens reused from the prompt cache.",
            prompt_tokens_cached.load());
    counter(s, "qinfer_prompt_tokens_processed_total", "Prompt tokens run through the model.",
            prompt_tokens_processed.load());
    counter(s, "qinfer_generated_tokens_total", "Tokens generated.", generated_tokens.load());
    counter(s, "qinfer_forward_steps_total", "Batched forward passes.", forward_steps.load());
    counter(s, "qinfer_batch_tokens_total", "Tokens over all forward passes.", batch_tokens.load());
    counter(s, "qinfer_offloaded_steps_total", "Forward passes that ran host-memory layers on the GPU (prompt offload).",
            offloaded_steps.load());
    counter(s, "qinfer_argmax_steps_total", "Forward passes whose greedy tokens were picked by the backend.",
            argmax_steps.load());
    counter(s, "qinfer_candidate_steps_total",
            "Forward passes that sent back only each row's best logits (top-k sampling on the backend).",
            candidate_steps.load());
    seconds(s, "qinfer_forward_seconds_total", "Scheduler time in model forward passes.", forward_us.load());
    seconds(s, "qinfer_sample_seconds_total", "Scheduler time sampling and streaming tokens.", sample_us.load());
    seconds(s, "qinfer_snapshot_seconds_total", "Scheduler time saving and restoring prompt-cache checkpoints.",
            snapshot_us.load());
    counter(s, "qinfer_prompt_cache_hits_total", "Requests that reused cached state.", cache_hits.load());
    counter(s, "qinfer_prompt_cache_misses_total", "Requests that started from an empty state.", cache_misses.load());
    gauge(s, "qinfer_queue_depth", "Requests waiting for a slot.", queue_depth.load());
    gauge(s, "qinfer_active_sequences", "Sequences being processed.", active_sequences.load());
    gauge(s, "qinfer_slots", "Parallel sequence slots (-np).", n_slots.load());
    gauge(s, "qinfer_state_bytes_allocated", "KV cache and recurrent state allocated for all slots.",
          int64_t(state_bytes_allocated.load()));
    gauge(s, "qinfer_state_bytes_in_use", "KV rows and recurrent state held by the slots' tokens.",
          int64_t(state_bytes_in_use.load()));
    gauge(s, "qinfer_prompt_cache_bytes", "Host memory of prompt-cache checkpoints.", int64_t(cache_bytes.load()));
    gauge(s, "qinfer_prompt_cache_entries", "Prompt-cache checkpoints.", int64_t(cache_entries.load()));
    s += ttft_seconds.render("qinfer_time_to_first_token_seconds", "Request received to first token.");
    s += token_seconds.render("qinfer_time_per_output_token_seconds", "Time between consecutive generated tokens.");
    s += queue_seconds.render("qinfer_queue_wait_seconds", "Time a request waited for a slot.");
    return s;
}

}  // namespace qinfer::server
