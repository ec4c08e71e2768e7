// The chat template of a model: which renderer turns messages into a prompt.
//
// Default: the built-in ChatML renderer (chat/chatml.h) in the flavour the
// GGUF's tokenizer.chat_template implies (Qwen3.5 XML tool calls, or the
// Qwen2.5/Qwen3 JSON format); without a template the architecture decides.
// With `use_jinja`, or when the user supplies a template text, the Jinja
// subset (chat/jinja.h) runs the template itself, as llama.cpp --jinja does.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "chat/chatml.h"
#include "chat/pytext.h"
#include "qinfer/chat.h"

namespace qinfer::gguf {
class File;
}

namespace qinfer::chat {

namespace jinja {
class Template;
}

class ChatTemplate {
public:
    // `override_source`: a template text replacing the file's (always run
    // through Jinja; a syntax error is an Error). `use_jinja`: run the file's
    // own template; if it does not parse, fall back to the built-in renderer
    // and record why in warning().
    static ChatTemplate from_gguf(const gguf::File& f, const std::string& override_source = "",
                                  bool use_jinja = false);
    static ChatTemplate builtin(Flavor flavor);
    static ChatTemplate jinja(const std::string& source, Flavor flavor = Flavor::Qwen3);

    std::string render(const std::vector<ChatMessage>& messages, const ChatOptions& opt) const;
    // Whether a generation prompt rendered with `opt` ends inside <think>.
    bool starts_in_reasoning(const ChatOptions& opt) const;

    Flavor flavor() const { return flavor_; }
    bool uses_jinja() const { return jinja_ != nullptr; }
    const std::string& source() const { return source_; }
    const std::string& warning() const { return warning_; }
    std::string description() const;

private:
    Flavor flavor_ = Flavor::Qwen3;
    std::string source_;
    std::string warning_;
    std::string bos_, eos_;
    bool object_arguments_ = false;  // template iterates tool_call.arguments|items
    std::shared_ptr<const jinja::Template> jinja_;
};

// Flavour implied by a Jinja template's text.
Flavor detect_flavor(const std::string& source, Flavor fallback);

// The variables a chat template receives (spec/chat.md §3, §7).
ojson template_context(const std::vector<ChatMessage>& messages, const ChatOptions& opt, bool object_arguments,
                       const std::string& bos_token, const std::string& eos_token);

}  // namespace qinfer::chat
