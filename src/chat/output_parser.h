// Splits a model's chat reply into reasoning, content and tool calls
// (spec/chat.md §6), incrementally: push() the streamed text as it comes and
// get back only what is certain -- text that could still turn into
// <think>, </think>, <tool_call> is held until the next piece decides.
//
//   <think>\nREASONING\n</think>\n\nCONTENT<tool_call>\n{...}\n</tool_call>
//
// Reasoning is trimmed of surrounding newlines; leading newlines after
// </think> and whitespace before a tool call are dropped. Tool calls are
// accepted in both formats: Qwen3 JSON ({"name": ..., "arguments": {...}})
// and Qwen3.5 XML (<function=NAME><parameter=KEY>VALUE</parameter>...).
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qinfer/chat.h"

namespace qinfer::chat {

struct ParsedDelta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> tool_calls;  // completed calls (arguments as compact JSON)
    bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class OutputParser {
public:
    struct Options {
        bool start_in_reasoning = false;  // the prompt ended in "<think>\n" (Qwen3.5 thinking mode)
        bool parse_reasoning = true;      // false: <think> blocks stay in the content
        bool parse_tool_calls = true;
        bool xml_tool_calls = false;      // Qwen3.5: <tool_call> also ends reasoning
        // OpenAI tools (JSON array): XML parameters whose schema type is
        // "string" are taken verbatim, others are parsed as JSON when they can be.
        std::string tools_json;
    };

    explicit OutputParser(Options opt);

    ParsedDelta push(std::string_view text);
    // End of the reply: releases held text, parses an unterminated tool call
    // if it is complete enough, otherwise returns it as content.
    ParsedDelta finish();

    // Everything parsed so far.
    const std::string& reasoning() const { return reasoning_; }
    const std::string& content() const { return content_; }
    const std::vector<ToolCall>& tool_calls() const { return calls_; }

private:
    enum class Mode { Start, Reasoning, Content, ToolCall };
    void run(bool final, ParsedDelta& d);
    void add_reasoning(std::string s, ParsedDelta& d);
    void add_content(std::string s, ParsedDelta& d);
    bool parse_call(const std::string& block, ToolCall& out) const;
    bool string_param(const std::string& fn, const std::string& param) const;

    Options opt_;
    std::vector<std::pair<std::string, std::string>> string_params_;  // (function, parameter)
    Mode mode_;
    std::string buf_;
    std::string ws_;             // held whitespace (may be dropped before a tag)
    std::string pre_call_ws_;    // whitespace dropped before the current <tool_call>
    bool strip_newlines_ = true; // drop "\n" at the start of the current part
    std::string reasoning_, content_;
    std::vector<ToolCall> calls_;
};

// Whole-text convenience.
ParsedDelta parse_output(std::string_view text, const OutputParser::Options& opt);

}  // namespace qinfer::chat
