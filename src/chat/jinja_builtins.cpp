#include "chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace qinfer::chat::jinja {

void runtime_error(int line, const std::string& msg) { fail(strfmt("chat template: line %d: %s", line, msg.c_str())); }

namespace {

// Python strings index code points.
std::vector<std::string> chars_of(const std::string& s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = (unsigned char)s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        n = std::min(n, s.size() - i);
        out.push_back(s.substr(i, n));
        i += n;
    }
    return out;
}

const char* type_name(const Value& v) {
    switch (v.k) {
        case Value::K::Undefined: return "undefined";
        case Value::K::Ns: return "namespace";
        case Value::K::Fn: return "function";
        default: break;
    }
    switch (v.j.type()) {
        case ojson::value_t::null: return "none";
        case ojson::value_t::boolean: return "bool";
        case ojson::value_t::string: return "string";
        case ojson::value_t::array: return "list";
        case ojson::value_t::object: return "dict";
        case ojson::value_t::number_float: return "float";
        default: return "int";
    }
}

double num(const Value& v, int line) {
    if (!v.is_number() && !(v.is_data() && v.j.is_boolean()))
        runtime_error(line, strfmt("expected a number, got %s", type_name(v)));
    return v.j.is_boolean() ? (v.j.get<bool>() ? 1.0 : 0.0) : v.j.get<double>();
}

int64_t as_int(const Value& v, int line) {
    if (v.is_int()) return v.j.get<int64_t>();
    if (v.is_data() && v.j.is_boolean()) return v.j.get<bool>() ? 1 : 0;
    runtime_error(line, strfmt("expected an integer, got %s", type_name(v)));
}

std::string str_arg(const Args& a, size_t i, int line, const char* what) {
    if (a.size() <= i || !a[i].is_string()) runtime_error(line, strfmt("%s expects a string argument", what));
    return a[i].str();
}

const Value* kwarg(const Kwargs& kw, const char* name) {
    for (const auto& [k, v] : kw)
        if (k == name) return &v;
    return nullptr;
}

ojson to_json(const Value& v, int line) {
    if (v.is_data()) return v.j;
    if (v.is_undefined()) runtime_error(line, "cannot serialise an undefined value");
    if (v.k == Value::K::Ns) {
        ojson o = ojson::object();
        for (const auto& [k, x] : *v.ns) o[k] = to_json(x, line);
        return o;
    }
    runtime_error(line, "cannot serialise a function");
}

std::string json_indent(const ojson& v, int indent, int level) {
    const std::string pad(size_t(indent * (level + 1)), ' '), end_pad(size_t(indent * level), ' ');
    if (v.is_object() && !v.empty()) {
        std::string out = "{\n";
        bool first = true;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (!first) out += ",\n";
            first = false;
            out += pad + py_json(ojson(it.key())) + ": " + json_indent(it.value(), indent, level + 1);
        }
        return out + "\n" + end_pad + "}";
    }
    if (v.is_array() && !v.empty()) {
        std::string out = "[\n";
        for (size_t i = 0; i < v.size(); i++) out += (i ? ",\n" : "") + pad + json_indent(v[i], indent, level + 1);
        return out + "\n" + end_pad + "]";
    }
    return py_json(v);
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
    std::vector<std::string> out;
    if (!sep || sep->is_none()) {
        size_t i = 0;
        while (i < s.size()) {
            while (i < s.size() && std::isspace((unsigned char)s[i])) i++;
            if (i == s.size()) break;
            size_t j = i;
            if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
                std::string rest = s.substr(i);
                out.push_back(py_rstrip(rest));
                return out;
            }
            while (j < s.size() && !std::isspace((unsigned char)s[j])) j++;
            out.push_back(s.substr(i, j - i));
            i = j;
        }
        return out;
    }
    const std::string& d = sep->str();
    if (d.empty()) fail("chat template: empty separator");
    size_t i = 0;
    for (;;) {
        const size_t p = s.find(d, i);
        if (p == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) {
            out.push_back(s.substr(i));
            return out;
        }
        out.push_back(s.substr(i, p - i));
        i = p + d.size();
    }
}

