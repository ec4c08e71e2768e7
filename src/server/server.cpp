#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <ctime>
#include <filesystem>

#include "chat/output_parser.h"
#include "chat/template.h"
#include "common/error.h"
#include "server/openai.h"
#include "server/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::server {

namespace {

using Clock = std::chrono::steady_clock;

void send_error(httplib::Response& res, int status, const std::string& msg, const std::string& param = "") {
    res.status = status;
    res.set_content(error_body(status, msg, param), "application/json");
}

// Equal-time comparison: the time taken does not depend on where the strings differ.
bool constant_time_equal(const std::string& a, const std::string& b) {
    const size_t n = std::max(a.size(), b.size());
    unsigned diff = unsigned(a.size() != b.size());
    for (size_t i = 0; i < n; i++) {
        const unsigned char x = i < a.size() ? (unsigned char)a[i] : 0;
        const unsigned char y = i < b.size() ? (unsigned char)b[i] : 0;
        diff |= unsigned(x ^ y);
    }
    return diff == 0;
}


// The job's next event, watching the connection meanwhile (at least every
// 50 ms, also while tokens flow): false when the client has gone away, and
// the job is then cancelled -- the scheduler drops it at its next step.
bool next_event(Job& job, httplib::DataSink& sink, Event& e) {
    thread_local Clock::time_point last_check;
    for (;;) {
        const auto now = Clock::now();
        if (now - last_check >= std::chrono::milliseconds(50)) {
            last_check = now;
            if (!sink.is_writable()) {
                job.cancelled = true;
                return false;
            }
        }
        if (job.events.pop(e, std::chrono::milliseconds(50))) return true;
    }
}

void write_sse(httplib::DataSink& sink, const json& j, bool& ok) {
    if (!ok) return;
    const std::string s = "data: " + dump(j) + "\n\n";
    ok = sink.write(s.data(), s.size());
}

}  // namespace

Server::Server(ServerOptions opt) : opt_(std::move(opt)), http_(std::make_unique<httplib::Server>()) {}

Server::~Server() { stop(); }

bool Server::authorized(const httplib::Request& req) const {
    if (opt_.api_key.empty()) return true;
    const std::string h = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    const std::string given = h.compare(0, prefix.size(), prefix) == 0 ? h.substr(prefix.size()) : std::string();
    return constant_time_equal(given, opt_.api_key);
}

int Server::listen() {
    const int n_threads =
        opt_.http_threads > 0 ? opt_.http_threads : std::max(16, opt_.engine.n_slots + opt_.queue_size + 8);
    http_->new_task_queue = [n_threads] { return new httplib::ThreadPool(size_t(n_threads)); };
    http_->set_payload_max_length(opt_.max_body_bytes);
    http_->set_read_timeout(30, 0);
    http_->set_write_timeout(30, 0);
    routes();
    // httplib listens with a backlog of 5: a burst of clients connecting
    // while the CPU is busy with a forward pass overflows it (connections
    // reset after a second). Remember the socket to listen again with room.
    socket_t listen_sock = INVALID_SOCKET;
    // Also: httplib's default SO_REUSEPORT would let a second server bind the
    // same port and silently take half the connections; a busy port is an error.
    http_->set_socket_options([&listen_sock](socket_t sock) {
        int yes = 1;
#ifdef _WIN32
        setsockopt(sock, SOL_SOCKET, SO_EXCLUSIVEADDRUSE, reinterpret_cast<const char*>(&yes), sizeof(yes));
#else
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // restart while old connections linger
#endif
        listen_sock = sock;
    });
    port_ = opt_.port == 0 ? http_->bind_to_any_port(opt_.host) : (http_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
    if (port_ <= 0) fail(strfmt("cannot listen on %s:%d (address in use or not available)", opt_.host.c_str(), opt_.port));
    http_->set_socket_options([](socket_t) {});  // the lambda above refers to this frame
    if (listen_sock != INVALID_SOCKET) ::listen(listen_sock, 1024);  // raises the backlog (Linux, BSD)
    listener_ = std::thread([this] { http_->listen_after_bind(); });
    // stop() only ends a listen loop that has started: wait for it (bounded).
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!http_->is_running() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!http_->is_running()) fail(strfmt("the HTTP listener on %s:%d did not start", opt_.host.c_str(), port_));
    return port_;
}

