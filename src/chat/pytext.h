// How Python spells values, because chat templates are rendered by Python
// Jinja2 upstream and the model was trained on exactly those bytes:
//   py_json   = json.dumps(x, ensure_ascii=False) (", " / ": " separators,
//               keys in insertion order, no HTML escaping) -- the `tojson` of HF
//   py_str    = str(x)  (True/False/None, repr of floats, repr inside containers)
//   py_strip  = str.strip() with no argument (Unicode whitespace), or with a
//               character set
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace qinfer::chat {

using ojson = nlohmann::ordered_json;

std::string py_json(const ojson& v);
std::string py_str(const ojson& v);
std::string py_repr(const ojson& v);
std::string py_float_repr(double d);

// Python str.strip / lstrip / rstrip. `chars` = nullptr strips Unicode whitespace.
std::string py_strip(std::string_view s, const char* chars = nullptr);
std::string py_lstrip(std::string_view s, const char* chars = nullptr);
std::string py_rstrip(std::string_view s, const char* chars = nullptr);

}  // namespace qinfer::chat
