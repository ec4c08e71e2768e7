#include "chat/pytext.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace qinfer::chat {

namespace {

// One code point at s[i] (invalid bytes count as one unit, value 0xFFFD).
uint32_t decode_at(std::string_view s, size_t i, size_t* len) {
    const unsigned char c = (unsigned char)s[i];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + size_t(n) > s.size()) {
        *len = 1;
        return 0xFFFD;
    }
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; k++) {
        const unsigned char d = (unsigned char)s[i + size_t(k)];
        if ((d >> 6) != 2) {
            *len = 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (d & 0x3F);
    }
    *len = size_t(n);
    return cp;
}

// Python's str.isspace().
bool is_py_space(uint32_t cp) {
    switch (cp) {
        case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E:
        case 0x1F: case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
        case 0x202F: case 0x205F: case 0x3000:
            return true;
        default:
            return cp >= 0x2000 && cp <= 0x200A;
    }
}

bool in_set(uint32_t cp, size_t len, std::string_view s, size_t i, const char* chars) {
    if (!chars) return is_py_space(cp);
    // Character sets in the templates are ASCII ("\n"); compare bytes.
    if (len != 1) return false;
    for (const char* p = chars; *p; p++)
        if (*p == s[i]) return true;
    return false;
}

size_t lstrip_pos(std::string_view s, const char* chars) {
    size_t i = 0;
    while (i < s.size()) {
        size_t len;
        uint32_t cp = decode_at(s, i, &len);
        if (!in_set(cp, len, s, i, chars)) break;
        i += len;
    }
    return i;
}

size_t rstrip_pos(std::string_view s, const char* chars) {
    // Walk forward remembering where the trailing run of strippable chars starts.
    size_t end = 0, i = 0;
    while (i < s.size()) {
        size_t len;
        uint32_t cp = decode_at(s, i, &len);
        i += len;
        if (!in_set(cp, len, s, i - len, chars)) end = i;
    }
    return end;
}

std::string json_string(const std::string& s) {
    return ojson(s).dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string py_repr_string(const std::string& s) {
    // repr() uses single quotes unless the text has ' and no ".
    const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
    const char q = dq ? '"' : '\'';
    std::string out(1, q);
    for (char ch : s) {
        const unsigned char c = (unsigned char)ch;
        if (ch == q || ch == '\\') {
            out += '\\';
            out += ch;
        } else if (ch == '\n') {
            out += "\\n";
        } else if (ch == '\r') {
            out += "\\r";
        } else if (ch == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += ch;
        }
    }
    out += q;
    return out;
}

}  // namespace

std::string py_float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string sci(buf, r.ptr);  // e.g. "-1.2345e+02"
    const size_t epos = sci.find('e');
    const int exp10 = std::atoi(sci.c_str() + epos + 1);
    std::string mant = sci.substr(0, epos);
    std::string sign;
    if (mant[0] == '-') {
        sign = "-";
        mant.erase(0, 1);
    }
    std::string digits;
    for (char c : mant)
        if (c != '.') digits += c;
    if (exp10 < -4 || exp10 >= 16) {
        std::string m = digits.substr(0, 1);
        if (digits.size() > 1) m += "." + digits.substr(1);
        char e[16];
        std::snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
        return sign + m + e;
    }
    std::string out;
    if (exp10 < 0) {
        out = "0." + std::string(size_t(-exp10 - 1), '0') + digits;
    } else if (size_t(exp10) + 1 >= digits.size()) {
        out = digits + std::string(size_t(exp10) + 1 - digits.size(), '0') + ".0";
    } else {
        out = digits.substr(0, size_t(exp10) + 1) + "." + digits.substr(size_t(exp10) + 1);
    }
    return sign + out;
}

std::string py_json(const ojson& v) {
    switch (v.type()) {
        case ojson::value_t::object: {
            std::string out = "{";
            bool first = true;
            for (auto it = v.begin(); it != v.end(); ++it) {
                if (!first) out += ", ";
                first = false;
                out += json_string(it.key()) + ": " + py_json(it.value());
            }
            return out + "}";
        }
        case ojson::value_t::array: {
            std::string out = "[";
            for (size_t i = 0; i < v.size(); i++) {
                if (i) out += ", ";
                out += py_json(v[i]);
            }
            return out + "]";
        }
        case ojson::value_t::string: return json_string(v.get_ref<const std::string&>());
        case ojson::value_t::number_float: {
            const double d = v.get<double>();
            if (std::isnan(d)) return "NaN";
            if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
            return py_float_repr(d);
        }
        default: return v.dump();  // null, bool, integers: same spelling as Python
    }
}

std::string py_str(const ojson& v) {
    switch (v.type()) {
        case ojson::value_t::string: return v.get<std::string>();
        default: return py_repr(v);
    }
}

std::string py_repr(const ojson& v) {
    switch (v.type()) {
        case ojson::value_t::null:
        case ojson::value_t::discarded: return "None";
        case ojson::value_t::boolean: return v.get<bool>() ? "True" : "False";
        case ojson::value_t::number_float: return py_float_repr(v.get<double>());
        case ojson::value_t::string: return py_repr_string(v.get<std::string>());
        case ojson::value_t::array: {
            std::string out = "[";
            for (size_t i = 0; i < v.size(); i++) {
                if (i) out += ", ";
                out += py_repr(v[i]);
            }
            return out + "]";
        }
        case ojson::value_t::object: {
            std::string out = "{";
            bool first = true;
            for (auto it = v.begin(); it != v.end(); ++it) {
                if (!first) out += ", ";
                first = false;
                out += py_repr_string(it.key()) + ": " + py_repr(it.value());
            }
            return out + "}";
        }
        default: return v.dump();  // integers
    }
}

std::string py_strip(std::string_view s, const char* chars) {
    const size_t b = lstrip_pos(s, chars);
    std::string_view rest = s.substr(b);
    return std::string(rest.substr(0, rstrip_pos(rest, chars)));
}

std::string py_lstrip(std::string_view s, const char* chars) { return std::string(s.substr(lstrip_pos(s, chars))); }

std::string py_rstrip(std::string_view s, const char* chars) { return std::string(s.substr(0, rstrip_pos(s, chars))); }

}  // namespace qinfer::chat
