#include "chat/template.h"

#include "chat/jinja.h"
#include "common/error.h"
#include "gguf/gguf.h"

namespace qinfer::chat {

Flavor detect_flavor(const std::string& src, Flavor fallback) {
    if (src.empty()) return fallback;
    // The Qwen3.5 family renders tool calls as <function=NAME> blocks and ends
    // thinking-mode generation prompts with an open <think>.
    if (src.find("<function=") != std::string::npos) return Flavor::Qwen35;
    if (src.find("<|im_start|>") != std::string::npos) return Flavor::Qwen3;
    return fallback;
}

namespace {

bool wants_object_arguments(const std::string& src) {
    return src.find("arguments|items") != std::string::npos || src.find("arguments | items") != std::string::npos;
}

std::string token_text(const gguf::File& f, const char* id_key) {
    const auto* tokens = f.get_string_array("tokenizer.ggml.tokens");
    const auto id = f.get_uint(id_key);
    if (!tokens || !id || *id >= tokens->size()) return "";
    return std::string((*tokens)[*id]);
}

}  // namespace

ChatTemplate ChatTemplate::builtin(Flavor flavor) {
    ChatTemplate t;
    t.flavor_ = flavor;
    return t;
}

ChatTemplate ChatTemplate::jinja(const std::string& source, Flavor flavor) {
    ChatTemplate t;
    t.source_ = source;
    t.flavor_ = detect_flavor(source, flavor);
    t.object_arguments_ = wants_object_arguments(source);
    t.jinja_ = std::make_shared<const jinja::Template>(source);
    t.bos_ = "<|endoftext|>";
    t.eos_ = "<|im_end|>";
    return t;
}

ChatTemplate ChatTemplate::from_gguf(const gguf::File& f, const std::string& override_source, bool use_jinja) {
    const std::string arch(f.get_string("general.architecture").value_or(""));
    const Flavor arch_flavor = arch == "qwen35" || arch == "qwen35moe" ? Flavor::Qwen35 : Flavor::Qwen3;
    const std::string file_src(f.get_string("tokenizer.chat_template").value_or(""));
    ChatTemplate t;
    if (!override_source.empty()) {
        t = jinja(override_source, arch_flavor);
    } else if (use_jinja && !file_src.empty()) {
        try {
            t = jinja(file_src, arch_flavor);
        } catch (const Error& e) {
            t = builtin(detect_flavor(file_src, arch_flavor));
            t.source_ = file_src;
            t.warning_ = std::string("the model's chat template cannot be used, falling back to built-in ChatML: ") + e.what();
        }
    } else {
        t = builtin(detect_flavor(file_src, arch_flavor));
        t.source_ = file_src;
    }
    const std::string bos = token_text(f, "tokenizer.ggml.bos_token_id"), eos = token_text(f, "tokenizer.ggml.eos_token_id");
    if (!bos.empty()) t.bos_ = bos;
    if (!eos.empty()) t.eos_ = eos;
    return t;
}

ojson template_context(const std::vector<ChatMessage>& messages, const ChatOptions& opt, bool object_arguments,
                       const std::string& bos_token, const std::string& eos_token) {
    ojson msgs = ojson::array();
    for (const ChatMessage& m : messages) {
        ojson j = ojson::object();
        j["role"] = m.role == "developer" ? std::string("system") : m.role;
        j["content"] = m.content;
        if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
        if (!m.tool_calls.empty()) {
            ojson calls = ojson::array();
            for (const ToolCall& tc : m.tool_calls) {
                ojson c = ojson::object();
                c["type"] = "function";
                if (!tc.id.empty()) c["id"] = tc.id;
                ojson fn = ojson::object();
                fn["name"] = tc.name;
                if (object_arguments) {
                    try {
                        fn["arguments"] = tc.arguments.empty() ? ojson::object() : ojson::parse(tc.arguments);
                    } catch (const std::exception&) {
                        fail(strfmt("chat: failed to parse tool call arguments as JSON (tool '%s')", tc.name.c_str()));
                    }
                } else {
                    fn["arguments"] = tc.arguments;
                }
                c["function"] = fn;
                calls.push_back(c);
            }
            j["tool_calls"] = calls;
        }
        if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
        if (!m.name.empty()) j["name"] = m.name;
        msgs.push_back(j);
    }
    ojson ctx = ojson::object();
    ctx["messages"] = msgs;
    if (!opt.tools_json.empty()) {
        ojson tools;
        try {
            tools = ojson::parse(opt.tools_json);
        } catch (const std::exception& e) {
            fail(strfmt("chat: tools are not valid JSON: %s", e.what()));
        }
        if (!tools.is_array()) fail("chat: tools must be a JSON array");
        if (!tools.empty()) ctx["tools"] = tools;  // only defined when non-empty (llama.cpp)
    }
    ctx["add_generation_prompt"] = opt.add_generation_prompt;
    ctx["enable_thinking"] = opt.enable_thinking;
    ctx["bos_token"] = bos_token;
    ctx["eos_token"] = eos_token;
    if (!opt.kwargs_json.empty()) {
        ojson kw;
        try {
            kw = ojson::parse(opt.kwargs_json);
        } catch (const std::exception& e) {
            fail(strfmt("chat: chat_template_kwargs are not valid JSON: %s", e.what()));
        }
        if (!kw.is_object()) fail("chat: chat_template_kwargs must be a JSON object");
        for (auto it = kw.begin(); it != kw.end(); ++it) ctx[it.key()] = it.value();
    }
    return ctx;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatOptions& opt) const {
    if (!jinja_) return render_chatml(messages, opt, flavor_);
    return jinja_->render(template_context(messages, opt, object_arguments_, bos_, eos_));
}

bool ChatTemplate::starts_in_reasoning(const ChatOptions& opt) const {
    if (!opt.add_generation_prompt) return false;
    ChatOptions o = opt;
    o.tools_json.clear();
    try {
        return generation_starts_in_reasoning(render({ChatMessage("user", "x")}, o));
    } catch (const Error&) {
        return false;
    }
}

std::string ChatTemplate::description() const {
    if (jinja_) return "Jinja chat template";
    return flavor_ == Flavor::Qwen35 ? "ChatML (Qwen3.5)" : "ChatML (Qwen3)";
}

}  // namespace qinfer::chat