void Server::load() {
    engine_ = Engine::load(opt_.model_path, opt_.engine);
    model_name_ = opt_.model_alias.empty() ? engine_->info().name : opt_.model_alias;
    SchedulerOptions so;
    so.queue_size = opt_.queue_size;
    so.cache_bytes = opt_.cache_bytes;
    so.checkpoint_interval = opt_.checkpoint_interval;
    so.parallel_sample_rows = opt_.parallel_sample_rows;
    scheduler_ = std::make_unique<Scheduler>(*engine_, so, metrics_);
    ready_ = true;
}

int Server::n_ctx() const { return scheduler_ ? scheduler_->n_ctx() : 0; }

void Server::stop() {
    if (stopping_.exchange(true)) {
        if (listener_.joinable()) listener_.join();
        return;
    }
    // New requests are refused from here on (503); in-flight ones finish
    // within the grace period or are cancelled, then their handlers return.
    if (scheduler_) scheduler_->shutdown(opt_.shutdown_grace);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (in_flight_ > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    http_->stop();
    if (listener_.joinable()) listener_.join();
}

void Server::routes() {
    httplib::Server& h = *http_;
    h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
        if (!authorized(req)) {
            metrics_.requests_client_error++;
            res.set_header("WWW-Authenticate", "Bearer");
            send_error(res, 401, "invalid or missing API key (send 'Authorization: Bearer KEY')");
            return httplib::Server::HandlerResponse::Handled;
        }
        if (stopping_) {
            metrics_.requests_rejected++;
            send_error(res, 503, "the server is shutting down");
            return httplib::Server::HandlerResponse::Handled;
        }
        if (!ready_ && req.path != "/metrics") {
            res.set_header("Retry-After", "1");
            send_error(res, 503, "the model is still loading");
            return httplib::Server::HandlerResponse::Handled;
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });
    h.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string msg = "internal error";
        try {
            if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            msg = e.what();
        } catch (...) {
        }
        metrics_.requests_server_error++;
        send_error(res, 500, msg);
    });
    h.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        if (res.status == 404)
            send_error(res, 404, "no such endpoint: " + req.method + " " + req.path);
        else if (res.status == 413)
            send_error(res, 413, "the request body is larger than the server accepts");
        else
            send_error(res, res.status, strfmt("HTTP error %d", res.status));
    });

    h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        if (ready_ && !stopping_) {
            res.set_content(R"({"status":"ok"})", "application/json");
        } else {
            res.status = 503;
            res.set_content(stopping_ ? R"({"status":"shutting down"})" : R"({"status":"loading"})", "application/json");
        }
    });
    h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics_.render(), "text/plain; version=0.0.4");
    });
    h.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
        const ModelInfo info = engine_->info();
        json m = {{"id", model_name_},
                  {"object", "model"},
                  {"created", int64_t(std::time(nullptr))},
                  {"owned_by", "qinfer"},
                  {"meta",
                   {{"arch", info.arch},
                    {"n_ctx", info.n_ctx},
                    {"n_ctx_train", info.n_ctx_train},
                    {"n_vocab", info.n_vocab},
                    {"n_params", info.n_params},
                    {"file_type", info.file_type},
                    {"backend", info.backend},
                    {"slots", scheduler_->n_slots()}}}};
        res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
        metrics_.requests_ok++;
    });
    auto with_json = [this](auto fn) {
        return [this, fn](const httplib::Request& req, httplib::Response& res) {
            in_flight_++;
            try {
                json body;
                try {
                    body = json::parse(req.body);
                } catch (const json::exception& e) {
                    throw ApiError(400, std::string("malformed JSON: ") + e.what());
                }
                fn(body, req, res);
            } catch (const ApiError& e) {
                e.status == 503 ? metrics_.requests_rejected++ : metrics_.requests_client_error++;
                if (e.status == 503) res.set_header("Retry-After", "1");
                send_error(res, e.status, e.what(), e.param);
            } catch (const Error& e) {
                // Errors from the engine on request data (template, tokens) are the client's.
                metrics_.requests_client_error++;
                send_error(res, 400, e.what());
            } catch (const std::exception& e) {
                metrics_.requests_server_error++;
                send_error(res, 500, e.what());
            }
            in_flight_--;
        };
    };
    h.Post("/tokenize", with_json([this](const json& b, const httplib::Request&, httplib::Response& res) {
        if (!b.is_object() || !b.contains("content") || !b["content"].is_string())
            throw ApiError(400, "'content' must be a string", "content");
        bool special = true;
        if (b.contains("parse_special")) {
            if (!b["parse_special"].is_boolean()) throw ApiError(400, "'parse_special' must be a boolean", "parse_special");
            special = b["parse_special"].get<bool>();
        }
        const std::vector<int32_t> ids = engine_->tokenize(b["content"].get<std::string>(), special);
        json out = {{"tokens", ids}};
        if (b.value("with_pieces", false)) {
            json pieces = json::array();
            for (int32_t id : ids) pieces.push_back({{"id", id}, {"piece", engine_->detokenize({id}, true)}});
            out["tokens"] = pieces;
        }
        res.set_content(dump(out), "application/json");
        metrics_.requests_ok++;
    }));
    h.Post("/detokenize", with_json([this](const json& b, const httplib::Request&, httplib::Response& res) {
        if (!b.is_object() || !b.contains("tokens") || !b["tokens"].is_array())
            throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
        const int n_vocab = engine_->tokenizer().n_vocab();
        std::vector<int32_t> ids;
        for (const json& x : b["tokens"]) {
            if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= n_vocab)
                throw ApiError(400, strfmt("'tokens' must hold token ids in 0..%d", n_vocab - 1), "tokens");
            ids.push_back(int32_t(x.get<int64_t>()));
        }
        res.set_content(dump(json{{"content", engine_->detokenize(ids, true)}}), "application/json");
        metrics_.requests_ok++;
    }));
    h.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, true); });
    h.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, false); });
}

