// qinfer serve, in process, over loopback HTTP: the OpenAI endpoints against
// the engine's own results, the bad-input table, API keys, the request queue,
// client disconnects, the prompt cache (turn 2 processes only new tokens) and
// /metrics.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "model/hparams.h"
#include "model/model.h"
#include "qinfer/engine.h"
#include "server/server.h"
#include "testutil.h"

using namespace qinfer;
using json = nlohmann::json;

namespace {

const char* kModel = "tiny-qwen35.q8_0.gguf";

struct Reply {
    int status = 0;
    json body;
    std::string raw;
    httplib::Headers headers;
};

Reply call(int port, const std::string& method, const std::string& path, const std::string& body,
           const httplib::Headers& headers = {}) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(60, 0);
    httplib::Result r = method == "GET" ? cli.Get(path.c_str(), headers)
                                        : cli.Post(path.c_str(), headers, body, "application/json");
    Reply out;
    if (!r) return out;
    out.status = r->status;
    out.raw = r->body;
    out.headers = r->headers;
    out.body = json::parse(r->body, nullptr, false);
    return out;
}

Reply post(int port, const std::string& path, const json& body, const httplib::Headers& headers = {}) {
    return call(port, "POST", path, body.dump(), headers);
}

// A streamed request: the "data:" payloads in order. `stop_after` > 0 hangs up
// after that many events (a client that goes away).
struct Stream {
    int status = 0;
    std::vector<std::string> events;
};
Stream stream(int port, const std::string& path, const json& body, int stop_after = 0) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    Stream out;
    std::string buf;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
        buf.append(d, n);
        size_t at;
        while ((at = buf.find("\n\n")) != std::string::npos) {
            std::string ev = buf.substr(0, at);
            buf.erase(0, at + 2);
            if (ev.rfind("data: ", 0) == 0) out.events.push_back(ev.substr(6));
        }
        return stop_after <= 0 || int(out.events.size()) < stop_after;
    };
    httplib::Result r = cli.send(req);
    if (r) out.status = r->status;
    return out;
}

double metric(int port, const std::string& name) {
    const Reply r = call(port, "GET", "/metrics", "");
    std::smatch m;
    const std::regex re("\n" + name + " ([0-9.eE+-]+)\n");
    if (!std::regex_search(r.raw, m, re)) return -1;
    return std::stod(m[1].str());
}

// Polls a metric until it equals `want` (gauges follow the step that answered
// a request) or `timeout` passes; returns the last value read.
double wait_for_metric(int port, const std::string& name, double want,
                       std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    double v = metric(port, name);
    while (v != want && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        v = metric(port, name);
    }
    return v;
}

class ServerTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        const std::string path = test::reference_path(kModel);
        if (!std::filesystem::exists(path)) return;
        server::ServerOptions o;
        o.model_path = path;
        o.port = 0;
        o.engine.n_ctx = 512;
        o.engine.n_slots = 4;
        o.engine.n_batch = 64;
        o.engine.n_threads = 1;  // the CI machine is small and shared: one thread avoids oversubscription
        o.queue_size = 16;
        o.max_body_bytes = 64 << 10;
        o.checkpoint_interval = 0;
        o.parallel_sample_rows = 2;  // batches of 2+ sample on several threads (the default is 8)
        server_ = new server::Server(o);
        port_ = server_->start();
        EngineOptions eo = o.engine;
        eo.n_slots = 1;
        engine_ = Engine::load(path, eo).release();
    }
    static void TearDownTestSuite() {
        delete server_;
        delete engine_;
        server_ = nullptr;
        engine_ = nullptr;
    }
    void SetUp() override {
        if (!server_) GTEST_SKIP() << "reference model missing: " << test::reference_path(kModel);
    }
    static server::Server* server_;
    static Engine* engine_;
    static int port_;
};
server::Server* ServerTest::server_ = nullptr;
Engine* ServerTest::engine_ = nullptr;
int ServerTest::port_ = 0;

json chat_body(const std::string& user, int max_tokens) {
    return json{{"model", "x"},
                {"messages", json::array({{{"role", "user"}, {"content", user}}})},
                {"max_tokens", max_tokens},
                {"temperature", 0}};
}

}  // namespace

