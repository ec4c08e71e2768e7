// Syntax tree of a parsed Jinja template (internal to chat/jinja_*.cpp).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/pytext.h"

namespace qinfer::chat::jinja {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
    enum class Kind {
        Literal,   // lit
        Name,      // name
        List,      // items
        Tuple,     // items
        Dict,      // items = k0, v0, k1, v1, ...
        Attr,      // a.name
        Index,     // a[b]
        Slice,     // a[b:c:d] (missing parts are null)
        Call,      // a(items, kwargs)
        Filter,    // a | name(items, kwargs)
        Test,      // a is [not] name(items)
        Unary,     // name a   (name: "-", "+", "not")
        Binary,    // a name b (+ - * / // % ** ~ == != < > <= >= in "not in")
        And,
        Or,
        Cond,      // a if b else c
    };
    Kind kind;
    int line = 0;
    ojson lit;
    std::string name;
    bool negate = false;
    std::vector<ExprP> items;
    std::vector<std::pair<std::string, ExprP>> kwargs;
    ExprP a, b, c, d;
    Expr(Kind k, int l) : kind(k), line(l) {}
};

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

struct Node {
    enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue };
    Kind kind;
    int line = 0;
    std::string text;                              // Text
    ExprP expr;                                    // Output; For: iterable; Set: value
    std::vector<std::pair<ExprP, Body>> branches;  // If: (condition or null for else, body)
    std::vector<std::string> targets;              // For/Set: names (Set with attr: the object name)
    std::string attr;                              // Set: ns.attr target
    ExprP filter;                                  // For: inline `if`
    Body body, else_body;                          // For, SetBlock, Macro
    std::string name;                              // Macro
    std::vector<std::pair<std::string, ExprP>> params;  // Macro parameters and defaults
    Node(Kind k, int l) : kind(k), line(l) {}
};

struct Program {
    Body body;
};

Program parse(const std::string& source);

}  // namespace qinfer::chat::jinja
