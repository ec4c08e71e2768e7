#include "chat/template.h"

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

ChatTemplate ChatTemplate::builtin(Flavor flavor) {
    ChatTemplate t;
    t.flavor_ = flavor;
    return t;
}

ChatTemplate ChatTemplate::from_gguf(const gguf::File& f, const std::string& override_source) {
    const std::string arch(f.get_string("general.architecture").value_or(""));
    const Flavor arch_flavor = arch == "qwen35" || arch == "qwen35moe" ? Flavor::Qwen35 : Flavor::Qwen3;
    ChatTemplate t;
    t.source_ = !override_source.empty() ? override_source
                                         : std::string(f.get_string("tokenizer.chat_template").value_or(""));
    t.flavor_ = detect_flavor(t.source_, arch_flavor);
    return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatOptions& opt) const {
    return render_chatml(messages, opt, flavor_);
}

bool ChatTemplate::starts_in_reasoning(const ChatOptions& opt) const {
    if (!opt.add_generation_prompt || !opt.enable_thinking) return false;
    ChatMessage probe;
    probe.role = "user";
    probe.content = "x";
    ChatOptions o = opt;
    o.tools_json.clear();
    return generation_starts_in_reasoning(render({probe}, o));
}

std::string ChatTemplate::description() const {
    return std::string(flavor_ == Flavor::Qwen35 ? "ChatML (Qwen3.5)" : "ChatML (Qwen3)");
}

}  // namespace qinfer::chat
