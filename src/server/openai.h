// OpenAI request parsing and response shapes (chat completions, completions).
//
// Parsing is strict about what it reads -- wrong types, out-of-range or
// non-finite numbers are an ApiError naming the field -- and ignores fields it
// does not know, as OpenAI-compatible servers do.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD): model
// output is arbitrary bytes until the detokenizer proves otherwise.
std::string dump(const json& j);

}  // namespace qinfer::server
