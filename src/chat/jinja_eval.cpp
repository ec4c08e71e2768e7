// Jinja subset: the evaluator (statements, expressions, scopes, macros).
#include <chrono>
#include <ctime>
#include <unordered_map>

#include "chat/jinja.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_builtins.h"
#include "common/error.h"

namespace qinfer::chat::jinja {

namespace {

// Variables of one block (template, loop iteration, macro call). `if` does
// not open a scope; assignments in a loop body stay in that iteration.
struct Scope {
    Scope* parent = nullptr;
    std::unordered_map<std::string, Value> vars;

    const Value* find(const std::string& n) const {
        for (const Scope* s = this; s; s = s->parent) {
            auto it = s->vars.find(n);
            if (it != s->vars.end()) return &it->second;
        }
        return nullptr;
    }
};

enum class Flow { Normal, Break, Continue };

class Renderer {
public:
    explicit Renderer(Scope& root) : root_(root) {}

    Flow exec(const Body& body, Scope& sc, std::string& out) {
        for (const NodeP& n : body) {
            const Flow f = exec(*n, sc, out);
            if (f != Flow::Normal) return f;
        }
        return Flow::Normal;
    }

private:
    Flow exec(const Node& n, Scope& sc, std::string& out) {
        switch (n.kind) {
            case Node::Kind::Text: out += n.text; return Flow::Normal;
            case Node::Kind::Output: out += to_str(eval(*n.expr, sc)); return Flow::Normal;
            case Node::Kind::If:
                for (const auto& [cond, body] : n.branches)
                    if (!cond || truthy(eval(*cond, sc))) return exec(body, sc, out);
                return Flow::Normal;
            case Node::Kind::For: return exec_for(n, sc, out);
            case Node::Kind::Set: {
                Value v = eval(*n.expr, sc);
                if (!n.attr.empty()) {
                    const Value* obj = sc.find(n.targets[0]);
                    if (!obj || obj->k != Value::K::Ns)
                        runtime_error(n.line, "'" + n.targets[0] + "' is not a namespace: cannot set an attribute");
                    Value target = *obj;  // shares the namespace
                    target.set_attr(n.attr, std::move(v));
                } else {
                    assign(n.targets, v, sc, n.line);
                }
                return Flow::Normal;
            }
            case Node::Kind::SetBlock: {
                std::string s;
                exec(n.body, sc, s);
                sc.vars[n.targets[0]] = ojson(s);
                return Flow::Normal;
            }
            case Node::Kind::Macro: define_macro(n, sc); return Flow::Normal;
            case Node::Kind::Break: return Flow::Break;
            case Node::Kind::Continue: return Flow::Continue;
        }
        return Flow::Normal;
    }

    void assign(const std::vector<std::string>& names, const Value& v, Scope& sc, int line) {
        if (names.size() == 1) {
            sc.vars[names[0]] = v;
            return;
        }
        std::vector<Value> parts = iterate(v, line);
        if (parts.size() != names.size())
            runtime_error(line, strfmt("cannot unpack %zu values into %zu names", parts.size(), names.size()));
        for (size_t i = 0; i < names.size(); i++) sc.vars[names[i]] = parts[i];
    }

    Flow exec_for(const Node& n, Scope& sc, std::string& out) {
        std::vector<Value> items = iterate(eval(*n.expr, sc), n.line);
        if (n.filter) {
            std::vector<Value> kept;
            for (const Value& it : items) {
                Scope f{&sc, {}};
                assign(n.targets, it, f, n.line);
                if (truthy(eval(*n.filter, f))) kept.push_back(it);
            }
            items.swap(kept);
        }
        if (items.empty()) {
            exec(n.else_body, sc, out);
            return Flow::Normal;
        }
        const int64_t len = int64_t(items.size());
        for (int64_t i = 0; i < len; i++) {
            Scope it{&sc, {}};
            assign(n.targets, items[size_t(i)], it, n.line);
            it.vars["loop"] = Value::namespace_obj({
                {"index0", ojson(i)},
                {"index", ojson(i + 1)},
                {"revindex0", ojson(len - i - 1)},
                {"revindex", ojson(len - i)},
                {"first", ojson(i == 0)},
                {"last", ojson(i == len - 1)},
                {"length", ojson(len)},
                {"previtem", i > 0 ? items[size_t(i - 1)] : Value::undefined()},
                {"nextitem", i + 1 < len ? items[size_t(i + 1)] : Value::undefined()},
            });
            if (exec(n.body, it, out) == Flow::Break) break;
        }
        return Flow::Normal;
    }

    void define_macro(const Node& n, Scope& sc) {
        const Node* node = &n;
        Scope* defining = &sc;
        sc.vars[n.name] = Value::function(n.name, [this, node, defining](Args& args, Kwargs& kwargs) -> Value {
            Scope call{defining, {}};
            for (size_t i = 0; i < node->params.size(); i++) {
                const auto& [pname, def] = node->params[i];
                const Value* given = nullptr;
                if (i < args.size()) given = &args[i];
                for (const auto& [k, v] : kwargs)
                    if (k == pname) given = &v;
                if (given) call.vars[pname] = *given;
                else if (def) call.vars[pname] = eval(*def, call);
                else call.vars[pname] = Value::undefined();
            }
            std::string s;
            exec(node->body, call, s);
            return ojson(s);
        });
    }

