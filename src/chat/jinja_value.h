// Runtime values of the Jinja subset (internal to chat/jinja_*.cpp).
// Data is JSON (what chat templates receive); namespaces (mutable, shared by
// reference, like Jinja's namespace() and loop objects) and callables
// (macros, globals, bound string/dict methods) are separate kinds.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/pytext.h"

namespace qinfer::chat::jinja {

struct Value;
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Attrs = std::vector<std::pair<std::string, Value>>;

struct Callable {
    std::string name;
    std::function<Value(Args&, Kwargs&)> fn;
};

struct Value {
    enum class K { Undefined, Data, Ns, Fn };
    K k = K::Undefined;
    ojson j;
    std::shared_ptr<Attrs> ns;
    std::shared_ptr<const Callable> fn;

    Value() = default;
    Value(ojson v) : k(K::Data), j(std::move(v)) {}  // NOLINT: implicit on purpose
    static Value undefined() { return Value(); }
    static Value namespace_obj(Attrs a) {
        Value v;
        v.k = K::Ns;
        v.ns = std::make_shared<Attrs>(std::move(a));
        return v;
    }
    static Value function(std::string name, std::function<Value(Args&, Kwargs&)> f) {
        Value v;
        v.k = K::Fn;
        v.fn = std::make_shared<const Callable>(Callable{std::move(name), std::move(f)});
        return v;
    }

    bool is_undefined() const { return k == K::Undefined; }
    bool is_data() const { return k == K::Data; }
    bool is_string() const { return k == K::Data && j.is_string(); }
    bool is_number() const { return k == K::Data && j.is_number(); }
    bool is_int() const { return k == K::Data && j.is_number_integer(); }
    bool is_list() const { return k == K::Data && j.is_array(); }
    bool is_dict() const { return k == K::Data && j.is_object(); }
    bool is_none() const { return k == K::Data && j.is_null(); }
    const std::string& str() const { return j.get_ref<const std::string&>(); }

    // Namespace attribute (nullptr if absent).
    Value* attr(const std::string& name) const {
        if (!ns) return nullptr;
        for (auto& [k2, v] : *ns)
            if (k2 == name) return &v;
        return nullptr;
    }
    void set_attr(const std::string& name, Value v) {
        if (Value* a = attr(name)) *a = std::move(v);
        else ns->emplace_back(name, std::move(v));
    }
};

}  // namespace qinfer::chat::jinja