std::string py_replace(std::string s, const std::string& from, const std::string& to, int64_t count) {
    if (from.empty()) return s;
    size_t i = 0;
    for (int64_t n = 0; count < 0 || n < count; n++) {
        const size_t p = s.find(from, i);
        if (p == std::string::npos) break;
        s.replace(p, from.size(), to);
        i = p + to.size();
    }
    return s;
}

std::string title_case(const std::string& s, bool only_first) {
    std::string out;
    bool start = true;
    for (char c : s) {
        const bool alpha = std::isalpha((unsigned char)c) != 0;
        if (alpha)
            out += start ? char(std::toupper((unsigned char)c)) : char(std::tolower((unsigned char)c));
        else
            out += c;
        if (only_first) start = false;
        else start = !alpha;
    }
    return out;
}

bool starts_or_ends(const std::string& s, const Value& arg, bool starts, int line) {
    auto one = [&](const std::string& p) {
        if (p.size() > s.size()) return false;
        return starts ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
    };
    if (arg.is_string()) return one(arg.str());
    if (arg.is_list()) {
        for (const ojson& p : arg.j)
            if (p.is_string() && one(p.get<std::string>())) return true;
        return false;
    }
    runtime_error(line, "startswith/endswith expects a string or a tuple of strings");
}

// Methods reached through attribute access: "abc".upper(), d.items(), ...
Value method(const Value& obj, const std::string& name, int line) {
    if (obj.is_string()) {
        const std::string s = obj.str();
        static const char* kStr[] = {"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip",
                                     "upper",      "lower",    "replace", "title", "capitalize", "find", "count",
                                     "join",       "isspace",  "isdigit", "isalpha"};
        if (std::find_if(std::begin(kStr), std::end(kStr), [&](const char* m) { return name == m; }) == std::end(kStr))
            return Value::undefined();
        return Value::function(name, [s, name, line](Args& a, Kwargs& kw) -> Value {
            if (name == "startswith" || name == "endswith") {
                if (a.empty()) runtime_error(line, name + " needs an argument");
                return ojson(starts_or_ends(s, a[0], name == "startswith", line));
            }
            if (name == "split" || name == "rsplit") {
                const Value* sep = a.size() > 0 ? &a[0] : kwarg(kw, "sep");
                const Value* ms = a.size() > 1 ? &a[1] : kwarg(kw, "maxsplit");
                ojson out = ojson::array();
                for (auto& p : py_split(s, sep, ms ? as_int(*ms, line) : -1)) out.push_back(p);
                return out;
            }
            if (name == "strip" || name == "lstrip" || name == "rstrip") {
                std::string chars;
                const bool has = !a.empty() && a[0].is_string();
                if (has) chars = a[0].str();
                const char* c = has ? chars.c_str() : nullptr;
                return ojson(name == "strip" ? py_strip(s, c) : name == "lstrip" ? py_lstrip(s, c) : py_rstrip(s, c));
            }
            if (name == "upper" || name == "lower") {
                std::string r = s;
                for (char& ch : r) ch = char(name == "upper" ? std::toupper((unsigned char)ch) : std::tolower((unsigned char)ch));
                return ojson(r);
            }
            if (name == "replace")
                return ojson(py_replace(s, str_arg(a, 0, line, "replace"), str_arg(a, 1, line, "replace"),
                                        a.size() > 2 ? as_int(a[2], line) : -1));
            if (name == "title" || name == "capitalize") return ojson(title_case(s, name == "capitalize"));
            if (name == "find") {
                const size_t p = s.find(str_arg(a, 0, line, "find"));
                return ojson(p == std::string::npos ? int64_t(-1) : int64_t(chars_of(s.substr(0, p)).size()));
            }
            if (name == "count") {
                const std::string sub = str_arg(a, 0, line, "count");
                int64_t n = 0;
                for (size_t p = s.find(sub); !sub.empty() && p != std::string::npos; p = s.find(sub, p + sub.size())) n++;
                return ojson(n);
            }
            if (name == "join") {
                std::string out;
                if (a.empty()) runtime_error(line, "join needs an argument");
                bool first = true;
                for (const Value& x : iterate(a[0], line)) {
                    if (!first) out += s;
                    first = false;
                    out += to_str(x);
                }
                return ojson(out);
            }
            bool all = !s.empty();
            for (char ch : s) {
                if (name == "isspace") all = all && std::isspace((unsigned char)ch);
                if (name == "isdigit") all = all && std::isdigit((unsigned char)ch);
                if (name == "isalpha") all = all && std::isalpha((unsigned char)ch);
            }
            return ojson(all);
        });
    }
    if (obj.is_dict()) {
        if (name != "items" && name != "keys" && name != "values" && name != "get") return Value::undefined();
        const ojson d = obj.j;
        return Value::function(name, [d, name, line](Args& a, Kwargs&) -> Value {
            if (name == "get") {
                if (a.empty() || !a[0].is_string()) return a.size() > 1 ? a[1] : Value(ojson(nullptr));
                auto it = d.find(a[0].str());
                return it != d.end() ? Value(*it) : (a.size() > 1 ? a[1] : Value(ojson(nullptr)));
            }
            ojson out = ojson::array();
            for (auto it = d.begin(); it != d.end(); ++it) {
                if (name == "items") out.push_back(ojson::array({it.key(), it.value()}));
                else if (name == "keys") out.push_back(it.key());
                else out.push_back(it.value());
            }
            return out;
        });
    }
    return Value::undefined();
}

}  // namespace