    Value eval(const Expr& e, Scope& sc) {
        switch (e.kind) {
            case Expr::Kind::Literal: return e.lit;
            case Expr::Kind::Name: {
                const Value* v = sc.find(e.name);
                return v ? *v : Value::undefined();
            }
            case Expr::Kind::List:
            case Expr::Kind::Tuple: {
                ojson arr = ojson::array();
                for (const ExprP& x : e.items) arr.push_back(data(eval(*x, sc), x->line));
                return arr;
            }
            case Expr::Kind::Dict: {
                ojson obj = ojson::object();
                for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
                    Value k = eval(*e.items[i], sc);
                    if (!k.is_string()) runtime_error(e.line, "dict keys must be strings");
                    obj[k.str()] = data(eval(*e.items[i + 1], sc), e.line);
                }
                return obj;
            }
            case Expr::Kind::Attr: return get_attr(eval(*e.a, sc), e.name, e.line);
            case Expr::Kind::Index: return get_item(eval(*e.a, sc), eval(*e.b, sc), e.line);
            case Expr::Kind::Slice:
                return slice(eval(*e.a, sc), e.b ? eval(*e.b, sc) : Value(), e.c ? eval(*e.c, sc) : Value(),
                             e.d ? eval(*e.d, sc) : Value(), e.line);
            case Expr::Kind::Call: {
                Value f = eval(*e.a, sc);
                Args args;
                Kwargs kwargs;
                for (const ExprP& x : e.items) args.push_back(eval(*x, sc));
                for (const auto& [k, x] : e.kwargs) kwargs.emplace_back(k, eval(*x, sc));
                if (f.k != Value::K::Fn) {
                    const std::string what = e.a->kind == Expr::Kind::Name ? e.a->name
                                             : e.a->kind == Expr::Kind::Attr ? e.a->name
                                                                             : "expression";
                    runtime_error(e.line, "'" + what + "' is not callable");
                }
                return f.fn->fn(args, kwargs);
            }
            case Expr::Kind::Filter: {
                Value in = eval(*e.a, sc);
                Args args;
                Kwargs kwargs;
                for (const ExprP& x : e.items) args.push_back(eval(*x, sc));
                for (const auto& [k, x] : e.kwargs) kwargs.emplace_back(k, eval(*x, sc));
                return apply_filter(e.name, in, args, kwargs, e.line);
            }
            case Expr::Kind::Test: {
                Value in = eval(*e.a, sc);
                Args args;
                for (const ExprP& x : e.items) args.push_back(eval(*x, sc));
                return ojson(apply_test(e.name, in, args, e.line) != e.negate);
            }
            case Expr::Kind::Unary: {
                Value v = eval(*e.a, sc);
                if (e.name == "not") return ojson(!truthy(v));
                if (e.name == "-") return binary_op("-", ojson(0), v, e.line);
                return binary_op("+", ojson(0), v, e.line);
            }
            case Expr::Kind::Binary: return binary_op(e.name, eval(*e.a, sc), eval(*e.b, sc), e.line);
            case Expr::Kind::And: {
                Value l = eval(*e.a, sc);
                return truthy(l) ? eval(*e.b, sc) : l;
            }
            case Expr::Kind::Or: {
                Value l = eval(*e.a, sc);
                return truthy(l) ? l : eval(*e.b, sc);
            }
            case Expr::Kind::Cond:
                if (truthy(eval(*e.b, sc))) return eval(*e.a, sc);
                return e.c ? eval(*e.c, sc) : Value::undefined();
        }
        return Value::undefined();
    }

    static ojson data(const Value& v, int line) {
        if (v.is_data()) return v.j;
        if (v.is_undefined()) return ojson(nullptr);
        runtime_error(line, "namespaces and functions cannot be stored in lists or dicts");
    }

    Scope& root_;
};

Value fn_namespace(Args& args, Kwargs& kwargs) {
    Attrs attrs;
    for (const Value& a : args)
        if (a.is_dict())
            for (auto it = a.j.begin(); it != a.j.end(); ++it) attrs.emplace_back(it.key(), Value(it.value()));
    for (auto& [k, v] : kwargs) attrs.emplace_back(k, v);
    return Value::namespace_obj(std::move(attrs));
}

Value fn_range(Args& a, Kwargs&) {
    auto geti = [&](size_t i) { return a[i].is_int() ? a[i].j.get<int64_t>() : int64_t(0); };
    int64_t start = 0, stop = 0, step = 1;
    if (a.size() == 1) stop = geti(0);
    else if (a.size() >= 2) {
        start = geti(0);
        stop = geti(1);
        if (a.size() > 2) step = geti(2);
    }
    if (step == 0) fail("chat template: range() step cannot be zero");
    ojson out = ojson::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(i);
        if (out.size() > 100000) fail("chat template: range() too large");
    }
    return out;
}

Value fn_strftime_now(Args& a, Kwargs&) {
    const std::string fmt = !a.empty() && a[0].is_string() ? a[0].str() : "%Y-%m-%d";
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
#if defined(_WIN32)
    localtime_s(&tm, &t);
#else
    localtime_r(&t, &tm);
#endif
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return ojson(std::string(buf, n));
}

}  // namespace

Template::Template(const std::string& source) : prog_(std::make_unique<Program>(parse(source))) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const ojson& context) const {
    Scope root;
    root.vars["namespace"] = Value::function("namespace", fn_namespace);
    root.vars["range"] = Value::function("range", fn_range);
    root.vars["strftime_now"] = Value::function("strftime_now", fn_strftime_now);
    root.vars["raise_exception"] = Value::function("raise_exception", [](Args& a, Kwargs&) -> Value {
        fail("chat template: " + (a.empty() ? std::string("error") : to_str(a[0])));
    });
    if (context.is_object())
        for (auto it = context.begin(); it != context.end(); ++it) root.vars[it.key()] = Value(it.value());
    Renderer r(root);
    std::string out;
    r.exec(prog_->body, root, out);
    return out;
}

}  // namespace qinfer::chat::jinja
