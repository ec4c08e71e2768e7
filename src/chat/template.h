// The chat template of a model: which renderer turns messages into a prompt.
//
// The GGUF's tokenizer.chat_template (or a user-supplied override) decides the
// flavour: the Qwen3.5 XML tool-call format or the Qwen2.5/Qwen3 JSON one.
// Without a template the architecture decides (qwen35 -> Qwen3.5, else
// Qwen3), falling back to plain ChatML as llama.cpp does.
#pragma once
#include <string>
#include <vector>

#include "chat/chatml.h"
#include "qinfer/chat.h"

namespace qinfer::gguf {
class File;
}

namespace qinfer::chat {

class ChatTemplate {
public:
    // `override_source`: a template text that replaces the file's (may be empty).
    static ChatTemplate from_gguf(const gguf::File& f, const std::string& override_source = "");
    static ChatTemplate builtin(Flavor flavor);

    std::string render(const std::vector<ChatMessage>& messages, const ChatOptions& opt) const;
    // Whether a generation prompt rendered with `opt` ends inside <think>.
    bool starts_in_reasoning(const ChatOptions& opt) const;

    Flavor flavor() const { return flavor_; }
    const std::string& source() const { return source_; }  // empty for built-in
    std::string description() const;

private:
    Flavor flavor_ = Flavor::Qwen3;
    std::string source_;
};

// Flavour implied by a Jinja template's text.
Flavor detect_flavor(const std::string& source, Flavor fallback);

}  // namespace qinfer::chat