bool truthy(const Value& v) {
    switch (v.k) {
        case Value::K::Undefined: return false;
        case Value::K::Ns:
        case Value::K::Fn: return true;
        default: break;
    }
    const ojson& j = v.j;
    if (j.is_null()) return false;
    if (j.is_boolean()) return j.get<bool>();
    if (j.is_number_float()) return j.get<double>() != 0.0;
    if (j.is_number()) return j.get<int64_t>() != 0;
    if (j.is_string() || j.is_array() || j.is_object()) return !j.empty() && !(j.is_string() && j.get_ref<const std::string&>().empty());
    return true;
}

std::string to_str(const Value& v) {
    switch (v.k) {
        case Value::K::Undefined: return "";
        case Value::K::Ns: return "<Namespace>";
        case Value::K::Fn: return "<function " + v.fn->name + ">";
        default: return py_str(v.j);
    }
}

bool equal(const Value& a, const Value& b) {
    if (a.k != b.k) return false;
    switch (a.k) {
        case Value::K::Undefined: return true;
        case Value::K::Ns: return a.ns == b.ns;
        case Value::K::Fn: return a.fn == b.fn;
        default: return a.j == b.j;
    }
}

Value get_attr(const Value& obj, const std::string& name, int line) {
    if (obj.k == Value::K::Ns) {
        const Value* a = obj.attr(name);
        return a ? *a : Value::undefined();
    }
    if (obj.is_data()) {
        Value m = method(obj, name, line);
        if (!m.is_undefined()) return m;
        if (obj.is_dict()) {
            auto it = obj.j.find(name);
            if (it != obj.j.end()) return *it;
        }
    }
    return Value::undefined();  // also for undefined.attr: stays undefined
}

Value get_item(const Value& obj, const Value& key, int line) {
    if (obj.is_dict()) {
        if (!key.is_string()) return Value::undefined();
        auto it = obj.j.find(key.str());
        return it != obj.j.end() ? Value(*it) : Value::undefined();
    }
    if (obj.k == Value::K::Ns && key.is_string()) return get_attr(obj, key.str(), line);
    if ((obj.is_list() || obj.is_string()) && key.is_int()) {
        int64_t i = key.j.get<int64_t>();
        if (obj.is_list()) {
            const int64_t n = int64_t(obj.j.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) return Value::undefined();
            return obj.j[size_t(i)];
        }
        const auto cs = chars_of(obj.str());
        const int64_t n = int64_t(cs.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined();
        return ojson(cs[size_t(i)]);
    }
    if (key.is_string() && obj.is_data()) return get_attr(obj, key.str(), line);
    return Value::undefined();
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line) {
    std::vector<Value> items;
    const bool is_str = obj.is_string();
    if (is_str) {
        for (auto& c : chars_of(obj.str())) items.push_back(ojson(c));
    } else if (obj.is_list()) {
        for (const ojson& x : obj.j) items.push_back(x);
    } else {
        runtime_error(line, strfmt("cannot slice a %s", type_name(obj)));
    }
    const int64_t n = int64_t(items.size());
    const int64_t st = step.is_undefined() || step.is_none() ? 1 : as_int(step, line);
    if (st == 0) runtime_error(line, "slice step cannot be zero");
    auto norm = [&](const Value& v, int64_t def) -> int64_t {
        if (v.is_undefined() || v.is_none()) return def;
        int64_t i = as_int(v, line);
        if (i < 0) i += n;
        return st > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
    };
    const int64_t b = norm(start, st > 0 ? 0 : n - 1), e = norm(stop, st > 0 ? n : -1);
    std::string s;
    ojson out = ojson::array();
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
        if (is_str) s += items[size_t(i)].str();
        else out.push_back(items[size_t(i)].j);
    }
    return is_str ? Value(ojson(s)) : Value(out);
}

