// Jinja semantics shared by the evaluator: truthiness, str(), attribute and
// item access (with Python string/dict methods), filters and tests.
#pragma once
#include <string>

#include "chat/jinja_value.h"

namespace qinfer::chat::jinja {

[[noreturn]] void runtime_error(int line, const std::string& msg);

bool truthy(const Value& v);
std::string to_str(const Value& v);  // what {{ v }} prints
bool equal(const Value& a, const Value& b);

Value get_attr(const Value& obj, const std::string& name, int line);  // obj.name
Value get_item(const Value& obj, const Value& key, int line);         // obj[key]
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line);
// Elements a for loop visits: list items, dict keys, string characters.
std::vector<Value> iterate(const Value& v, int line);

Value apply_filter(const std::string& name, const Value& in, Args& args, Kwargs& kwargs, int line);
bool apply_test(const std::string& name, const Value& v, Args& args, int line);
Value binary_op(const std::string& op, const Value& a, const Value& b, int line);

}  // namespace qinfer::chat::jinja
