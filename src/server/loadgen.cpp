#include "server/loadgen.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"

namespace qinfer::server {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// Splits a server-sent-event stream into its events ("\n\n"-terminated) as
// bytes arrive; on_event returns false to stop reading.
struct SseEvents {
    std::string buf;  // bytes of the unfinished event (the whole body if it was no stream)
    template <class F> bool feed(const char* d, size_t n, F&& on_event) {
        buf.append(d, n);
        size_t at;
        while ((at = buf.find("\n\n")) != std::string::npos) {
            const std::string ev = buf.substr(0, at);
            buf.erase(0, at + 2);
            if (!on_event(ev)) return false;
        }
        return true;
    }
};

struct One {
    bool ok = false;
    std::string error;
    double ttft_ms = 0;
    double last_token_ms = 0;  // arrival of the last token's chunk
    int token_chunks = 0;
    std::vector<int32_t> tokens;
};

One request(const LoadOptions& opt, const std::string& prompt) {
    One out;
    httplib::Client cli(opt.host, opt.port);
    const auto secs = time_t(opt.timeout_s);
    cli.set_read_timeout(secs, 0);
    cli.set_connection_timeout(10, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", prompt},     {"max_tokens", opt.max_tokens}, {"temperature", 0},
                    {"ignore_eos", true},   {"stream", true},               {"return_tokens", true}}
                   .dump();
    req.set_header("Content-Type", "application/json");
    if (!opt.api_key.empty()) req.set_header("Authorization", "Bearer " + opt.api_key);
    const auto t0 = Clock::now();
    SseEvents sse;
    bool first = true, done = false, finished = false;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
        return sse.feed(d, n, [&](const std::string& ev) {
            if (ev.rfind("data: ", 0) != 0) {
                out.error = "malformed event: " + ev.substr(0, 80);
                return false;
            }
            const std::string data = ev.substr(6);
            if (data == "[DONE]") {
                done = true;
                return true;
            }
            json j = json::parse(data, nullptr, false);
            if (j.is_discarded() || !j.contains("choices")) {
                out.error = "bad chunk: " + data.substr(0, 120);
                return false;
            }
            const double now_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
            if (first) {
                out.ttft_ms = now_ms;
                first = false;
            }
            const json& c = j["choices"][0];
            if (c.contains("token")) {
                out.token_chunks++;
                out.last_token_ms = now_ms;
            }
            if (!c["finish_reason"].is_null()) {
                finished = true;
                if (c.contains("tokens")) out.tokens = c["tokens"].get<std::vector<int32_t>>();
            }
            return true;
        });
    };
    httplib::Result r = cli.send(req);
    if (!r) {
        if (out.error.empty())
            out.error = strfmt("connection failed after %.0f ms: %s",
                               std::chrono::duration<double, std::milli>(Clock::now() - t0).count(),
                               httplib::to_string(r.error()).c_str());
        return out;
    }
    if (r->status != 200) {
        out.error = strfmt("HTTP %d: %s", r->status, sse.buf.substr(0, 160).c_str());
        return out;
    }
    if (!out.error.empty()) return out;
    if (!done || !finished) {
        out.error = "stream ended without a finish reason and [DONE]";
        return out;
    }
    out.ok = true;
    return out;
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
    return v[i];
}

}  // namespace

std::string LoadResult::summary() const {
    return strfmt("clients %3d | requests %6lld ok, %lld failed, %lld of %lld repeated prompts mismatched | %8lld tokens in %.1f s = %9.1f tok/s | "
                  "TTFT p50 %.1f ms, p99 %.1f ms, max %.1f ms | per stream after the first token %.1f tok/s (p50)",
                  clients, (long long)requests_ok, (long long)requests_failed, (long long)mismatches, (long long)repeats,
                  (long long)tokens,
                  wall_s, tokens_per_s, ttft_p50_ms, ttft_p99_ms, ttft_max_ms, stream_decode_p50);
}

LoadResult run_load(const LoadOptions& opt_in) {
    LoadOptions opt = opt_in;
    if (opt.prompts.empty())
        for (int i = 0; i < 8; i++)
            opt.prompts.push_back(strfmt("<|im_start|>user\nWrite a short poem about the number %d.<|im_end|>\n"
                                         "<|im_start|>assistant\n",
                                         i * 37 + 5));
    LoadResult res;
    res.clients = opt.clients;
    std::mutex mu;
    std::vector<double> ttfts, decode_rates;
    const auto t0 = Clock::now();
    const auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.duration_s));
    std::atomic<int64_t> next{0};
    std::vector<std::thread> th;
    for (int c = 0; c < opt.clients; c++) {
        th.emplace_back([&] {
            do {  // every client sends at least one request
                const std::string& prompt = opt.prompts[size_t(next++ % int64_t(opt.prompts.size()))];
                One o = request(opt, prompt);
                std::lock_guard<std::mutex> lock(mu);
                if (!o.ok) {
                    res.requests_failed++;
                    if (res.errors.size() < 5) res.errors.push_back(o.error);
                    continue;  // to the loop condition
                }
                res.requests_ok++;
                res.tokens += int64_t(o.tokens.size());
                ttfts.push_back(o.ttft_ms);
                if (o.token_chunks > 1 && o.last_token_ms > o.ttft_ms)
                    decode_rates.push_back(1000.0 * (o.token_chunks - 1) / (o.last_token_ms - o.ttft_ms));
                auto it = res.outputs.find(prompt);
                if (it == res.outputs.end())
                    res.outputs.emplace(prompt, o.tokens);
                else {
                    res.repeats++;
                    if (it->second != o.tokens) res.mismatches++;
                }
            } while (Clock::now() < end);
        });
    }
    for (auto& t : th) t.join();
    res.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    res.tokens_per_s = res.wall_s > 0 ? double(res.tokens) / res.wall_s : 0;
    res.ttft_p50_ms = percentile(ttfts, 0.50);
    res.ttft_p99_ms = percentile(ttfts, 0.99);
    res.ttft_max_ms = ttfts.empty() ? 0 : *std::max_element(ttfts.begin(), ttfts.end());
    res.stream_decode_p50 = percentile(decode_rates, 0.50);
    return res;
}

