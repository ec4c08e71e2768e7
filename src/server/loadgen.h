// A small load generator for `qinfer serve`: N concurrent clients, each
// sending streaming /v1/completions requests back to back for a while, and
// the numbers that matter for serving: aggregate generated tokens/s and the
// time-to-first-token distribution. Also checks every reply (well-formed
// events, [DONE], finish reason, and -- with greedy sampling -- the same
// tokens for the same prompt), so a load test can assert nothing was lost or
// corrupted. `qinfer serve loadgen` runs it from the command line.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qinfer::server {

struct LoadOptions {
    std::string host = "127.0.0.1";
    int port = 8080;
    std::string api_key;
    int clients = 8;
    double duration_s = 10;         // clients start no new request after this (each sends at least one)
    int max_tokens = 64;            // per request (ignore_eos: exactly this many)
    std::vector<std::string> prompts;  // cycled through; default: a few short chat prompts
    double timeout_s = 120;         // per request
};

struct LoadResult {
    int clients = 0;
    int64_t requests_ok = 0, requests_failed = 0;
    // Requests whose prompt was already answered in this run, and those of them
    // whose tokens differ from the first answer.
    int64_t repeats = 0, mismatches = 0;
    int64_t tokens = 0;             // generated tokens of successful requests
    double wall_s = 0;
    double tokens_per_s = 0;        // aggregate
    double ttft_p50_ms = 0, ttft_p99_ms = 0, ttft_max_ms = 0;
    // Median over requests of (tokens - 1) / (last token - first token): the
    // decode rate one client sees, comparable with `qinfer bench` tg.
    double stream_decode_p50 = 0;
    std::vector<std::string> errors;  // the first few failures, one line each
    std::map<std::string, std::vector<int32_t>> outputs;  // prompt -> tokens (first seen)

    std::string summary() const;  // one line
};

LoadResult run_load(const LoadOptions& opt);

// A conversation with a long history: turn 1 sends about `history_tokens`
// tokens of text, each later turn adds the reply and a short question. What
// the prompt cache saves shows in turn 2's TTFT and processed-token count.
struct TurnResult {
    int prompt_tokens = 0;
    int cached_tokens = 0;
    double ttft_ms = 0;
    std::string error;  // a server error event (run_multiturn throws it)
};
std::vector<TurnResult> run_multiturn(const LoadOptions& opt, int history_tokens, int turns);

}  // namespace qinfer::server