TEST_F(ServerTest, HealthModelsTokenize) {
    Reply h = call(port_, "GET", "/health", "");
    EXPECT_EQ(h.status, 200);
    EXPECT_EQ(h.body["status"], "ok");

    Reply m = call(port_, "GET", "/v1/models", "");
    ASSERT_EQ(m.status, 200);
    EXPECT_EQ(m.body["object"], "list");
    EXPECT_EQ(m.body["data"][0]["meta"]["n_ctx"], 512);
    EXPECT_EQ(m.body["data"][0]["meta"]["arch"], "qwen35");

    // The reference s7 sequence: golden ids from the manifest.
    Reply t = post(port_, "/tokenize", {{"content", "<|im_start|>user\nHello world<|im_end|>"}});
    ASSERT_EQ(t.status, 200);
    EXPECT_EQ(t.body["tokens"], json::parse("[8193, 872, 198, 39, 4791, 1879, 8194]"));
    Reply d = post(port_, "/detokenize", {{"tokens", t.body["tokens"]}});
    ASSERT_EQ(d.status, 200);
    EXPECT_EQ(d.body["content"], "<|im_start|>user\nHello world<|im_end|>");
}

TEST_F(ServerTest, CompletionMatchesEngine) {
    // Greedy generation through HTTP equals the engine's own loop.
    GenerateRequest g;
    g.prompt_ids = {8193, 872, 198, 39, 4791, 1879, 8194};
    g.sampling.temperature = 0;
    g.max_tokens = 10;
    g.stop_at_eog = false;
    g.reuse_cache = false;
    const GenerateResult want = engine_->generate(g);

    Reply r = post(port_, "/v1/completions",
                   {{"prompt", g.prompt_ids}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true},
                    {"return_tokens", true}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["object"], "text_completion");
    EXPECT_EQ(r.body["choices"][0]["tokens"].get<std::vector<int32_t>>(), want.tokens);
    EXPECT_EQ(r.body["choices"][0]["text"], want.text);
    EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(r.body["usage"]["prompt_tokens"], 7);
    EXPECT_EQ(r.body["usage"]["completion_tokens"], 10);
    EXPECT_EQ(r.body["usage"]["total_tokens"], 17);
}

