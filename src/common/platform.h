// Small OS seams: console UTF-8, UTF-8 argv and paths on Windows, console
// input, physical core count. Everything else in qinfer is plain C++ and
// treats every std::string as UTF-8.
#pragma once
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace qinfer {

// Sets the console to UTF-8 on Windows (so Chinese text prints); no-op elsewhere.
void platform_init_console();
// argv as UTF-8 (Windows converts from the wide command line, since its char
// argv is in the ANSI code page and loses Chinese text); the returned vector
// ends with a nullptr not counted in the size - 1 arguments, and its pointers
// stay valid for the process.
std::vector<char*> platform_utf8_args(int argc, char** argv);
// Physical cores (not hyper-threads); at least 1.
int physical_cores();

// A filesystem path from a UTF-8 string. On Windows a path built from a
// std::string (and std::ifstream(std::string), std::fopen) reads it in the
// ANSI code page, so a file named 你好.txt cannot be opened that way.
std::filesystem::path utf8_path(const std::string& utf8);
// The UTF-8 string of a path (path::string() is in the ANSI code page on Windows).
std::string path_utf8(const std::filesystem::path& p);
// std::fopen with a UTF-8 path.
FILE* utf8_fopen(const std::string& path, const char* mode);

// One line of standard input without its line end; false at end of input.
// In a Windows console it reads UTF-16 (ReadConsoleW) and converts to UTF-8,
// since byte reads of a console in the UTF-8 code page lose non-ASCII text.
bool read_stdin_line(std::string& line);

}  // namespace qinfer
