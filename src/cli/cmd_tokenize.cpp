// `qinfer tokenize -m MODEL [--text S | --file F] [--ids-only] [--no-special]`:
// text to token ids with the model's own tokenizer.
//   --ids-only --file F   one case per line in the escaped format of the
//                         reference tokenize-cases.txt (\n \r \t \\; --raw-lines
//                         takes lines literally); prints one line of
//                         space-separated ids per case, like the .ids files.
//   otherwise             the text (or the whole file) as one input; without
//                         --ids-only every id is listed with its piece.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/error.h"
#include "common/platform.h"
#include "gguf/gguf.h"
#include "tokenizer/escape.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::cli {

namespace {

std::string read_input(const std::string& path) {
    if (path == "-") {
        std::ostringstream ss;
        ss << std::cin.rdbuf();
        return ss.str();
    }
    std::ifstream in(utf8_path(path), std::ios::binary);  // UTF-8 name, also on Windows
    if (!in) fail(strfmt("cannot open '%s'", path.c_str()));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail(strfmt("error reading '%s'", path.c_str()));
    return ss.str();
}

void append_ids(std::string& out, const std::vector<int32_t>& ids) {
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ' ';
        out += std::to_string(ids[i]);
    }
    out += '\n';
}

// Bytes shown readably on one line: C escapes for controls, \xNN for bytes
// that are not (part of) valid UTF-8; other text as is.
std::string printable(std::string_view bytes) {
    std::string out;
    std::string clean = utf8_sanitize(bytes);
    const bool valid = clean.size() == bytes.size() && clean == bytes;
    for (unsigned char c : bytes) {
        switch (c) {
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\\': out += "\\\\"; break;
            default:
                if (c < 0x20 || c == 0x7F || (c >= 0x80 && !valid))
                    out += strfmt("\\x%02X", c);
                else
                    out += char(c);
        }
    }
    return out;
}

const char* type_label(TokenType t) {
    switch (t) {
        case TokenType::Control: return "  [control]";
        case TokenType::UserDefined: return "  [user-defined]";
        case TokenType::Unknown: return "  [unknown]";
        case TokenType::Unused: return "  [unused]";
        case TokenType::Byte: return "  [byte]";
        case TokenType::Undefined: return "  [undefined]";
        case TokenType::Normal: break;
    }
    return "";
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
    CLI::App app{"Text to token ids with the model's tokenizer", "qinfer tokenize"};
    std::string model_path, text, file;
    bool ids_only = false, no_special = false, raw_lines = false, whole_file = false, nfc = false;
    app.add_option("-m,--model", model_path, "GGUF model file (a vocab-only GGUF works too)")->required();
    auto* text_opt = app.add_option("--text", text, "text to tokenize (taken literally)");
    app.add_option("--file", file, "file to tokenize ('-' = stdin)")->excludes(text_opt);
    app.add_flag("--ids-only", ids_only,
                 "print only ids; with --file: one case per line in the escaped tokenize-cases format, one output "
                 "line per case");
    app.add_flag("--raw-lines", raw_lines, "with --ids-only --file: take lines literally (no \\n \\r \\t \\\\ escapes)");
    app.add_flag("--whole-file", whole_file, "with --ids-only --file: the whole file is one text");
    app.add_flag("--no-special", no_special,
                 "do not match control tokens (<|im_start|> ...) in the text; user-defined ones (<think> ...) still are");
    app.add_flag("--nfc", nfc, "NFC-normalize the text first (Hugging Face behaviour; llama.cpp does not)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    if (!app.count("--text") && file.empty()) fail("tokenize: give --text S or --file F");

    auto t0 = std::chrono::steady_clock::now();
    auto gguf = gguf::File::open(model_path);
    TokenizerOptions opts;
    opts.nfc = nfc;
    Tokenizer tok(*gguf, opts);
    auto t1 = std::chrono::steady_clock::now();
    const bool special = !no_special;

    std::string out;
    if (!file.empty() && ids_only && !whole_file) {
        const std::string contents = read_input(file);
        for (const std::string& line : split_case_lines(contents, !raw_lines)) append_ids(out, tok.encode(line, special));
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
    }

    const std::string input = file.empty() ? text : read_input(file);
    const std::vector<int32_t> ids = tok.encode(input, special);
    auto t2 = std::chrono::steady_clock::now();
    if (ids_only) {
        append_ids(out, ids);
    } else {
        for (int32_t id : ids) {
            out += strfmt("%8d  '", id);
            out += printable(tok.token_bytes(id));
            out += "'";
            out += type_label(tok.token_type(id));
            out += '\n';
        }
        std::fprintf(stderr, "%zu bytes -> %zu tokens (pre-tokenizer %s; load %.1f ms, encode %.2f ms)\n",
                     input.size(), ids.size(), std::string(tok.pre_tokenizer_name()).c_str(),
                     std::chrono::duration<double, std::milli>(t1 - t0).count(),
                     std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

}  // namespace qinfer::cli
