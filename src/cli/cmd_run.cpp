// `qinfer run -m MODEL -p PROMPT [llama-cli flags]`: one generation, streamed
// to stdout; timings on stderr. `--ids 1,2,3 --print-ids` is the
// machine-readable form: the generated ids on one stdout line, nothing else.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/run_options.h"
#include "common/error.h"

namespace qinfer::cli {

int cmd_run(int argc, char** argv) {
    CLI::App app{"Generate text from a prompt (llama-cli style flags)", "qinfer run"};
    ModelFlags mf;
    SamplingFlags sf;
    std::string prompt, prompt_file, system_prompt, ids_str;
    int n_predict = -1;
    bool chat = false, no_think = false, print_ids = false, ignore_eos = false, special = false;
    bool no_escape = false, verbose_prompt = false;
    std::vector<std::string> stops;
    mf.add(app);
    sf.add(app);
    app.add_option("-p,--prompt", prompt, "prompt text");
    app.add_option("-f,--file", prompt_file, "read the prompt from a file");
    app.add_option("--ids", ids_str, "prompt as token ids (comma-separated) instead of text");
    app.add_option("-n,--n-predict", n_predict, "tokens to generate (-1 = until end of generation or context full)");
    app.add_option("-r,--reverse-prompt,--stop", stops, "stop when this text is generated (repeatable)");
    app.add_flag("--chat", chat, "wrap the prompt in the model's chat template as a user message");
    app.add_option("--system-prompt", system_prompt, "system message for --chat (-sys)");
    app.add_flag("--no-think", no_think, "--chat: disable thinking (empty <think></think>)");
    app.add_flag("--print-ids", print_ids, "print the generated token ids on one line instead of text");
    app.add_flag("--ignore-eos", ignore_eos, "keep generating after end-of-generation tokens");
    app.add_flag("--special", special, "print control tokens (<|im_end|> ...)");
    app.add_flag("--no-escape", no_escape, "do not process \\n, \\t ... in the prompt");
    app.add_flag("--verbose-prompt", verbose_prompt, "print the prompt's token ids to stderr");
    if (const int rc = parse_llama_style(app, argc, argv); rc >= 0) return rc;

    const int n_sources = !prompt.empty() + !prompt_file.empty() + !ids_str.empty();
    if (n_sources == 0) fail("no prompt: give -p TEXT, -f FILE or --ids 1,2,3");
    if (n_sources > 1) fail("give only one of -p, -f and --ids");
    if (chat && !ids_str.empty()) fail("--chat needs a text prompt (-p or -f), not --ids");

    GenerateRequest req;
    if (!ids_str.empty()) {
        req.prompt_ids = parse_id_list(ids_str);
    } else {
        std::string text = !prompt_file.empty() ? read_file_text(prompt_file) : prompt;
        if (!no_escape && prompt_file.empty()) text = process_escapes(text);
        if (chat) {
            if (!system_prompt.empty()) req.messages.push_back({"system", process_escapes(system_prompt)});
            req.messages.push_back({"user", text});
            req.chat.enable_thinking = !no_think;
        } else {
            req.prompt = text;
        }
    }

    auto engine = Engine::load(mf.model, mf.engine_options());
    req.sampling = sf.resolve(engine->default_sampling());
    req.max_tokens = n_predict;
    req.stop = stops;
    req.stop_at_eog = !ignore_eos;
    req.show_special = special;

    GenerateCallbacks cb;
    if (verbose_prompt) {
        cb.on_prompt_tokens = [](std::vector<int32_t>& ids) {
            std::string s;
            for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
            std::fprintf(stderr, "prompt ids (%zu): %s\n", ids.size(), s.c_str());
        };
    }
    if (!print_ids) {
        cb.on_token = [](int32_t, std::string_view piece) {
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
            return true;
        };
    }
    const GenerateResult r = engine->generate(req, cb);

    if (print_ids) {
        std::string line;
        for (int32_t id : r.tokens) line += (line.empty() ? "" : " ") + std::to_string(id);
        std::printf("%s\n", line.c_str());
    } else {
        std::printf("\n");
    }
    std::fflush(stdout);
    std::fprintf(stderr, "%s | seed %llu\n", timing_line(engine->load_ms(), r).c_str(), (unsigned long long)r.seed);
    return 0;
}

}  // namespace qinfer::cli