TEST_F(ServerTest, CompletionStreamWithTokensHasOneChunkPerToken) {
    // return_tokens + stream: a chunk for every generated token (its id in
    // choices[0].token), in order, and their texts concatenate to the whole text.
    json body = {{"prompt", "<|im_start|>user\nCount to ten"}, {"max_tokens", 14}, {"temperature", 0},
                 {"ignore_eos", true}, {"return_tokens", true}};
    Reply whole = post(port_, "/v1/completions", body);
    ASSERT_EQ(whole.status, 200) << whole.raw;
    body["stream"] = true;
    Stream s = stream(port_, "/v1/completions", body);
    ASSERT_EQ(s.status, 200);
    ASSERT_FALSE(s.events.empty());
    EXPECT_EQ(s.events.back(), "[DONE]");
    std::vector<int32_t> streamed, final_tokens;
    std::string text;
    for (size_t i = 0; i + 1 < s.events.size(); i++) {
        const json c = json::parse(s.events[i]);
        const json& ch = c["choices"][0];
        text += ch["text"].get<std::string>();
        if (ch.contains("token")) streamed.push_back(ch["token"].get<int32_t>());
        if (!ch["finish_reason"].is_null()) final_tokens = ch["tokens"].get<std::vector<int32_t>>();
    }
    const std::vector<int32_t> want = whole.body["choices"][0]["tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(want.size(), 14u);
    EXPECT_EQ(streamed, want);
    EXPECT_EQ(final_tokens, want);
    EXPECT_EQ(text, whole.body["choices"][0]["text"].get<std::string>());
}

TEST_F(ServerTest, ChatStreamEqualsNonStream) {
    json body = chat_body("Tell me a story.", 12);
    body["return_tokens"] = true;
    Reply whole = post(port_, "/v1/chat/completions", body);
    ASSERT_EQ(whole.status, 200) << whole.raw;
    EXPECT_EQ(whole.body["object"], "chat.completion");
    EXPECT_EQ(whole.body["choices"][0]["message"]["role"], "assistant");

    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    Stream s = stream(port_, "/v1/chat/completions", body);
    ASSERT_EQ(s.status, 200);
    ASSERT_GE(s.events.size(), 3u);
    EXPECT_EQ(s.events.back(), "[DONE]");
    std::string content, reasoning;
    std::string finish;
    json usage;
    std::vector<int32_t> tokens;
    for (size_t i = 0; i + 1 < s.events.size(); i++) {
        json c = json::parse(s.events[i]);
        EXPECT_EQ(c["id"], json::parse(s.events[0])["id"]);
        if (c.contains("usage")) {
            usage = c["usage"];
            continue;
        }
        EXPECT_EQ(c["object"], "chat.completion.chunk");
        const json& ch = c["choices"][0];
        if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
        if (ch["delta"].contains("reasoning_content")) reasoning += ch["delta"]["reasoning_content"].get<std::string>();
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"], tokens = ch["tokens"].get<std::vector<int32_t>>();
    }
    const json& msg = whole.body["choices"][0]["message"];
    EXPECT_EQ(content, msg["content"].is_null() ? "" : msg["content"].get<std::string>());
    EXPECT_EQ(reasoning, msg.value("reasoning_content", ""));
    EXPECT_EQ(finish, whole.body["choices"][0]["finish_reason"].get<std::string>());
    EXPECT_EQ(tokens, whole.body["choices"][0]["tokens"].get<std::vector<int32_t>>());
    EXPECT_EQ(usage["completion_tokens"], whole.body["usage"]["completion_tokens"]);
    EXPECT_EQ(usage["prompt_tokens"], whole.body["usage"]["prompt_tokens"]);
}

TEST_F(ServerTest, SeedMakesSamplingReproducible) {
    json body = {{"prompt", "<|im_start|>user\nRandom words<|im_end|>"}, {"max_tokens", 16}, {"temperature", 1.0},
                 {"top_k", 0},   {"top_p", 1.0},   {"min_p", 0.0},  {"ignore_eos", true}, {"return_tokens", true}};
    auto tokens = [&](int64_t seed) {
        body["seed"] = seed;
        Reply r = post(port_, "/v1/completions", body);
        EXPECT_EQ(r.status, 200) << r.raw;
        return r.body["choices"][0]["tokens"].get<std::vector<int32_t>>();
    };
    const std::vector<int32_t> a = tokens(42), b = tokens(42), c = tokens(43);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);  // 16 tokens sampled at temperature 1 from 8218: equal by chance is negligible
}

TEST_F(ServerTest, ConcurrentRequestsMatchSequential) {
    // Different prompts at once (continuous batching, sampled on several
    // threads) give what each gives alone.
    const int n = 6;
    std::vector<json> bodies;
    std::vector<std::vector<int32_t>> alone(n), together(n);
    for (int i = 0; i < n; i++) {
        bodies.push_back({{"prompt", "<|im_start|>user\nQuestion number " + std::to_string(i * 7919) + "<|im_end|>"},
                          {"max_tokens", 8 + i},
                          {"temperature", 0},
                          {"ignore_eos", true},
                          {"return_tokens", true},
                          {"cache_prompt", false}});
        Reply r = post(port_, "/v1/completions", bodies.back());
        ASSERT_EQ(r.status, 200) << r.raw;
        alone[size_t(i)] = r.body["choices"][0]["tokens"].get<std::vector<int32_t>>();
    }
    std::vector<std::thread> th;
    for (int i = 0; i < n; i++)
        th.emplace_back([&, i] {
            Reply r = post(port_, "/v1/completions", bodies[size_t(i)]);
            if (r.status == 200) together[size_t(i)] = r.body["choices"][0]["tokens"].get<std::vector<int32_t>>();
        });
    for (auto& t : th) t.join();
    for (int i = 0; i < n; i++) {
        EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << "request " << i;
        EXPECT_EQ(alone[size_t(i)].size(), size_t(8 + i));
    }
}

