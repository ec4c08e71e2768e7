#include "common/env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"

namespace qinfer {

namespace {
// The variable's value as an integer; false when unset or empty; fails on text
// that is not a whole integer.
bool read_int(const char* name, const std::string& takes, int& out) {
    const char* v = std::getenv(name);
    if (!v || !*v) return false;
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || x < INT_MIN || x > INT_MAX)
        fail(strfmt("%s=%s: expected %s", name, v, takes.c_str()));
    out = int(x);
    return true;
}
}  // namespace

int env_int(const char* name, int lo, int hi, int fallback) {
    const std::string takes = strfmt("an integer from %d to %d", lo, hi);
    int x = 0;
    if (!read_int(name, takes, x)) return fallback;
    if (x < lo || x > hi) fail(strfmt("%s=%d: expected %s", name, x, takes.c_str()));
    return x;
}

int env_int_of(const char* name, std::initializer_list<int> allowed, int fallback) {
    std::string takes = "one of";
    for (int a : allowed) takes += strfmt(" %d", a);
    int x = 0;
    if (!read_int(name, takes, x)) return fallback;
    for (int a : allowed)
        if (x == a) return x;
    fail(strfmt("%s=%d: expected %s", name, x, takes.c_str()));
}

bool env_is(const char* name, const char* value) {
    const char* v = std::getenv(name);
    return v && std::strcmp(v, value) == 0;
}

}  // namespace qinfer
