#include "tokenizer/escape.h"

namespace qinfer {

std::string unescape_case_line(std::string_view line) {
    std::string out;
    out.reserve(line.size());
    for (size_t i = 0; i < line.size(); ++i) {
        if (line[i] != '\\' || i + 1 == line.size()) {
            out += line[i];
            continue;
        }
        switch (line[i + 1]) {
            case 'n': out += '\n'; ++i; break;
            case 'r': out += '\r'; ++i; break;
            case 't': out += '\t'; ++i; break;
            case '\\': out += '\\'; ++i; break;
            default: out += '\\'; break;  // literal backslash; the next char is copied next round
        }
    }
    return out;
}

std::vector<std::string> split_case_lines(std::string_view contents, bool escaped) {
    std::vector<std::string> lines;
    size_t begin = 0;
    while (begin < contents.size()) {
        size_t end = contents.find('\n', begin);
        if (end == std::string_view::npos) end = contents.size();
        std::string_view line = contents.substr(begin, end - begin);
        // In the escaped format a CR is written "\r", so a raw one is a CRLF line end.
        if (escaped && !line.empty() && line.back() == '\r') line.remove_suffix(1);
        lines.push_back(escaped ? unescape_case_line(line) : std::string(line));
        begin = end + 1;
    }
    return lines;
}

}  // namespace qinfer