TEST_F(ServerTest, BadInputTable) {
    struct Case {
        const char* path;
        std::string body;
        int status;
        const char* param;    // expected error.param ("" = any)
        const char* message;  // substring of error.message
    };
    const std::string big(80 << 10, 'a');
    const std::vector<Case> cases = {
        {"/v1/chat/completions", "{not json", 400, "", "malformed JSON"},
        {"/v1/chat/completions", "", 400, "", "malformed JSON"},
        {"/v1/chat/completions", "[1,2]", 400, "", "JSON object"},
        {"/v1/chat/completions", R"({"model":"x"})", 400, "messages", "required"},
        {"/v1/chat/completions", R"({"messages":"hi"})", 400, "messages", "non-empty array"},
        {"/v1/chat/completions", R"({"messages":[]})", 400, "messages", "non-empty array"},
        {"/v1/chat/completions", R"({"messages":[{"role":"wizard","content":"x"}]})", 400, "messages[0].role", "wizard"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":5}]})", 400, "messages[0].content", "string"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", 400, "temperature", "number"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":-1})", 400, "temperature", "between"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"top_p":1.5})", 400, "top_p", "between"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"top_k":-3})", 400, "top_k", "between"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", 400, "max_tokens", "between"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-5})", 400, "max_tokens", "between"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2.5})", 400, "max_tokens", "integer"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":100000})", 400, "max_tokens", "exceeds the context"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":NaN})", 400, "", "malformed JSON"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":1e999})", 400, "", ""},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", 400, "stop", "strings"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stop":""})", 400, "stop", "empty"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":2})", 400, "n", ""},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", 400, "stream", "boolean"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", 400, "tools[0]", ""},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"seed":"1"})", 400, "seed", "integer"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400, "", "malformed JSON"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":")" + std::string(3000, 'z') + " " + std::string(3000, 'q') + R"("}]})", 400, "messages", "context"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":")" + big + R"("}]})", 413, "", "larger"},
        {"/v1/completions", R"({"prompt":5})", 400, "prompt", ""},
        {"/v1/completions", R"({"prompt":""})", 400, "prompt", "empty"},
        {"/v1/completions", R"({"prompt":[1,99999]})", 400, "prompt", "vocabulary"},
        {"/v1/completions", R"({"prompt":[1,-2]})", 400, "prompt", ""},
        {"/v1/completions", R"({"prompt":["a","b"]})", 400, "prompt", "one prompt"},
        {"/tokenize", R"({"content":7})", 400, "content", "string"},
        {"/detokenize", R"({"tokens":[1,"x"]})", 400, "tokens", ""},
        {"/detokenize", R"({"tokens":[999999]})", 400, "tokens", ""},
        {"/v1/nothing", "{}", 404, "", "no such endpoint"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(std::string(c.path) + " " + c.body.substr(0, 120));
        Reply r = call(port_, "POST", c.path, c.body);
        EXPECT_EQ(r.status, c.status) << r.raw;
        ASSERT_TRUE(r.body.is_object()) << r.raw;
        ASSERT_TRUE(r.body.contains("error")) << r.raw;
        const json& e = r.body["error"];
        EXPECT_TRUE(e["message"].is_string());
        EXPECT_NE(e["message"].get<std::string>().find(c.message), std::string::npos) << e["message"];
        if (*c.param) {
            EXPECT_EQ(e["param"], c.param);
        }
        EXPECT_EQ(e["message"].get<std::string>().find('\n'), std::string::npos) << "one line";
    }
    // Unknown fields are ignored; the server is still serving.
    json ok = chat_body("hi", 2);
    ok["frobnicate"] = {{"x", 1}};
    ok["response_format"] = {{"type", "text"}};
    Reply r = post(port_, "/v1/chat/completions", ok);
    EXPECT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(call(port_, "GET", "/health", "").status, 200);
}

