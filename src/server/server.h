// `qinfer serve`: the OpenAI-compatible HTTP server.
//
// HTTP (cpp-httplib) threads parse and validate a request, render and
// tokenize its prompt, and hand a Job to the Scheduler thread, which owns the
// model; they then relay the job's events to the client as one JSON response
// or as server-sent events. Errors are OpenAI-style JSON with a 4xx/5xx
// status; nothing a client sends stops the server.
//
//   Server s(opt);
//   int port = s.start();   // binds, listens, loads the model (/health says "loading" meanwhile)
//   ...
//   s.stop();               // graceful: in-flight requests finish or are cancelled
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "qinfer/engine.h"
#include "server/metrics.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace qinfer::server {

class Scheduler;

struct ServerOptions {
    std::string model_path;
    std::string model_alias;          // name in /v1/models and responses; default: general.name
    EngineOptions engine;             // n_ctx is per slot; n_slots = -np
    std::string host = "127.0.0.1";  // loopback unless asked otherwise
    int port = 8080;                  // 0 = any free port
    std::string api_key;              // empty = no authentication
    size_t max_body_bytes = 8u << 20;
    int queue_size = 64;
    uint64_t cache_bytes = 1ull << 30;
    int checkpoint_interval = 4096;
    int parallel_sample_rows = 8;  // batches sampling this many rows use several threads
    int http_threads = 0;             // 0 = enough for every slot and queued request
    std::chrono::milliseconds shutdown_grace{10000};
};

class Server {
public:
    explicit Server(ServerOptions opt);
    ~Server();
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    // Binds and starts listening on a background thread; returns the port.
    // Throws Error when the address cannot be bound.
    int listen();
    // Loads the model (blocking); until it returns /health answers "loading".
    // Throws Error on a bad model file.
    void load();
    int start() {
        const int port = listen();
        load();
        return port;
    }
    // Stops accepting work, lets in-flight requests finish within the grace
    // period (then cancels them), stops listening. Idempotent.
    void stop();

    bool ready() const { return ready_; }
    int port() const { return port_; }
    int n_ctx() const;  // context per slot (after load)
    Metrics& metrics() { return metrics_; }

private:
    void routes();
    void completion(const httplib::Request& req, httplib::Response& res, bool chat);
    bool authorized(const httplib::Request& req) const;

    ServerOptions opt_;
    Metrics metrics_;
    std::unique_ptr<httplib::Server> http_;
    std::unique_ptr<Engine> engine_;
    std::unique_ptr<Scheduler> scheduler_;
    std::string model_name_;
    std::atomic<bool> ready_{false};
    std::atomic<bool> stopping_{false};
    std::atomic<int> in_flight_{0};
    int port_ = 0;
    std::thread listener_;
};

}  // namespace qinfer::server