namespace {

json post_json(const LoadOptions& opt, const std::string& path, const json& body) {
    httplib::Client cli(opt.host, opt.port);
    cli.set_read_timeout(time_t(opt.timeout_s), 0);
    httplib::Headers h;
    if (!opt.api_key.empty()) h.emplace("Authorization", "Bearer " + opt.api_key);
    httplib::Result r = cli.Post(path.c_str(), h, body.dump(), "application/json");
    if (!r) fail("request to " + path + " failed: " + httplib::to_string(r.error()));
    if (r->status != 200) fail(strfmt("%s: HTTP %d: %s", path.c_str(), r->status, r->body.substr(0, 200).c_str()));
    return json::parse(r->body);
}

}  // namespace

std::vector<TurnResult> run_multiturn(const LoadOptions& opt, int history_tokens, int turns) {
    // Filler text: a fixed pseudo-random word sequence, sized with /tokenize.
    static const char* kWords[] = {"alpha", "river", "stone",  "quiet",  "market", "seven",  "cloud",  "paper",
                                   "orange", "window", "number", "garden", "silver", "travel", "yellow", "winter"};
    std::string chunk;
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 1000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        chunk += std::string(kWords[x % 16]) + (i % 20 == 19 ? "\n" : " ");
    }
    const size_t per_chunk = post_json(opt, "/tokenize", {{"content", chunk}})["tokens"].size();
    std::string text;
    for (size_t n = 0; n < size_t(std::max(history_tokens, 1)); n += std::max<size_t>(per_chunk, 1)) text += chunk;

    json messages = json::array({{{"role", "system"}, {"content", "You summarise."}},
                                 {{"role", "user"}, {"content", text + "\nSummarise the above."}}});
    std::vector<TurnResult> out;
    for (int t = 0; t < turns; t++) {
        httplib::Client cli(opt.host, opt.port);
        cli.set_read_timeout(time_t(opt.timeout_s), 0);
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/chat/completions";
        req.body = json{{"messages", messages},
                        {"max_tokens", 16},
                        {"temperature", 0},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}}}
                       .dump();
        req.set_header("Content-Type", "application/json");
        if (!opt.api_key.empty()) req.set_header("Authorization", "Bearer " + opt.api_key);
        TurnResult tr;
        SseEvents sse;
        std::string content;
        bool first = true;
        const auto t0 = Clock::now();
        req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
            return sse.feed(d, n, [&](const std::string& ev) {
                if (ev.rfind("data: {", 0) != 0) return true;
                json j = json::parse(ev.substr(6), nullptr, false);
                if (j.is_discarded()) return true;
                if (j.contains("error")) {  // an error after the 200 header arrives as an event
                    tr.error = j["error"].value("message", j["error"].dump());
                    return false;
                }
                if (j.contains("usage") && j["usage"].is_object()) {
                    tr.prompt_tokens = j["usage"]["prompt_tokens"];
                    tr.cached_tokens = j["usage"]["prompt_tokens_details"]["cached_tokens"];
                }
                for (const json& c : j["choices"]) {
                    const json& dl = c["delta"];
                    const bool token = dl.contains("content") && dl["content"].is_string() && !dl["content"].get<std::string>().empty();
                    const bool reasoning = dl.contains("reasoning_content");
                    if (first && (token || reasoning || !c["finish_reason"].is_null())) {
                        tr.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
                        first = false;
                    }
                    if (token) content += dl["content"].get<std::string>();
                }
                return true;
            });
        };
        httplib::Result r = cli.send(req);
        if (!tr.error.empty()) fail(strfmt("turn %d failed: %s", t + 1, tr.error.c_str()));
        if (!r || r->status != 200) fail(strfmt("turn %d failed: %s", t + 1, r ? strfmt("HTTP %d", r->status).c_str() : httplib::to_string(r.error()).c_str()));
        if (tr.prompt_tokens == 0) fail(strfmt("turn %d: the reply carried no usage counts", t + 1));
        out.push_back(tr);
        messages.push_back({{"role", "assistant"}, {"content", content}});
        messages.push_back({{"role", "user"}, {"content", strfmt("And now point %d?", t + 1)}});
    }
    return out;
}

}  // namespace qinfer::server