// Turn 1, then turn 2 = turn 1 + reply + a new question, and so on. The
// tokens the server processes for turn N are those after the longest
// reusable prefix: the slot's whole history when turn N extends it token for
// token, else a checkpoint of turn N-1: the start of its last message (a
// checkpoint at its very end is not taken when that message is short).
static void conversation(int port, Engine& engine, bool thinking, const std::string& system) {
    std::vector<ChatMessage> msgs = {{"system", system}, {"user", "Name three colours."}};
    ChatOptions co;
    co.enable_thinking = thinking;
    std::vector<int32_t> slot;  // what the server's slot should hold after each turn
    std::vector<int32_t> ids_prev;
    for (int turn = 1; turn <= 3; turn++) {
        json jm = json::array();
        for (const ChatMessage& m : msgs) jm.push_back({{"role", m.role}, {"content", m.content}});
        json body = {{"messages", jm}, {"max_tokens", 6}, {"temperature", 0}, {"return_tokens", true},
                     {"chat_template_kwargs", {{"enable_thinking", thinking}}}};
        const double processed_before = metric(port, "qinfer_prompt_tokens_processed_total");
        Reply r = post(port, "/v1/chat/completions", body);
        ASSERT_EQ(r.status, 200) << r.raw;
        const std::vector<int32_t> ids = engine.tokenize(engine.render_chat(msgs, co));
        ASSERT_EQ(r.body["usage"]["prompt_tokens"], int(ids.size()));
        const int cached = r.body["usage"]["prompt_tokens_details"]["cached_tokens"];
        const int processed = int(ids.size()) - cached;
        EXPECT_EQ(r.body["timings"]["prompt_n"], processed);
        EXPECT_EQ(metric(port, "qinfer_prompt_tokens_processed_total") - processed_before, processed);
        if (turn > 1) {
            auto is_prefix = [&](const std::vector<int32_t>& p, size_t n) {
                return n <= p.size() && n < ids.size() && std::equal(p.begin(), p.begin() + std::ptrdiff_t(n), ids.begin());
            };
            // Checkpoint positions of the previous turn: before its last
            // <|im_start|>, and at its end when that is more than 64 tokens later.
            size_t boundary = ids_prev.size();
            while (boundary > 0 && ids_prev[boundary - 1] != 8193) boundary--;
            boundary = boundary > 0 ? boundary - 1 : 0;
            size_t want = 0;
            if (is_prefix(ids_prev, boundary)) want = boundary;
            if (ids_prev.size() - boundary > 64 && is_prefix(ids_prev, ids_prev.size())) want = ids_prev.size();
            if (is_prefix(slot, slot.size())) want = std::max(want, slot.size());
            std::printf("turn %d: prompt %zu, cached %d (previous prompt %zu, its last message at %zu, slot %zu%s)\n", turn,
                        ids.size(), cached, ids_prev.size(), boundary, slot.size(),
                        is_prefix(slot, slot.size()) ? ", continued in place" : "");
            EXPECT_GT(boundary, 0u);
            EXPECT_GE(want, boundary) << "turn " << turn << ": the history before the last reply must be reused";
            EXPECT_EQ(size_t(cached), want) << "turn " << turn;
            EXPECT_EQ(processed, int(ids.size() - want)) << "turn " << turn << ": only the new tokens are processed";
        } else {
            EXPECT_EQ(cached, 0);
        }
        const std::vector<int32_t> gen = r.body["choices"][0]["tokens"].get<std::vector<int32_t>>();
        ASSERT_FALSE(gen.empty());
        slot = ids;
        slot.insert(slot.end(), gen.begin(), gen.end() - 1);  // the last sampled token is never fed
        ids_prev = ids;
        const json& msg = r.body["choices"][0]["message"];
        msgs.push_back({"assistant", msg["content"].is_null() ? "" : msg["content"].get<std::string>()});
        msgs.push_back({"user", "And " + std::to_string(turn * 3) + " more?"});
    }
}

TEST_F(ServerTest, PromptCacheSecondTurnProcessesOnlyNewTokens) {
    // Different system prompts: no checkpoint of one conversation serves the other.
    conversation(port_, *engine_, true, "You are terse.");
    conversation(port_, *engine_, false, "Answer briefly, without thinking.");
}

