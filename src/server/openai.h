// OpenAI request parsing and response shapes (chat completions, completions).
//
// Parsing is strict about what it reads -- wrong types, out-of-range or
// non-finite numbers are an ApiError naming the field -- and ignores fields it
// does not know, as OpenAI-compatible servers do.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/output_parser.h"

#include "common/error.h"
#include "qinfer/engine.h"

namespace qinfer::server {

using json = nlohmann::json;

// A request the server answers with an OpenAI-style error object.
class ApiError : public Error {
public:
    ApiError(int status, std::string message, std::string param = "", std::string type = "")
        : Error(std::move(message)), status(status), param(std::move(param)), type(std::move(type)) {}
    int status;
    std::string param;
    std::string type;  // empty: derived from the status
};

// {"error": {"message", "type", "param", "code"}}
std::string error_body(int status, const std::string& message, const std::string& param = "",
                       const std::string& type = "");

struct ApiRequest {
    GenerateRequest gen;        // prompt source, chat options, sampling, limits
    bool chat = false;          // /v1/chat/completions
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
    bool has_tools = false;
    bool return_tokens = false;  // extension: generated ids in the response
};

// The body must be a JSON object. `defaults`: the model's sampling settings.
ApiRequest parse_chat_request(const json& body, const SamplingParams& defaults);
ApiRequest parse_completion_request(const json& body, const SamplingParams& defaults);

// ---------------------------------------------------------------- responses

std::string random_id(const char* prefix);  // "chatcmpl-..." / "cmpl-..." / "call_..."
// "stop", "length", "tool_calls" (a stop with parsed tool calls), "cancelled".
const char* finish_name(const GenerateResult& r, bool tool_calls);
json usage_json(const GenerateResult& r);    // OpenAI usage + prompt_tokens_details.cached_tokens
json timings_json(const GenerateResult& r);  // prompt_n (processed), prompt_ms, predicted_n, ...
json tool_call_json(const ToolCall& c, int index, bool with_index);

// One response in the making: the parsed reply so far and the envelope.
struct Reply {
    bool chat = false;
    std::string id, model;
    int64_t created = 0;
    std::unique_ptr<chat::OutputParser> parser;  // chat only: reasoning / content / tool calls
    std::string text;                            // completions
    std::vector<int32_t> tokens;
    int n_tool_calls = 0;

    // A streaming chunk: `delta_or_text` is the chat delta object or the completion text.
    json chunk(json delta_or_text, const char* finish) const;
    // The streamed chunks one parsed piece of model output turns into.
    std::vector<json> deltas(const chat::ParsedDelta& d);
};

// The non-streaming response for a finished reply (runs the parser's finish()).
json final_reply(Reply& reply, const GenerateResult& result, bool return_tokens);

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD): model
// output is arbitrary bytes until the detokenizer proves otherwise.
std::string dump(const json& j);

}  // namespace qinfer::server
