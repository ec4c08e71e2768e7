// Errors on user input are values with context, thrown as qinfer::Error and
// turned into a one-line message at the edge (CLI, HTTP). Never abort() on input.
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

namespace qinfer {

class Error : public std::runtime_error {
public:
    explicit Error(std::string msg) : std::runtime_error(std::move(msg)) {}
};

// printf-style message builder used by every layer (keeps call sites short).
std::string strfmt(const char* fmt, ...)
#if defined(__MINGW32__)
    // MinGW's "printf" archetype is msvcrt's (no %zu); we use its C99 printf.
    __attribute__((format(gnu_printf, 1, 2)))
#elif defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

[[noreturn]] void fail(const std::string& msg);

}  // namespace qinfer