TEST_F(ServerTest, CheckpointRestoreGivesSameOutput) {
    // The second prompt extends the first at a special-token boundary, not
    // the first's generated text: the end-of-prompt checkpoint (DeltaNet
    // state included) is restored, and the result equals an uncached run.
    const std::string p1 = "<|im_start|>system\nYou are a checkpoint test.<|im_end|>\n";
    const std::string p2 = p1 + "<|im_start|>user\nContinue from the snapshot please.<|im_end|>\n<|im_start|>assistant\n";
    json b1 = {{"prompt", p1}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}};
    Reply r1 = post(port_, "/v1/completions", b1);
    ASSERT_EQ(r1.status, 200) << r1.raw;
    const int n1 = r1.body["usage"]["prompt_tokens"];

    json b2 = {{"prompt", p2}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}, {"return_tokens", true}};
    Reply cached = post(port_, "/v1/completions", b2);
    ASSERT_EQ(cached.status, 200) << cached.raw;
    EXPECT_EQ(cached.body["usage"]["prompt_tokens_details"]["cached_tokens"], n1);
    b2["cache_prompt"] = false;
    Reply fresh = post(port_, "/v1/completions", b2);
    ASSERT_EQ(fresh.status, 200) << fresh.raw;
    EXPECT_EQ(fresh.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(cached.body["choices"][0]["tokens"], fresh.body["choices"][0]["tokens"]);
}

TEST_F(ServerTest, ChainedCheckpointsGiveSameOutput) {
    // p1 < p2 < p3, each extending the last at a special token: p2's end
    // checkpoint is stored on top of p1's (only its own KV rows), p3 restores
    // that chain, keeping the rows its slot already holds. Each equals an
    // uncached run, and the cache grows by less than a whole snapshot.
    const std::string p1 = "<|im_start|>system\nChains of checkpoints, test three.<|im_end|>\n";
    const std::string p2 = p1 + "<|im_start|>user\nThe first question goes here, and it is long enough.<|im_end|>\n";
    const std::string p3 = p2 + "<|im_start|>user\nA second one.<|im_end|>\n<|im_start|>assistant\n";
    const StateSizes sz = state_sizes(engine_->model().hparams(), GgmlType::F16);
    int n_prev = 0;
    for (int k = 0; k < 3; k++) {
        const std::string& p = k == 0 ? p1 : k == 1 ? p2 : p3;
        json b = {{"prompt", p}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}, {"return_tokens", true}};
        const double cache_before = metric(port_, "qinfer_prompt_cache_bytes");
        Reply cached = post(port_, "/v1/completions", b);
        ASSERT_EQ(cached.status, 200) << cached.raw;
        EXPECT_EQ(cached.body["usage"]["prompt_tokens_details"]["cached_tokens"], n_prev);
        const int n = cached.body["usage"]["prompt_tokens"];
        if (k == 1) {
            // One end-of-prompt checkpoint holding rows [n_prev, n) only.
            const double want = double(uint64_t(n - n_prev) * sz.kv_bytes_per_token + sz.recurrent_bytes_per_seq +
                                       uint64_t(n) * sizeof(int32_t));
            const double grew =
                wait_for_metric(port_, "qinfer_prompt_cache_bytes", cache_before + want, std::chrono::seconds(1)) -
                cache_before;
            EXPECT_EQ(grew, want) << "a whole snapshot would be " << double(uint64_t(n) * sz.kv_bytes_per_token);
        }
        b["cache_prompt"] = false;
        Reply fresh = post(port_, "/v1/completions", b);
        ASSERT_EQ(fresh.status, 200) << fresh.raw;
        EXPECT_EQ(cached.body["choices"][0]["tokens"], fresh.body["choices"][0]["tokens"]) << p;
        n_prev = cached.body["usage"]["prompt_tokens"];
    }
}

TEST_F(ServerTest, DisconnectCancelsWithinASecond) {
    const double cancelled_before = metric(port_, "qinfer_requests_total\\{outcome=\"cancelled\"\\}");
    json body = {{"prompt", "<|im_start|>user\nGo on forever"}, {"max_tokens", 400}, {"temperature", 0},
                 {"ignore_eos", true}, {"stream", true}};
    Stream s = stream(port_, "/v1/completions", body, 3);
    EXPECT_EQ(s.events.size(), 3u);
    // The sequence leaves the batch: no active sequences shortly after.
    EXPECT_EQ(wait_for_metric(port_, "qinfer_active_sequences", 0), 0);
    EXPECT_GT(metric(port_, "qinfer_requests_total\\{outcome=\"cancelled\"\\}"), cancelled_before);
    EXPECT_LT(metric(port_, "qinfer_generated_tokens_total"), 1e9);
}

