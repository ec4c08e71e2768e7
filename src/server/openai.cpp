#include "server/openai.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>

namespace qinfer::server {

namespace {

const char* error_type(int status) {
    if (status == 401) return "authentication_error";
    if (status == 404) return "not_found_error";
    if (status == 413) return "invalid_request_error";
    if (status == 503) return "unavailable_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

const char* type_name(const json& v) {
    switch (v.type()) {
        case json::value_t::null: return "null";
        case json::value_t::boolean: return "a boolean";
        case json::value_t::string: return "a string";
        case json::value_t::array: return "an array";
        case json::value_t::object: return "an object";
        default: return "a number";
    }
}

// Optional field lookups: absent or null = not given.
const json* field(const json& o, const char* key) {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return nullptr;
    return &*it;
}

bool get_bool(const json& o, const char* key, bool def) {
    const json* v = field(o, key);
    if (!v) return def;
    if (!v->is_boolean()) bad(key, strfmt("'%s' must be a boolean, got %s", key, type_name(*v)));
    return v->get<bool>();
}

double get_number(const json& o, const char* key, double def, double lo, double hi) {
    const json* v = field(o, key);
    if (!v) return def;
    if (!v->is_number()) bad(key, strfmt("'%s' must be a number, got %s", key, type_name(*v)));
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi) bad(key, strfmt("'%s' must be between %g and %g, got %g", key, lo, hi, d));
    return d;
}

int64_t get_int(const json& o, const char* key, int64_t def, int64_t lo, int64_t hi) {
    const json* v = field(o, key);
    if (!v) return def;
    int64_t i = 0;
    if (v->is_number_integer()) {
        if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
            bad(key, strfmt("'%s' is out of range", key));
        i = v->get<int64_t>();
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()) &&
               std::fabs(v->get<double>()) < 9e15) {
        i = int64_t(v->get<double>());  // 16.0 is accepted as 16
    } else {
        bad(key, strfmt("'%s' must be an integer, got %s", key, v->is_number() ? "a fractional number" : type_name(*v)));
    }
    if (i < lo || i > hi)
        bad(key, strfmt("'%s' must be between %lld and %lld, got %lld", key, (long long)lo, (long long)hi, (long long)i));
    return i;
}

std::string get_string(const json& o, const char* key, const std::string& def) {
    const json* v = field(o, key);
    if (!v) return def;
    if (!v->is_string()) bad(key, strfmt("'%s' must be a string, got %s", key, type_name(*v)));
    return v->get<std::string>();
}

// Message content: a string, or an array of {"type": "text", "text": ...} parts.
std::string content_text(const json& v, const std::string& param) {
    if (v.is_null()) return "";
    if (v.is_string()) return v.get<std::string>();
    if (v.is_array()) {
        std::string s;
        for (const json& part : v) {
            if (!part.is_object()) bad(param, param + " parts must be objects");
            const std::string type = get_string(part, "type", "text");
            if (type != "text") bad(param, strfmt("%s: content part type '%s' is not supported (text only)", param.c_str(), type.c_str()));
            s += get_string(part, "text", "");
        }
        return s;
    }
    bad(param, strfmt("%s must be a string or an array of text parts, got %s", param.c_str(), type_name(v)));
}

void parse_sampling(const json& b, ApiRequest& r, const SamplingParams& defaults) {
    SamplingParams& s = r.gen.sampling;
    s = defaults;
    s.temperature = float(get_number(b, "temperature", s.temperature, 0.0, 100.0));
    s.top_p = float(get_number(b, "top_p", s.top_p, 0.0, 1.0));
    s.top_k = int(get_int(b, "top_k", s.top_k, 0, 1 << 30));
    s.min_p = float(get_number(b, "min_p", s.min_p, 0.0, 1.0));
    s.presence_penalty = float(get_number(b, "presence_penalty", s.presence_penalty, -2.0, 2.0));
    s.frequency_penalty = float(get_number(b, "frequency_penalty", s.frequency_penalty, -2.0, 2.0));
    s.repeat_penalty = float(get_number(b, "repeat_penalty", s.repeat_penalty, 0.0, 10.0));
    s.repeat_last_n = int(get_int(b, "repeat_last_n", s.repeat_last_n, -1, 1 << 30));
    s.seed = get_int(b, "seed", -1, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    if (const json* lb = field(b, "logit_bias")) {
        if (!lb->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
        for (auto it = lb->begin(); it != lb->end(); ++it) {
            char* end = nullptr;
            const long id = std::strtol(it.key().c_str(), &end, 10);
            if (it.key().empty() || *end || id < 0 || id > std::numeric_limits<int32_t>::max())
                bad("logit_bias", strfmt("logit_bias key '%s' is not a token id", it.key().c_str()));
            if (!it.value().is_number() || !std::isfinite(it.value().get<double>()))
                bad("logit_bias", "logit_bias values must be finite numbers");
            const double v = std::clamp(it.value().get<double>(), -100.0, 100.0);
            s.logit_bias.emplace_back(int32_t(id), v <= -100.0 ? -INFINITY : float(v));
        }
    }

    // max_completion_tokens is the newer spelling; n_predict is llama.cpp's.
    int64_t max_tokens = get_int(b, "max_tokens", -1, 1, std::numeric_limits<int32_t>::max());
    max_tokens = get_int(b, "max_completion_tokens", max_tokens, 1, std::numeric_limits<int32_t>::max());
    max_tokens = get_int(b, "n_predict", max_tokens, -1, std::numeric_limits<int32_t>::max());
    r.gen.max_tokens = int(max_tokens);

    if (const json* st = field(b, "stop")) {
        std::vector<std::string> stops;
        if (st->is_string()) {
            stops.push_back(st->get<std::string>());
        } else if (st->is_array()) {
            for (const json& x : *st) {
                if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
                stops.push_back(x.get<std::string>());
            }
        } else {
            bad("stop", strfmt("'stop' must be a string or an array of strings, got %s", type_name(*st)));
        }
        if (stops.size() > 16) bad("stop", "at most 16 stop strings are supported");
        for (const std::string& x : stops)
            if (x.empty()) bad("stop", "stop strings must not be empty");
        r.gen.stop = std::move(stops);
    }
    if (get_int(b, "n", 1, 1, 1) != 1) bad("n", "only n = 1 is supported");
    r.stream = get_bool(b, "stream", false);
    if (const json* so = field(b, "stream_options")) {
        if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
        r.include_usage = get_bool(*so, "include_usage", false);
    }
    r.gen.stop_at_eog = !get_bool(b, "ignore_eos", false);
    r.return_tokens = get_bool(b, "return_tokens", false);
    r.gen.reuse_cache = get_bool(b, "cache_prompt", true);
}

ToolCall parse_tool_call(const json& tc, const std::string& param) {
    if (!tc.is_object()) bad(param, param + " must be an object");
    ToolCall c;
    c.id = get_string(tc, "id", "");
    const json* fn = field(tc, "function");
    if (!fn || !fn->is_object()) bad(param, param + ".function must be an object");
    c.name = get_string(*fn, "name", "");
    if (c.name.empty()) bad(param, param + ".function.name is missing");
    const json* args = field(*fn, "arguments");
    if (!args) {
        c.arguments = "{}";
    } else if (args->is_string()) {
        c.arguments = args->get<std::string>();
        if (!json::accept(c.arguments)) bad(param, param + ".function.arguments is not valid JSON");
    } else if (args->is_object()) {
        c.arguments = args->dump();
    } else {
        bad(param, param + ".function.arguments must be a JSON string or an object");
    }
    return c;
}

}  // namespace

// ---------------------------------------------------------------- responses

std::string random_id(const char* prefix) {
    static std::atomic<uint64_t> counter{0};
    const uint64_t t = uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
    return strfmt("%s%llx%llx", prefix, (unsigned long long)(t & 0xffffffffffull), (unsigned long long)++counter);
}

const char* finish_name(const GenerateResult& r, bool tool_calls) {
    switch (r.finish_reason) {
        case FinishReason::Stop: return tool_calls ? "tool_calls" : "stop";
        case FinishReason::Length: return "length";
        case FinishReason::Cancelled: return "cancelled";
        default: return "stop";
    }
}

json usage_json(const GenerateResult& r) {
    return json{{"prompt_tokens", r.n_prompt},
                {"completion_tokens", r.n_generated},
                {"total_tokens", r.n_prompt + r.n_generated},
                {"prompt_tokens_details", {{"cached_tokens", r.n_cached}}}};
}

json timings_json(const GenerateResult& r) {
    return json{{"prompt_n", r.n_prompt - r.n_cached}, {"prompt_ms", r.prompt_ms}, {"predicted_n", r.n_generated},
                {"predicted_ms", r.gen_ms},           {"ttft_ms", r.ttft_ms}};
}

json tool_call_json(const ToolCall& c, int index, bool with_index) {
    json j = {{"id", c.id.empty() ? random_id("call_") : c.id},
              {"type", "function"},
              {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
    if (with_index) j["index"] = index;
    return j;
}

// The non-streaming response for a finished reply.
json final_reply(Reply& reply, const GenerateResult& result, bool return_tokens) {
    json choice = {{"index", 0}};
    if (reply.chat) {
        reply.parser->finish();
        const auto& calls = reply.parser->tool_calls();
        json msg = {{"role", "assistant"}};
        msg["content"] = reply.parser->content().empty() && !calls.empty() ? json(nullptr) : json(reply.parser->content());
        if (!reply.parser->reasoning().empty()) msg["reasoning_content"] = reply.parser->reasoning();
        if (!calls.empty()) {
            json tc = json::array();
            for (size_t i = 0; i < calls.size(); i++) tc.push_back(tool_call_json(calls[i], int(i), false));
            msg["tool_calls"] = tc;
        }
        choice["message"] = msg;
        choice["finish_reason"] = finish_name(result, !calls.empty());
    } else {
        choice["text"] = reply.text;
        choice["logprobs"] = nullptr;
        choice["finish_reason"] = finish_name(result, false);
    }
    if (return_tokens) choice["tokens"] = reply.tokens;
    return json{{"id", reply.id},
                {"object", reply.chat ? "chat.completion" : "text_completion"},
                {"created", reply.created},
                {"model", reply.model},
                {"choices", json::array({choice})},
                {"usage", usage_json(result)},
                {"timings", timings_json(result)}};
}

json Reply::chunk(json delta_or_text, const char* finish) const {
    json choice = {{"index", 0}};
    if (chat)
        choice["delta"] = std::move(delta_or_text);
    else
        choice["text"] = std::move(delta_or_text), choice["logprobs"] = nullptr;
    choice["finish_reason"] = finish ? json(finish) : json(nullptr);
    return json{{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})}};
}

std::vector<json> Reply::deltas(const chat::ParsedDelta& d) {
    std::vector<json> out;
    if (!d.reasoning.empty()) out.push_back(chunk(json{{"reasoning_content", d.reasoning}}, nullptr));
    if (!d.content.empty()) out.push_back(chunk(json{{"content", d.content}}, nullptr));
    for (const ToolCall& c : d.tool_calls)
        out.push_back(chunk(json{{"tool_calls", json::array({tool_call_json(c, n_tool_calls++, true)})}}, nullptr));
    return out;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(int status, const std::string& message, const std::string& param, const std::string& type) {
    json e = {{"message", message}, {"type", type.empty() ? error_type(status) : type}, {"code", status}};
    e["param"] = param.empty() ? json(nullptr) : json(param);
    return dump(json{{"error", e}});
}

ApiRequest parse_chat_request(const json& b, const SamplingParams& defaults) {
    if (!b.is_object()) bad("", "the request body must be a JSON object");
    ApiRequest r;
    r.chat = true;
    const json* msgs = field(b, "messages");
    if (!msgs) bad("messages", "'messages' is required");
    if (!msgs->is_array() || msgs->empty()) bad("messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < msgs->size(); i++) {
        const json& m = (*msgs)[i];
        const std::string p = strfmt("messages[%zu]", i);
        if (!m.is_object()) bad(p, p + " must be an object");
        ChatMessage cm;
        cm.role = get_string(m, "role", "");
        if (cm.role == "developer") cm.role = "system";
        if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "tool")
            bad(p + ".role", strfmt("%s.role must be system, user, assistant or tool, got '%s'", p.c_str(), cm.role.c_str()));
        auto it = m.find("content");
        cm.content = it == m.end() ? "" : content_text(*it, p + ".content");
        if (const json* rc = field(m, "reasoning_content")) {
            if (!rc->is_string()) bad(p + ".reasoning_content", p + ".reasoning_content must be a string");
            cm.reasoning_content = rc->get<std::string>();
        }
        if (const json* tcs = field(m, "tool_calls")) {
            if (!tcs->is_array()) bad(p + ".tool_calls", p + ".tool_calls must be an array");
            for (size_t k = 0; k < tcs->size(); k++)
                cm.tool_calls.push_back(parse_tool_call((*tcs)[k], strfmt("%s.tool_calls[%zu]", p.c_str(), k)));
        }
        cm.tool_call_id = get_string(m, "tool_call_id", "");
        cm.name = get_string(m, "name", "");
        r.gen.messages.push_back(std::move(cm));
    }
    if (const json* tools = field(b, "tools")) {
        if (!tools->is_array()) bad("tools", "'tools' must be an array");
        for (size_t i = 0; i < tools->size(); i++) {
            const json& t = (*tools)[i];
            const json* fn = t.is_object() ? field(t, "function") : nullptr;
            if (!fn || !fn->is_object() || !field(*fn, "name") || !(*fn)["name"].is_string())
                bad(strfmt("tools[%zu]", i), strfmt("tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i));
        }
        const std::string choice = field(b, "tool_choice") && b["tool_choice"].is_string() ? b["tool_choice"].get<std::string>() : "auto";
        if (!tools->empty() && choice != "none") {
            r.gen.chat.tools_json = tools->dump();
            r.has_tools = true;
        }
    }
    // Thinking: top-level enable_thinking (vLLM / Qwen docs) or chat_template_kwargs.
    r.gen.chat.enable_thinking = get_bool(b, "enable_thinking", true);
    if (const json* kw = field(b, "chat_template_kwargs")) {
        if (!kw->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
        r.gen.chat.enable_thinking = get_bool(*kw, "enable_thinking", r.gen.chat.enable_thinking);
        r.gen.chat.kwargs_json = kw->dump();
    }
    parse_sampling(b, r, defaults);
    return r;
}

ApiRequest parse_completion_request(const json& b, const SamplingParams& defaults) {
    if (!b.is_object()) bad("", "the request body must be a JSON object");
    ApiRequest r;
    const json* p = field(b, "prompt");
    if (!p) bad("prompt", "'prompt' is required");
    auto ids_from = [&](const json& arr) {
        std::vector<int32_t> ids;
        for (const json& x : arr) {
            if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > std::numeric_limits<int32_t>::max())
                bad("prompt", "token id prompts must be arrays of non-negative integers");
            ids.push_back(int32_t(x.get<int64_t>()));
        }
        return ids;
    };
    if (p->is_string()) {
        r.gen.prompt = p->get<std::string>();
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
        r.gen.prompt_ids = ids_from(*p);
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
        r.gen.prompt = (*p)[0].get<std::string>();
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) {
        r.gen.prompt_ids = ids_from((*p)[0]);
    } else if (p->is_array() && p->size() > 1) {
        bad("prompt", "only one prompt per request is supported");
    } else {
        bad("prompt", "'prompt' must be a string, an array of token ids, or an array with one of them");
    }
    if (r.gen.prompt.empty() && r.gen.prompt_ids.empty()) bad("prompt", "'prompt' is empty");
    parse_sampling(b, r, defaults);
    return r;
}

}  // namespace qinfer::server