std::vector<Value> iterate(const Value& v, int line) {
    std::vector<Value> out;
    if (v.is_undefined() || v.is_none()) return out;
    if (v.is_list()) {
        for (const ojson& x : v.j) out.push_back(x);
    } else if (v.is_dict()) {
        for (auto it = v.j.begin(); it != v.j.end(); ++it) out.push_back(ojson(it.key()));
    } else if (v.is_string()) {
        for (auto& c : chars_of(v.str())) out.push_back(ojson(c));
    } else if (v.k == Value::K::Ns) {
        for (auto& [k, x] : *v.ns) out.push_back(ojson(k));
    } else {
        runtime_error(line, strfmt("cannot iterate over a %s", type_name(v)));
    }
    return out;
}

bool apply_test(const std::string& name, const Value& v, Args& a, int line) {
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_data() && v.j.is_number_float();
    if (name == "boolean") return v.is_data() && v.j.is_boolean();
    if (name == "true") return v.is_data() && v.j.is_boolean() && v.j.get<bool>();
    if (name == "false") return v.is_data() && v.j.is_boolean() && !v.j.get<bool>();
    if (name == "mapping") return v.is_dict() || v.k == Value::K::Ns;
    if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string();
    if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
    if (name == "callable") return v.k == Value::K::Fn;
    if (name == "lower" || name == "upper") {
        if (!v.is_string()) return false;
        for (char c : v.str())
            if (std::isalpha((unsigned char)c) && (name == "lower" ? std::isupper((unsigned char)c) : std::islower((unsigned char)c)))
                return false;
        return true;
    }
    if (name == "odd" || name == "even") return (as_int(v, line) % 2 != 0) == (name == "odd");
    if (a.empty()) runtime_error(line, "test '" + name + "' needs an argument (or is unknown)");
    if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return equal(v, a[0]);
    if (name == "ne" || name == "!=") return !equal(v, a[0]);
    if (name == "divisibleby") return as_int(v, line) % as_int(a[0], line) == 0;
    if (name == "in") return truthy(binary_op("in", v, a[0], line));
    if (name == "lt" || name == "<") return truthy(binary_op("<", v, a[0], line));
    if (name == "gt" || name == ">") return truthy(binary_op(">", v, a[0], line));
    if (name == "le" || name == "<=") return truthy(binary_op("<=", v, a[0], line));
    if (name == "ge" || name == ">=") return truthy(binary_op(">=", v, a[0], line));
    runtime_error(line, "unknown test '" + name + "'");
}