TEST_F(ServerTest, MetricsExposition) {
    ASSERT_EQ(post(port_, "/v1/chat/completions", chat_body("count me", 3)).status, 200);
    Reply r = call(port_, "GET", "/metrics", "");
    ASSERT_EQ(r.status, 200);
    for (const char* name : {"qinfer_requests_total{outcome=\"ok\"}", "qinfer_prompt_tokens_total", "qinfer_generated_tokens_total",
                             "qinfer_queue_depth", "qinfer_active_sequences", "qinfer_state_bytes_allocated",
                             "qinfer_state_bytes_in_use", "qinfer_prompt_cache_bytes",
                             "qinfer_time_to_first_token_seconds_bucket{le=\"+Inf\"}",
                             "qinfer_time_per_output_token_seconds_count"})
        EXPECT_NE(r.raw.find(name), std::string::npos) << name;
    EXPECT_GT(metric(port_, "qinfer_time_to_first_token_seconds_count"), 0);
    EXPECT_GT(metric(port_, "qinfer_state_bytes_allocated"), 0);
    // Every step runs at least one token; forward passes take measurable time.
    const double steps = metric(port_, "qinfer_forward_steps_total");
    EXPECT_GT(steps, 0);
    EXPECT_GE(metric(port_, "qinfer_batch_tokens_total"), steps);
    EXPECT_GT(metric(port_, "qinfer_forward_seconds_total"), 0);
    EXPECT_GT(metric(port_, "qinfer_sample_seconds_total"), 0);
    EXPECT_GE(metric(port_, "qinfer_snapshot_seconds_total"), 0);
    EXPECT_EQ(metric(port_, "qinfer_queue_depth"), 0);
    // Greedy requests (temperature 0, no penalties): the backend picked their tokens.
    EXPECT_GT(metric(port_, "qinfer_argmax_steps_total"), 0);
    EXPECT_LE(metric(port_, "qinfer_argmax_steps_total"), steps);
    EXPECT_EQ(metric(port_, "qinfer_offloaded_steps_total"), 0);  // CPU only: nothing to offload
    // A sampled request (top-k 40 by default): its steps send back candidates, not logits rows.
    const double few_before = metric(port_, "qinfer_candidate_steps_total");
    json sampled = chat_body("count me again", 3);
    sampled["temperature"] = 0.7;
    sampled["seed"] = 3;
    sampled["ignore_eos"] = true;
    ASSERT_EQ(post(port_, "/v1/chat/completions", sampled).status, 200);
    EXPECT_GE(metric(port_, "qinfer_candidate_steps_total"), few_before + 3);
}

// A non-streaming client that hangs up while its answer is generated: the
// sequence is cancelled long before max_tokens. The hang-up follows the
// server's progress (not a wall-clock timeout), and the answer is far longer
// than the time to notice, so a fast machine cannot finish it first.
TEST(ServerDisconnect, NonStreamingClientThatHangsUpIsCancelled) {
    const std::string path = test::reference_path(kModel);
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    server::ServerOptions o;
    o.model_path = path;
    o.port = 0;
    o.engine.n_ctx = 4096;
    o.engine.n_slots = 1;
    o.engine.n_threads = 1;
    server::Server s(o);
    const int port = s.start();
    constexpr int kMaxTokens = 4000;

    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(60, 0);
    bool answered = true;
    std::thread client([&] {
        json body = {{"prompt", "<|im_start|>user\nA long answer please"}, {"max_tokens", kMaxTokens},
                     {"temperature", 0}, {"ignore_eos", true}};
        answered = bool(cli.Post("/v1/completions", body.dump(), "application/json"));
    });
    // Hang up once tokens flow.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (metric(port, "qinfer_generated_tokens_total") < 16 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    cli.stop();
    client.join();
    EXPECT_FALSE(answered);
    EXPECT_EQ(wait_for_metric(port, "qinfer_active_sequences", 0), 0);
    EXPECT_EQ(metric(port, "qinfer_requests_total\\{outcome=\"cancelled\"\\}"), 1);
    EXPECT_LT(metric(port, "qinfer_generated_tokens_total"), kMaxTokens / 2) << "stopped long before max_tokens";
}

