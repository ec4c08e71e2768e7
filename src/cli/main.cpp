// `qinfer <command> [options]`: one binary, one subcommand per user task.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "common/error.h"
#include "common/platform.h"

namespace {

struct Command {
    const char* name;
    int (*fn)(int, char**);
    const char* help;
};

const Command kCommands[] = {
    {"run", qinfer::cli::cmd_run, "generate text from a prompt (llama-cli style flags)"},
    {"chat", qinfer::cli::cmd_chat, "interactive chat with the model's chat template"},
    {"serve", qinfer::cli::cmd_serve, "OpenAI-compatible HTTP server"},
    {"bench", qinfer::cli::cmd_bench, "prompt processing / generation throughput"},
    {"logits", qinfer::cli::cmd_logits, "write float32 logits for a list of token ids"},
    {"plan", qinfer::cli::cmd_plan, "memory planner: what fits where"},
    {"info", qinfer::cli::cmd_info, "GGUF metadata, architecture and tensor summary, sha256"},
    {"tokenize", qinfer::cli::cmd_tokenize, "text to token ids"},
    {"quantize", qinfer::cli::cmd_quantize, "requantize a GGUF file"},
    {"convert", qinfer::cli::cmd_convert, "Hugging Face safetensors folder to GGUF"},
};

void usage(FILE* out) {
    std::fprintf(out, "usage: qinfer <command> [options]\n\ncommands:\n");
    for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.help);
    std::fprintf(out, "\n`qinfer <command> --help` shows the options of a command.\n");
}

}  // namespace

int main(int raw_argc, char** raw_argv) {
    // UTF-8 console and arguments first: on Windows the char argv is in the
    // ANSI code page and a console prints in the OEM one, both lose Chinese text.
    qinfer::platform_init_console();
    auto args = qinfer::platform_utf8_args(raw_argc, raw_argv);
    const int argc = int(args.size()) - 1;
    char** argv = args.data();
    if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!std::strcmp(argv[1], "--version")) {
        std::printf("qinfer 0.1.0\n");
        return 0;
    }
    for (const Command& c : kCommands) {
        if (std::strcmp(argv[1], c.name) != 0) continue;
        try {
            return c.fn(argc - 1, argv + 1);
        } catch (const qinfer::Error& e) {
            std::fprintf(stderr, "error: %s\n", e.what());
            return 1;
        } catch (const std::bad_alloc&) {
            std::fprintf(stderr, "error: out of memory\n");
            return 1;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "error: %s\n", e.what());
            return 1;
        }
    }
    std::fprintf(stderr, "qinfer: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
