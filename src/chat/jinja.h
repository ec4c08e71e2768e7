// A Jinja2 subset, enough to run the chat templates shipped in GGUF files
// (spec/chat.md §8) the way HF transformers does: trim_blocks and
// lstrip_blocks on, undefined values falsy and printing as "", tojson =
// json.dumps(ensure_ascii=False), Python spellings for str().
//
// Statements: if/elif/else, for (tuple targets, loop.*, else, inline if
// filter, break/continue), set (incl. namespace attributes and set blocks),
// macro with defaults, generation blocks (rendered as plain content).
// Expressions: literals, list/dict/tuple, attribute/index/slice, calls,
// filters, tests, arithmetic, ~, comparisons, and/or/not, in/not in,
// inline if/else. Anything else is a parse error naming the line.
#pragma once
#include <memory>
#include <string>

#include "chat/pytext.h"

namespace qinfer::chat::jinja {

struct Program;

class Template {
public:
    // Throws qinfer::Error "chat template: line N: ..." on a syntax error.
    explicit Template(const std::string& source);
    ~Template();
    Template(Template&&) noexcept;
    Template& operator=(Template&&) noexcept;

    // `context` is a JSON object of variables. raise_exception(msg) in the
    // template throws qinfer::Error with msg.
    std::string render(const ojson& context) const;

private:
    std::unique_ptr<Program> prog_;
};

}  // namespace qinfer::chat::jinja