// A separate small server: API key, queue limit, shutdown.
TEST(ServerLimits, ApiKeyQueueAndShutdown) {
    const std::string path = test::reference_path(kModel);
    QINFER_SKIP_WITHOUT_REFERENCE_FILE(path);
    server::ServerOptions o;
    o.model_path = path;
    o.port = 0;
    o.engine.n_ctx = 4096;  // room for requests that outlast the queue check below
    o.engine.n_slots = 1;
    o.engine.n_threads = 1;  // the CI machine is small and shared: one thread avoids oversubscription
    o.queue_size = 1;
    o.api_key = "sekrit-key";
    o.shutdown_grace = std::chrono::milliseconds(200);
    auto s = std::make_unique<server::Server>(o);
    const int port = s->listen();
    const httplib::Headers auth = {{"Authorization", "Bearer sekrit-key"}};

    // Listening before the model is loaded: /health says so, the API answers 503.
    Reply loading = call(port, "GET", "/health", "");
    EXPECT_EQ(loading.status, 503);
    EXPECT_EQ(loading.body["status"], "loading");
    EXPECT_EQ(call(port, "GET", "/v1/models", "", auth).status, 503);
    s->load();

    EXPECT_EQ(call(port, "GET", "/health", "").status, 200);  // no key needed
    EXPECT_EQ(call(port, "GET", "/v1/models", "").status, 401);
    Reply wrong = call(port, "GET", "/v1/models", "", {{"Authorization", "Bearer sekrit-kez"}});
    EXPECT_EQ(wrong.status, 401);
    EXPECT_EQ(wrong.body["error"]["type"], "authentication_error");
    EXPECT_EQ(call(port, "GET", "/v1/models", "", {{"Authorization", "sekrit-key"}}).status, 401);
    EXPECT_EQ(call(port, "GET", "/v1/models", "", auth).status, 200);

    // One slot, one queue place: a third concurrent request is refused with 503.
    // 4000 tokens take seconds (900 once took 0.59 s, and the running request
    // ended before the third one came, which then got the queue place); the
    // shutdown below cuts them short.
    json longreq = {{"prompt", "<|im_start|>user\nlong"}, {"max_tokens", 4000}, {"temperature", 0}, {"ignore_eos", true}};
    std::vector<int> statuses(2, 0);
    std::vector<std::thread> th;
    for (int i = 0; i < 2; i++)
        th.emplace_back([&, i] { statuses[size_t(i)] = post(port, "/v1/completions", longreq, auth).status; });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
        Reply m = call(port, "GET", "/metrics", "", auth);
        // Both: one running and one waiting. The queue depth alone is also 1
        // while the first request waits for the free slot, and a third request
        // sent then could take the second one's queue place.
        if (m.raw.find("\nqinfer_queue_depth 1\n") != std::string::npos &&
            m.raw.find("\nqinfer_active_sequences 1\n") != std::string::npos)
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    Reply busy = post(port, "/v1/completions", longreq, auth);
    EXPECT_EQ(busy.status, 503) << busy.raw;
    bool retry_after = false;
    for (const auto& h : busy.headers) retry_after = retry_after || h.first == "Retry-After";
    EXPECT_TRUE(retry_after);

    // Shutdown with requests in flight: both get an answer, within the grace period.
    const auto t0 = std::chrono::steady_clock::now();
    s->stop();
    for (auto& t : th) t.join();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
    EXPECT_EQ(statuses[0] == 200 || statuses[0] == 503, true) << statuses[0];
    EXPECT_EQ(statuses[1] == 200 || statuses[1] == 503, true) << statuses[1];
    EXPECT_EQ(call(port, "GET", "/health", "").status, 0);  // no longer listening
}
