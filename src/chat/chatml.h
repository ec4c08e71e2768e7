// Built-in ChatML renderer reproducing the Qwen3 and Qwen3.5 chat templates
// byte for byte (spec/chat.md §4, §5): system/tools header, last-query
// index, reasoning kept only after the last real user query, tool calls
// (JSON for Qwen3, XML function format for Qwen3.5), grouped tool results and
// the generation prompt with or without thinking.
#pragma once
#include <string>
#include <vector>

#include "qinfer/chat.h"

namespace qinfer::chat {

enum class Flavor {
    Qwen3,   // Qwen2.5 / Qwen3 / QwQ style: JSON tool calls, no trimming
    Qwen35,  // Qwen3.5 / 3.6: trimmed contents, XML tool calls, "<think>\n" prompt
};

// Throws qinfer::Error for inputs the real template rejects (Qwen3.5: no
// messages, no user query, system message not first, unknown role) and for
// malformed tools_json or tool-call arguments.
std::string render_chatml(const std::vector<ChatMessage>& messages, const ChatOptions& opt, Flavor flavor);

// The text the model emits first in its reply given these options: Qwen3.5
// generation prompts end inside the reasoning block ("<think>\n"), so the
// output parser must start in reasoning state.
bool generation_starts_in_reasoning(const std::string& rendered_prompt);

}  // namespace qinfer::chat
