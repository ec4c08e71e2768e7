// `qinfer serve -m MODEL [-np N] [--port P]`: the OpenAI-compatible HTTP
// server (src/server). Listens on 127.0.0.1 unless --host says otherwise;
// SIGINT/SIGTERM shut it down gracefully.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/run_options.h"
#include "common/error.h"
#include "server/loadgen.h"
#include "server/server.h"

namespace qinfer::cli {

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_signal(int sig) { g_signal = sig; }
// `qinfer serve loadgen --port P --clients 1,8,32,64`: load against a running server.
int cmd_loadgen(int argc, char** argv) {
    CLI::App app{"Load generator for a running qinfer server", "qinfer serve loadgen"};
    server::LoadOptions lo;
    std::string clients = "1,8,32,64";
    std::string prompt_file;
    app.add_option("--host", lo.host, "server address");
    app.add_option("--port", lo.port, "server port")->check(CLI::Range(1, 65535));
    app.add_option("--api-key", lo.api_key, "API key of the server");
    app.add_option("--clients", clients, "concurrent clients, one run per comma-separated value");
    app.add_option("--duration", lo.duration_s, "seconds per run")->check(CLI::Range(0.1, 3600.0));
    app.add_option("--max-tokens", lo.max_tokens, "tokens generated per request")->check(CLI::Range(1, 1 << 20));
    app.add_option("--prompt-file", prompt_file, "prompts, one per line (default: short built-in chat prompts)");
    int history = 0, turns = 3;
    app.add_option("--multiturn", history,
                   "instead: one conversation with a history of about N tokens; prints each turn's TTFT and cached tokens");
    app.add_option("--turns", turns, "--multiturn: turns")->check(CLI::Range(2, 100));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    if (!prompt_file.empty()) {
        const std::string text = read_file_text(prompt_file);
        size_t at = 0;
        while (at < text.size()) {
            size_t nl = text.find('\n', at);
            if (nl == std::string::npos) nl = text.size();
            if (nl > at) lo.prompts.push_back(process_escapes(text.substr(at, nl - at)));
            at = nl + 1;
        }
        if (lo.prompts.empty()) fail(prompt_file + ": no prompts in the file");
    }
    if (history > 0) {
        const std::vector<server::TurnResult> tr = server::run_multiturn(lo, history, turns);
        for (size_t i = 0; i < tr.size(); i++)
            std::printf("turn %zu: prompt %d tokens, cached %d, processed %d, TTFT %.1f ms\n", i + 1, tr[i].prompt_tokens,
                        tr[i].cached_tokens, tr[i].prompt_tokens - tr[i].cached_tokens, tr[i].ttft_ms);
        return 0;
    }
    int bad = 0;
    for (int32_t n : parse_id_list(clients)) {
        if (n < 1 || n > 4096) fail(strfmt("--clients: %d is not between 1 and 4096", n));
        lo.clients = n;
        const server::LoadResult r = server::run_load(lo);
        std::printf("%s\n", r.summary().c_str());
        for (const std::string& e : r.errors) std::printf("  error: %s\n", e.c_str());
        std::fflush(stdout);
        bad += int(r.requests_failed + r.mismatches);
    }
    return bad == 0 ? 0 : 1;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "loadgen") return cmd_loadgen(argc - 1, argv + 1);
    CLI::App app{"OpenAI-compatible HTTP server", "qinfer serve"};
    ModelFlags mf;
    server::ServerOptions so;
    int n_parallel = 1;
    int cache_mib = 4096;
    int body_mib = 8;
    int grace_s = 10;
    std::string api_key_file;
    mf.add(app);
    app.add_option("--host", so.host, "address to listen on (default 127.0.0.1: this machine only)");
    app.add_option("--port", so.port, "TCP port (0 = any free port, printed at start)")->check(CLI::Range(0, 65535));
    app.add_option("--parallel", n_parallel, "sequences processed in parallel (-np; continuous batching)")
        ->check(CLI::Range(1, 1024));
    app.add_option("--queue-size", so.queue_size, "requests that may wait for a free sequence; more get 503")
        ->check(CLI::Range(0, 100000));
    app.add_option("--api-key", so.api_key, "require 'Authorization: Bearer KEY' on every endpoint but /health");
    app.add_option("--api-key-file", api_key_file, "read the API key from a file (first line)");
    app.add_option("--alias", so.model_alias, "model name in /v1/models and responses");
    app.add_option("--cache-ram", cache_mib, "prompt-cache budget in MiB of host memory (0 = no prompt cache)")
        ->check(CLI::Range(0, 1 << 20));
    app.add_option("--checkpoint-every", so.checkpoint_interval,
                   "also checkpoint long prompts every N tokens (recurrent-state models; 0 = off)")
        ->check(CLI::Range(0, 1 << 30));
    app.add_option("--max-body", body_mib, "largest request body in MiB")->check(CLI::Range(1, 1024));
    app.add_option("--http-threads", so.http_threads, "HTTP worker threads (0 = -np + --queue-size + 8)");
    app.add_option("--shutdown-grace", grace_s, "seconds in-flight requests may run after SIGINT/SIGTERM")
        ->check(CLI::Range(0, 3600));

    if (const int rc = parse_llama_style(app, argc, argv); rc >= 0) return rc;
    if (!api_key_file.empty()) {
        std::string k = read_file_text(api_key_file);
        k = k.substr(0, k.find_first_of("\r\n"));
        if (k.empty()) fail(api_key_file + ": the API key file is empty");
        so.api_key = k;
    }
    so.model_path = mf.model;
    so.engine = mf.engine_options();
    so.engine.n_slots = n_parallel;
    so.cache_bytes = uint64_t(cache_mib) << 20;
    so.max_body_bytes = size_t(body_mib) << 20;
    so.shutdown_grace = std::chrono::seconds(grace_s);

#ifndef _WIN32
    std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not a dead server
#endif
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);

    if (so.api_key.empty() && so.host != "127.0.0.1" && so.host != "localhost" && so.host != "::1")
        std::fprintf(stderr, "qinfer serve: warning: listening on %s without --api-key; anyone who can reach it can use it\n",
                     so.host.c_str());
    server::Server server(so);
    const int port = server.listen();
    std::fprintf(stderr, "qinfer serve: listening on http://%s:%d (loading %s)\n", so.host.c_str(), port,
                 so.model_path.c_str());
    try {
        server.load();
    } catch (...) {
        server.stop();
        throw;
    }
    std::fprintf(stderr, "qinfer serve: ready (%d parallel sequences, %d tokens of context each)\n", n_parallel,
                 server.n_ctx());
    std::fflush(stderr);
    while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::fprintf(stderr, "qinfer serve: signal %d, finishing in-flight requests (up to %d s)\n", int(g_signal), grace_s);
    server.stop();
    std::fprintf(stderr, "qinfer serve: stopped\n");
    return 0;
}

}  // namespace qinfer::cli
