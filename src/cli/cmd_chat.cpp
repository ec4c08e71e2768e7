// `qinfer chat -m MODEL`: interactive multi-turn chat on stdin/stdout.
// Each line is a user message; the conversation is kept and re-rendered with
// the chat template every turn (the slot's state is reused when the new
// prompt extends it). Commands: /exit, /quit, /reset, /help.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "chat/template.h"
#include "cli/commands.h"
#include "cli/run_options.h"
#include "common/error.h"
#include "common/platform.h"

namespace qinfer::cli {

namespace {

void print(std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
}

}  // namespace

int cmd_chat(int argc, char** argv) {
    CLI::App app{"Interactive chat with the model's chat template", "qinfer chat"};
    ModelFlags mf;
    SamplingFlags sf;
    std::string system_prompt;
    int n_predict = -1;
    bool no_think = false, hide_reasoning = false, timings = false;
    mf.add(app);
    sf.add(app);
    app.add_option("--system-prompt", system_prompt, "system message (-sys)");
    app.add_option("-n,--n-predict", n_predict, "max tokens per reply (-1 = until end of turn)");
    app.add_flag("--no-think", no_think, "disable thinking (empty <think></think>)");
    app.add_flag("--hide-reasoning", hide_reasoning, "do not print the reasoning");
    app.add_flag("--timings", timings, "print a timing line to stderr after each reply");
    if (const int rc = parse_llama_style(app, argc, argv); rc >= 0) return rc;

    auto engine = Engine::load(mf.model, mf.engine_options());
    const SamplingParams sampling = sf.resolve(engine->default_sampling());
    if (!engine->chat_template().warning().empty())
        std::fprintf(stderr, "warning: %s\n", engine->chat_template().warning().c_str());
    const bool tty_in = stdin_is_terminal(), tty_out = stdout_is_terminal();
    if (tty_in)
        std::fprintf(stderr, "%s loaded (%s, %s). Type a message; /exit quits, /reset starts over.\n",
                     engine->info().name.c_str(), engine->info().backend.c_str(),
                     engine->chat_template().description().c_str());

    std::vector<ChatMessage> history;
    if (!system_prompt.empty()) history.push_back({"system", process_escapes(system_prompt)});
    const size_t n_fixed = history.size();

    std::string line;
    for (;;) {
        if (tty_in) print("> ");
        if (!read_stdin_line(line)) break;  // UTF-16 console input on Windows
        if (line.empty()) continue;
        if (line == "/exit" || line == "/quit") break;
        if (line == "/reset") {
            history.resize(n_fixed);
            print("(conversation cleared)\n");
            continue;
        }
        if (line == "/help") {
            print("/exit or /quit: leave; /reset: forget the conversation\n");
            continue;
        }

        history.push_back({"user", line});
        GenerateRequest req;
        req.messages = history;
        req.chat.enable_thinking = !no_think;
        req.sampling = sampling;
        req.max_tokens = n_predict;

        chat::OutputParser::Options po;
        po.start_in_reasoning = engine->chat_starts_in_reasoning(req.chat);
        po.xml_tool_calls = engine->chat_template().flavor() == chat::Flavor::Qwen35;
        chat::OutputParser parser(po);
        bool in_reasoning = false;
        auto show = [&](const chat::ParsedDelta& d) {
            if (!d.reasoning.empty() && !hide_reasoning) {
                if (!in_reasoning) print(tty_out ? "\x1b[2m[thinking] " : "[thinking] ");
                in_reasoning = true;
                print(d.reasoning);
            }
            if (!d.content.empty() || !d.tool_calls.empty()) {
                if (in_reasoning) print(tty_out ? "\x1b[0m\n" : "\n");
                in_reasoning = false;
                print(d.content);
                for (const ToolCall& tc : d.tool_calls) print("[tool call] " + tc.name + " " + tc.arguments + "\n");
            }
        };
        GenerateCallbacks cb;
        cb.on_token = [&](int32_t, std::string_view piece) {
            show(parser.push(piece));
            return true;
        };
        GenerateResult r;
        try {
            r = engine->generate(req, cb);
        } catch (const Error& e) {
            // A turn that cannot run (e.g. the conversation outgrew the
            // context) is reported; the session goes on.
            history.pop_back();
            std::fprintf(stderr, "error: %s\n", e.what());
            continue;
        }
        show(parser.finish());
        if (in_reasoning) print(tty_out ? "\x1b[0m" : "");
        print("\n");
        if (timings) std::fprintf(stderr, "%s\n", timing_line(engine->load_ms(), r).c_str());

        ChatMessage reply("assistant", parser.content());
        if (!parser.reasoning().empty()) reply.reasoning_content = parser.reasoning();
        reply.tool_calls = parser.tool_calls();
        history.push_back(reply);
    }
    return 0;
}

}  // namespace qinfer::cli