Value apply_filter(const std::string& name, const Value& in, Args& a, Kwargs& kw, int line) {
    if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
        // No autoescaping in chat templates: escape filters would change the
        // bytes the model was trained on, so only `safe` is meaningful.
        if (name != "safe") runtime_error(line, "HTML escaping is not supported in chat templates");
        return in;
    }
    if (name == "length" || name == "count") {
        if (in.is_string()) return ojson(int64_t(chars_of(in.str()).size()));
        if (in.is_list() || in.is_dict()) return ojson(int64_t(in.j.size()));
        if (in.k == Value::K::Ns) return ojson(int64_t(in.ns->size()));
        if (in.is_undefined()) return ojson(0);
        runtime_error(line, strfmt("length of a %s", type_name(in)));
    }
    if (name == "tojson") {
        const Value* ind = a.size() > 0 ? &a[0] : kwarg(kw, "indent");
        const ojson j = to_json(in, line);
        if (ind && !ind->is_none()) return ojson(json_indent(j, int(as_int(*ind, line)), 0));
        return ojson(py_json(j));
    }
    if (name == "trim") {
        if (!in.is_string()) return ojson(py_strip(to_str(in)));
        std::string chars = a.size() > 0 && a[0].is_string() ? a[0].str() : "";
        return ojson(py_strip(in.str(), chars.empty() ? nullptr : chars.c_str()));
    }
    if (name == "string") return ojson(to_str(in));
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
        Args none;
        Kwargs nk;
        Value m = method(ojson(to_str(in)), name, line);
        return m.fn->fn(none, nk);
    }
    if (name == "replace") {
        Value m = method(ojson(to_str(in)), "replace", line);
        return m.fn->fn(a, kw);
    }
    if (name == "items") {
        if (in.is_undefined()) return ojson::array();
        if (!in.is_dict()) runtime_error(line, strfmt("items of a %s", type_name(in)));
        Args none;
        Kwargs nk;
        return method(in, "items", line).fn->fn(none, nk);
    }
    if (name == "default" || name == "d") {
        const bool boolean = (a.size() > 1 && truthy(a[1])) || (kwarg(kw, "boolean") && truthy(*kwarg(kw, "boolean")));
        const bool use = in.is_undefined() || (boolean && !truthy(in));
        return use ? (a.empty() ? Value(ojson("")) : a[0]) : in;
    }
    if (name == "join") {
        const std::string sep = a.size() > 0 ? to_str(a[0]) : "";
        const Value* attr = kwarg(kw, "attribute");
        std::string out;
        bool first = true;
        for (const Value& x : iterate(in, line)) {
            if (!first) out += sep;
            first = false;
            out += to_str(attr ? get_attr(x, to_str(*attr), line) : x);
        }
        return ojson(out);
    }
    if (name == "list") {
        ojson out = ojson::array();
        for (const Value& x : iterate(in, line)) out.push_back(to_json(x, line));
        return out;
    }
    if (name == "first" || name == "last") {
        std::vector<Value> xs = iterate(in, line);
        if (xs.empty()) return Value::undefined();
        return name == "first" ? xs.front() : xs.back();
    }
    if (name == "reverse") {
        if (in.is_string()) {
            auto cs = chars_of(in.str());
            std::string r;
            for (auto it = cs.rbegin(); it != cs.rend(); ++it) r += *it;
            return ojson(r);
        }
        ojson out = ojson::array();
        std::vector<Value> xs = iterate(in, line);
        for (auto it = xs.rbegin(); it != xs.rend(); ++it) out.push_back(to_json(*it, line));
        return out;
    }
    if (name == "int") {
        if (in.is_number()) return ojson(int64_t(num(in, line)));
        if (in.is_string()) {
            try {
                return ojson(int64_t(std::stoll(py_strip(in.str()))));
            } catch (const std::exception&) {
            }
        }
        return a.empty() ? Value(ojson(0)) : a[0];
    }
    if (name == "float") {
        if (in.is_number()) return ojson(num(in, line));
        if (in.is_string()) {
            try {
                return ojson(std::stod(py_strip(in.str())));
            } catch (const std::exception&) {
            }
        }
        return a.empty() ? Value(ojson(0.0)) : a[0];
    }
    if (name == "abs") return in.is_int() ? Value(ojson(std::llabs(in.j.get<int64_t>()))) : Value(ojson(std::fabs(num(in, line))));
    if (name == "round") {
        const int64_t prec = a.empty() ? 0 : as_int(a[0], line);
        const double p = std::pow(10.0, double(prec));
        return ojson(std::nearbyint(num(in, line) * p) / p);
    }
    if (name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
        ojson out = ojson::array();
        for (const Value& x : iterate(in, line)) {
            if (name == "map") {
                if (const Value* attr = kwarg(kw, "attribute")) {
                    Value y = get_attr(x, to_str(*attr), line);
                    if (y.is_undefined() && kwarg(kw, "default")) y = *kwarg(kw, "default");
                    out.push_back(to_json(y.is_undefined() ? Value(ojson(nullptr)) : y, line));
                } else {
                    if (a.empty()) runtime_error(line, "map needs a filter name or attribute=");
                    Args rest(a.begin() + 1, a.end());
                    Kwargs nk;
                    out.push_back(to_json(apply_filter(to_str(a[0]), x, rest, nk, line), line));
                }
                continue;
            }
            const bool by_attr = name == "selectattr" || name == "rejectattr";
            size_t ti = by_attr ? 1 : 0;
            const Value subject = by_attr ? (a.empty() ? Value() : get_attr(x, to_str(a[0]), line)) : x;
            bool ok;
            if (a.size() <= ti) {
                ok = truthy(subject);
            } else {
                Args rest(a.begin() + long(ti) + 1, a.end());
                ok = apply_test(to_str(a[ti]), subject, rest, line);
            }
            if (ok == (name == "select" || name == "selectattr")) out.push_back(to_json(x, line));
        }
        return out;
    }
    runtime_error(line, "unknown filter '" + name + "'");
}

