// Chat messages as the engine, the CLI and the server exchange them
// (OpenAI-style; spec/chat.md §7).
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace qinfer {

struct ToolCall {
    std::string id;         // optional, e.g. "call_0"
    std::string name;
    std::string arguments;  // JSON text (usually an object)
};

struct ChatMessage {
    ChatMessage() = default;
    ChatMessage(std::string role_, std::string content_) : role(std::move(role_)), content(std::move(content_)) {}

    std::string role;  // system, user, assistant, tool (developer is treated as system)
    std::string content;
    std::optional<std::string> reasoning_content;  // assistant only; nullopt = not given
    std::vector<ToolCall> tool_calls;              // assistant only
    std::string tool_call_id;                      // tool only (not rendered by Qwen templates)
    std::string name;                              // optional
};

struct ChatOptions {
    bool add_generation_prompt = true;
    bool enable_thinking = true;
    std::string tools_json;   // JSON array of OpenAI tool objects; empty = no tools
    std::string kwargs_json;  // extra template variables as a JSON object (chat_template_kwargs)
};

}  // namespace qinfer
