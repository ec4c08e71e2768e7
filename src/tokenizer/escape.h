// The escaped one-case-per-line format of the reference tokenize-cases.txt
// (MANIFEST.md §2), shared by `qinfer tokenize --file` and the tests.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace qinfer {

// "\n" -> LF, "\r" -> CR, "\t" -> TAB, "\\" -> one backslash; any other
// backslash sequence (and a trailing lone backslash) stays literal.
std::string unescape_case_line(std::string_view line);

// Splits file contents into lines at LF (a final LF does not start another
// line). With `escaped`, a raw CR before the LF is dropped (CRLF files) and
// every line is passed through unescape_case_line.
std::vector<std::string> split_case_lines(std::string_view contents, bool escaped);

}  // namespace qinfer