Value binary_op(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") return ojson(to_str(a) + to_str(b));
    if (op == "==") return ojson(equal(a, b));
    if (op == "!=") return ojson(!equal(a, b));
    if (op == "in" || op == "not in") {
        bool r = false;
        if (b.is_string() && a.is_string()) r = b.str().find(a.str()) != std::string::npos;
        else if (b.is_list()) {
            for (const ojson& x : b.j) r = r || equal(a, Value(x));
        } else if (b.is_dict()) r = a.is_string() && b.j.contains(a.str());
        else if (b.k == Value::K::Ns) r = a.is_string() && b.attr(a.str()) != nullptr;
        else if (!b.is_undefined()) runtime_error(line, strfmt("'in' on a %s", type_name(b)));
        return ojson(op == "in" ? r : !r);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
        int c;
        if (a.is_string() && b.is_string()) c = a.str().compare(b.str());
        else {
            const double x = num(a, line), y = num(b, line);
            c = x < y ? -1 : x > y ? 1 : 0;
        }
        return ojson(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
        if (a.is_string() && b.is_string()) return ojson(a.str() + b.str());
        if (a.is_list() && b.is_list()) {
            ojson r = a.j;
            for (const ojson& x : b.j) r.push_back(x);
            return r;
        }
        if (a.is_string() || b.is_string() || a.is_undefined() || b.is_undefined())
            runtime_error(line, strfmt("cannot add %s and %s", type_name(a), type_name(b)));
    }
    if (op == "*" && a.is_string() && b.is_int()) {
        std::string r;
        for (int64_t i = 0; i < b.j.get<int64_t>(); i++) r += a.str();
        return ojson(r);
    }
    const bool ints = (a.is_int() || (a.is_data() && a.j.is_boolean())) && (b.is_int() || (b.is_data() && b.j.is_boolean()));
    if (ints && op != "/" && op != "**") {
        const int64_t x = as_int(a, line), y = as_int(b, line);
        if (op == "+") return ojson(x + y);
        if (op == "-") return ojson(x - y);
        if (op == "*") return ojson(x * y);
        if (y == 0) runtime_error(line, "division by zero");
        // Python floor division and modulo.
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
            q--;
            r += y;
        }
        return op == "//" ? ojson(q) : ojson(r);
    }
    const double x = num(a, line), y = num(b, line);
    if (op == "+") return ojson(x + y);
    if (op == "-") return ojson(x - y);
    if (op == "*") return ojson(x * y);
    if (op == "**") return ints && y >= 0 ? ojson(int64_t(std::llround(std::pow(x, y)))) : ojson(std::pow(x, y));
    if (y == 0) runtime_error(line, "division by zero");
    if (op == "/") return ojson(x / y);
    if (op == "//") return ojson(std::floor(x / y));
    if (op == "%") return ojson(x - y * std::floor(x / y));
    runtime_error(line, "unknown operator " + op);
}

}  // namespace qinfer::chat::jinja