void Server::completion(const httplib::Request& http_req, httplib::Response& res, bool chat) {
    in_flight_++;
    struct Guard {
        std::atomic<int>& n;
        ~Guard() { n--; }
    } guard{in_flight_};
    std::shared_ptr<Job> job;
    ApiRequest ar;
    try {
        json body;
        try {
            body = json::parse(http_req.body);
        } catch (const json::exception& e) {
            throw ApiError(400, std::string("malformed JSON: ") + e.what());
        }
        const SamplingParams defaults = engine_->default_sampling();
        ar = chat ? parse_chat_request(body, defaults) : parse_completion_request(body, defaults);

        job = std::make_shared<Job>();
        job->req = ar.gen;
        try {
            job->prompt = engine_->prepare_prompt(ar.gen);
        } catch (const Error& e) {
            throw ApiError(400, e.what(), chat ? "messages" : "prompt");
        }
        const int n_ctx = scheduler_->n_ctx();
        const int n_prompt = int(job->prompt.size());
        const int n_vocab = engine_->tokenizer().n_vocab();
        for (int32_t id : job->prompt)
            if (id < 0 || id >= n_vocab)
                throw ApiError(400, strfmt("prompt token id %d is outside the vocabulary (0..%d)", id, n_vocab - 1), "prompt");
        if (n_prompt == 0) throw ApiError(400, "the prompt is empty", chat ? "messages" : "prompt");
        if (n_prompt >= n_ctx)
            throw ApiError(400,
                           strfmt("the prompt is %d tokens but the context holds %d per request; shorten it", n_prompt, n_ctx),
                           chat ? "messages" : "prompt");
        if (ar.gen.max_tokens > 0 && int64_t(n_prompt) + ar.gen.max_tokens > n_ctx)
            throw ApiError(400,
                           strfmt("max_tokens (%d) plus the prompt (%d tokens) exceeds the context (%d tokens)",
                                  ar.gen.max_tokens, n_prompt, n_ctx),
                           "max_tokens");
        if (!scheduler_->submit(job)) throw ApiError(503, "the server is busy (request queue full); retry later");
    } catch (const ApiError& e) {
        e.status == 503 ? metrics_.requests_rejected++ : metrics_.requests_client_error++;
        if (e.status == 503) res.set_header("Retry-After", "1");
        send_error(res, e.status, e.what(), e.param);
        return;
    } catch (const std::exception& e) {
        metrics_.requests_server_error++;
        send_error(res, 500, e.what());
        return;
    }

    auto reply = std::make_shared<Reply>();
    reply->chat = chat;
    reply->id = random_id(chat ? "chatcmpl-" : "cmpl-");
    reply->model = model_name_;
    reply->created = int64_t(std::time(nullptr));
    if (chat) {
        chat::OutputParser::Options po;
        po.start_in_reasoning = engine_->chat_starts_in_reasoning(ar.gen.chat);
        po.xml_tool_calls = engine_->chat_template().flavor() == chat::Flavor::Qwen35;
        po.parse_tool_calls = ar.has_tools;
        po.tools_json = ar.gen.chat.tools_json;
        reply->parser = std::make_unique<chat::OutputParser>(po);
    }

    if (!ar.stream) {
        // Wait for the first event: admission errors (and 503 at shutdown for
        // a queued job) still get their own status. The scheduler always ends
        // a job with Done or Error, so this loop ends.
        auto first = std::make_shared<Event>();
        while (!job->events.pop(*first, std::chrono::milliseconds(200))) {
        }
        if (first->kind == Event::Kind::Error) {
            (first->status >= 500 ? metrics_.requests_server_error : metrics_.requests_client_error)++;
            if (first->status == 503) res.set_header("Retry-After", "1");
            send_error(res, first->status, first->error);
            return;
        }
        // The rest is written by a content provider, which can tell when the
        // client has gone away (a blocked handler cannot) and cancel the
        // sequence at the next step. The body is one JSON document.
        const bool return_tokens = ar.return_tokens;
        in_flight_++;
        res.set_chunked_content_provider(
            "application/json",
            [this, job, reply, first, return_tokens](size_t, httplib::DataSink& sink) {
                Event e = std::move(*first);
                for (;;) {
                    if (e.kind == Event::Kind::Token) {
                        reply->tokens.push_back(e.id);
                        if (reply->chat)
                            reply->parser->push(e.piece);
                        else
                            reply->text += e.piece;
                    } else {
                        std::string body;
                        if (e.kind == Event::Kind::Error) {
                            metrics_.requests_server_error++;
                            body = error_body(e.status, e.error);
                        } else {
                            body = dump(final_reply(*reply, e.result, return_tokens));
                            (e.result.finish_reason == FinishReason::Cancelled ? metrics_.requests_cancelled
                                                                                : metrics_.requests_ok)++;
                        }
                        sink.write(body.data(), body.size());
                        sink.done();
                        return true;
                    }
                    if (!next_event(*job, sink, e)) {
                        metrics_.requests_cancelled++;
                        return false;
                    }
                }
            },
            [this, job](bool) {
                job->cancelled = true;  // no-op when the job already ended
                in_flight_--;
            });
        return;
    }

    const bool include_usage = ar.include_usage;
    const bool return_tokens = ar.return_tokens;
    in_flight_++;  // the provider runs after this handler returns
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, reply, include_usage, return_tokens](size_t, httplib::DataSink& sink) {
            bool ok = true;
            if (reply->chat) write_sse(sink, reply->chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr), ok);
            Event e;
            while (ok) {
                if (!next_event(*job, sink, e)) {
                    ok = false;
                    break;
                }
                if (e.kind == Event::Kind::Token) {
                    reply->tokens.push_back(e.id);
                    if (reply->chat) {
                        for (const json& c : reply->deltas(reply->parser->push(e.piece))) write_sse(sink, c, ok);
                    } else if (return_tokens) {
                        // Every token gets its chunk (with its id), even one whose
                        // text is held back as an incomplete UTF-8 sequence.
                        json c = reply->chunk(e.piece, nullptr);
                        c["choices"][0]["token"] = e.id;
                        write_sse(sink, c, ok);
                    } else if (!e.piece.empty()) {
                        write_sse(sink, reply->chunk(e.piece, nullptr), ok);
                    }
                    continue;
                }
                if (e.kind == Event::Kind::Error) {
                    (e.status >= 500 ? metrics_.requests_server_error : metrics_.requests_client_error)++;
                    const std::string s = "data: " + error_body(e.status, e.error) + "\n\ndata: [DONE]\n\n";
                    sink.write(s.data(), s.size());
                    sink.done();
                    return true;
                }
                // Done: what the parser held back, the finish reason, usage.
                if (reply->chat)
                    for (const json& c : reply->deltas(reply->parser->finish())) write_sse(sink, c, ok);
                const bool calls = reply->chat && !reply->parser->tool_calls().empty();
                json last = reply->chunk(reply->chat ? json::object() : json(""), finish_name(e.result, calls));
                if (return_tokens) last["choices"][0]["tokens"] = reply->tokens;
                last["timings"] = timings_json(e.result);
                write_sse(sink, last, ok);
                if (include_usage) {
                    json u = reply->chunk(json::object(), nullptr);
                    u["choices"] = json::array();
                    u["usage"] = usage_json(e.result);
                    write_sse(sink, u, ok);
                }
                if (ok) {
                    const std::string d = "data: [DONE]\n\n";
                    ok = sink.write(d.data(), d.size());
                }
                (e.result.finish_reason == FinishReason::Cancelled ? metrics_.requests_cancelled : metrics_.requests_ok)++;
                sink.done();
                return true;
            }
            // The client went away: the scheduler drops the sequence at its next step.
            job->cancelled = true;
            metrics_.requests_cancelled++;
            return false;
        },
        [this, job](bool) {
            job->cancelled = true;  // no-op when the job already ended
            in_flight_--;
        });
}

}  // namespace qinfer::server
