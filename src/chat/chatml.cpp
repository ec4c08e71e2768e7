#include "chat/chatml.h"

#include "chat/pytext.h"
#include "common/error.h"

namespace qinfer::chat {

namespace {

// Tool preambles: these bytes must equal the published templates' text
// (tests compare against renders of the real templates).
const char* const kQwen3ToolsHead =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
const char* const kQwen3ToolsTail =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
const char* const kQwen35ToolsHead = "# Tools\n\nYou have access to the following functions:\n\n<tools>";
const char* const kQwen35ToolsTail =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is no "
    "function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>";

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
    return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
bool is_tool_response(const std::string& s) {
    return starts_with(s, "<tool_response>") && ends_with(s, "</tool_response>");
}

std::vector<ojson> parse_tools(const std::string& tools_json) {
    std::vector<ojson> tools;
    if (tools_json.empty()) return tools;
    ojson t;
    try {
        t = ojson::parse(tools_json);
    } catch (const std::exception& e) {
        fail(strfmt("chat: tools are not valid JSON: %s", e.what()));
    }
    if (!t.is_array()) fail("chat: tools must be a JSON array");
    for (auto& x : t) tools.push_back(x);
    return tools;
}

// "</think>" in the content splits it into reasoning and answer (both templates).
void split_think(std::string& content, std::string& reasoning) {
    const size_t first = content.find("</think>");
    if (first == std::string::npos) return;
    std::string before = py_rstrip(content.substr(0, first), "\n");
    const size_t open = before.rfind("<think>");
    if (open != std::string::npos) before = before.substr(open + 7);
    reasoning = py_lstrip(before, "\n");
    content = py_lstrip(content.substr(content.rfind("</think>") + 8), "\n");
}

std::string qwen3_tool_call(const ToolCall& tc) {
    // Arguments are a string in our messages: the template emits strings verbatim.
    return "<tool_call>\n{\"name\": \"" + tc.name + "\", \"arguments\": " + tc.arguments + "}\n</tool_call>";
}

std::string qwen35_tool_call(const ToolCall& tc) {
    std::string out = "<tool_call>\n<function=" + tc.name + ">\n";
    if (!tc.arguments.empty()) {
        ojson args;
        try {
            args = ojson::parse(tc.arguments);
        } catch (const std::exception&) {
            fail(strfmt("chat: failed to parse tool call arguments as JSON (tool '%s')", tc.name.c_str()));
        }
        if (!args.is_object())
            fail(strfmt("chat: tool call arguments must be a JSON object (tool '%s')", tc.name.c_str()));
        for (auto it = args.begin(); it != args.end(); ++it) {
            const ojson& v = it.value();
            out += "<parameter=" + it.key() + ">\n";
            out += (v.is_object() || v.is_array()) ? py_json(v) : py_str(v);
            out += "\n</parameter>\n";
        }
    }
    return out + "</function>\n</tool_call>";
}

std::string render_qwen3(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
    const std::vector<ojson> tools = parse_tools(opt.tools_json);
    const bool first_is_system = !msgs.empty() && msgs[0].role == "system";
    std::string out;
    if (!tools.empty()) {
        out += "<|im_start|>system\n";
        if (first_is_system) out += msgs[0].content + "\n\n";
        out += kQwen3ToolsHead;
        for (const ojson& t : tools) {
            out += '\n';
            out += py_json(t);
        }
        out += kQwen3ToolsTail;
    } else if (first_is_system) {
        out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
    }

    const long n = long(msgs.size());
    long last_query = n - 1;
    for (long i = n - 1; i >= 0; i--) {
        if (msgs[size_t(i)].role == "user" && !is_tool_response(msgs[size_t(i)].content)) {
            last_query = i;
            break;
        }
    }

    for (long i = 0; i < n; i++) {
        const ChatMessage& m = msgs[size_t(i)];
        const bool last = i == n - 1;
        if (m.role == "user" || (m.role == "system" && i != 0)) {
            out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
        } else if (m.role == "assistant") {
            std::string content = m.content, reasoning;
            if (m.reasoning_content)
                reasoning = *m.reasoning_content;
            else
                split_think(content, reasoning);
            if (i > last_query && (last || !reasoning.empty()))
                out += "<|im_start|>assistant\n<think>\n" + py_strip(reasoning, "\n") + "\n</think>\n\n" +
                       py_lstrip(content, "\n");
            else
                out += "<|im_start|>assistant\n" + content;
            for (size_t k = 0; k < m.tool_calls.size(); k++) {
                if (k > 0 || !content.empty()) out += "\n";
                out += qwen3_tool_call(m.tool_calls[k]);
            }
            out += "<|im_end|>\n";
        } else if (m.role == "tool") {
            if (i == 0 || msgs[size_t(i - 1)].role != "tool") out += "<|im_start|>user";
            out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
            if (last || msgs[size_t(i + 1)].role != "tool") out += "<|im_end|>\n";
        }
        // Any other role is silently skipped, as by the template.
    }
    if (opt.add_generation_prompt) {
        out += "<|im_start|>assistant\n";
        if (!opt.enable_thinking) out += "<think>\n\n</think>\n\n";
    }
    return out;
}

std::string render_qwen35(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
    if (msgs.empty()) fail("chat: no messages provided");
    const std::vector<ojson> tools = parse_tools(opt.tools_json);
    std::string out;
    if (!tools.empty()) {
        out += "<|im_start|>system\n";
        out += kQwen35ToolsHead;
        for (const ojson& t : tools) {
            out += '\n';
            out += py_json(t);
        }
        out += kQwen35ToolsTail;
        if (msgs[0].role == "system") {
            const std::string c = py_strip(msgs[0].content);
            if (!c.empty()) {
                out += "\n\n";
                out += c;
            }
        }
        out += "<|im_end|>\n";
    } else if (msgs[0].role == "system") {
        out += "<|im_start|>system\n" + py_strip(msgs[0].content) + "<|im_end|>\n";
    }

    const long n = long(msgs.size());
    long last_query = -1;
    for (long i = n - 1; i >= 0; i--) {
        if (msgs[size_t(i)].role == "user" && !is_tool_response(py_strip(msgs[size_t(i)].content))) {
            last_query = i;
            break;
        }
    }
    if (last_query < 0) fail("chat: no user query found in messages");

    for (long i = 0; i < n; i++) {
        const ChatMessage& m = msgs[size_t(i)];
        std::string content = py_strip(m.content);
        if (m.role == "system") {
            if (i != 0) fail("chat: system message must be at the beginning");
        } else if (m.role == "user") {
            out += "<|im_start|>user\n" + content + "<|im_end|>\n";
        } else if (m.role == "assistant") {
            std::string reasoning;
            if (m.reasoning_content)
                reasoning = *m.reasoning_content;
            else
                split_think(content, reasoning);
            reasoning = py_strip(reasoning);
            if (i > last_query)
                out += "<|im_start|>assistant\n<think>\n" + reasoning + "\n</think>\n\n" + content;
            else
                out += "<|im_start|>assistant\n" + content;
            for (size_t k = 0; k < m.tool_calls.size(); k++) {
                if (k > 0)
                    out += "\n";
                else if (!py_strip(content).empty())
                    out += "\n\n";
                out += qwen35_tool_call(m.tool_calls[k]);
            }
            out += "<|im_end|>\n";
        } else if (m.role == "tool") {
            if (i > 0 && msgs[size_t(i - 1)].role != "tool") out += "<|im_start|>user";
            out += "\n<tool_response>\n" + content + "\n</tool_response>";
            if (i == n - 1 || msgs[size_t(i + 1)].role != "tool") out += "<|im_end|>\n";
        } else {
            fail(strfmt("chat: unexpected message role '%s'", m.role.c_str()));
        }
    }
    if (opt.add_generation_prompt)
        out += opt.enable_thinking ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    return out;
}

}  // namespace

std::string render_chatml(const std::vector<ChatMessage>& messages, const ChatOptions& opt, Flavor flavor) {
    // OpenAI's "developer" role is the system role for these templates.
    std::vector<ChatMessage> msgs = messages;
    for (ChatMessage& m : msgs)
        if (m.role == "developer") m.role = "system";
    return flavor == Flavor::Qwen35 ? render_qwen35(msgs, opt) : render_qwen3(msgs, opt);
}

bool generation_starts_in_reasoning(const std::string& p) {
    return ends_with(p, "<think>\n") || ends_with(p, "<think>");
}

}  // namespace qinfer::chat
