// Jinja subset: lexer (tags, whitespace control) and recursive-descent parser.
#include <cctype>
#include <cstdlib>

#include "chat/jinja_ast.h"
#include "common/error.h"

namespace qinfer::chat::jinja {

namespace {

[[noreturn]] void syntax_error(int line, const std::string& msg) {
    fail(strfmt("chat template: line %d: %s", line, msg.c_str()));
}

// ---------------------------------------------------------------- segments

struct Segment {
    enum class Kind { Text, Expr, Stmt } kind;
    std::string text;  // literal text, or the tag's inner source
    int line;
};

int line_at(const std::string& s, size_t pos) {
    int line = 1;
    for (size_t i = 0; i < pos && i < s.size(); i++) line += s[i] == '\n';
    return line;
}

// Finds the closing delimiter of a tag, skipping string literals.
size_t find_close(const std::string& s, size_t from, const char* close) {
    char quote = 0;
    for (size_t i = from; i + 1 < s.size(); i++) {
        const char c = s[i];
        if (quote) {
            if (c == '\\') i++;
            else if (c == quote) quote = 0;
            continue;
        }
        if (c == '\'' || c == '"') {
            quote = c;
            continue;
        }
        if (c == close[0] && s[i + 1] == close[1]) return i;
    }
    return std::string::npos;
}

std::vector<Segment> segment(const std::string& src) {
    std::vector<Segment> out;
    size_t pos = 0;
    bool strip_next = false, trim_newline = false;
    for (;;) {
        size_t start = pos;
        char type = 0;
        while ((start = src.find('{', start)) != std::string::npos) {
            if (start + 1 < src.size() && (src[start + 1] == '{' || src[start + 1] == '%' || src[start + 1] == '#')) {
                type = src[start + 1];
                break;
            }
            start++;
        }
        std::string text = src.substr(pos, start == std::string::npos ? std::string::npos : start - pos);
        if (strip_next) {
            size_t i = 0;
            while (i < text.size() && std::isspace((unsigned char)text[i])) i++;
            text.erase(0, i);
        } else if (trim_newline) {
            if (text.rfind("\r\n", 0) == 0) text.erase(0, 2);
            else if (!text.empty() && text[0] == '\n') text.erase(0, 1);
        }
        if (start == std::string::npos) {
            if (!text.empty()) out.push_back({Segment::Kind::Text, text, line_at(src, pos)});
            return out;
        }
        const char mod = start + 2 < src.size() ? src[start + 2] : 0;
        if (mod == '-') {
            size_t e = text.size();
            while (e > 0 && std::isspace((unsigned char)text[e - 1])) e--;
            text.erase(e);
        } else if (mod != '+' && type != '{') {
            // lstrip_blocks: spaces/tabs between a line start and a block tag go.
            size_t ws = start;
            while (ws > pos && (src[ws - 1] == ' ' || src[ws - 1] == '\t')) ws--;
            if (ws == 0 || src[ws - 1] == '\n') {
                if (ws >= pos) text.erase(text.size() - (start - ws));
            }
        }
        if (!text.empty()) out.push_back({Segment::Kind::Text, text, line_at(src, pos)});

        const int line = line_at(src, start);
        const char* close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
        size_t inner = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
        size_t end = type == '#' ? src.find("#}", inner) : find_close(src, inner, close);
        if (end == std::string::npos) syntax_error(line, strfmt("unclosed '{%c'", type));
        const bool right_strip = end > inner && src[end - 1] == '-';
        const bool right_keep = end > inner && src[end - 1] == '+';
        std::string body = src.substr(inner, end - inner - ((right_strip || right_keep) ? 1 : 0));
        if (type == '{') out.push_back({Segment::Kind::Expr, body, line});
        if (type == '%') out.push_back({Segment::Kind::Stmt, body, line});
        strip_next = right_strip;
        trim_newline = !right_strip && !right_keep && type != '{';
        pos = end + 2;
    }
}

// ---------------------------------------------------------------- tokens

struct Token {
    enum class Kind { Name, String, Int, Float, Op, End } kind;
    std::string text;
    ojson value;
};

std::vector<Token> tokenize(const std::string& s, int line) {
    std::vector<Token> toks;
    size_t i = 0;
    while (i < s.size()) {
        const char c = s[i];
        if (std::isspace((unsigned char)c)) {
            i++;
            continue;
        }
        if (std::isalpha((unsigned char)c) || c == '_') {
            size_t j = i;
            while (j < s.size() && (std::isalnum((unsigned char)s[j]) || s[j] == '_')) j++;
            toks.push_back({Token::Kind::Name, s.substr(i, j - i), {}});
            i = j;
            continue;
        }
        if (std::isdigit((unsigned char)c)) {
            size_t j = i;
            while (j < s.size() && (std::isdigit((unsigned char)s[j]) || s[j] == '_')) j++;
            bool is_float = false;
            if (j + 1 < s.size() && s[j] == '.' && std::isdigit((unsigned char)s[j + 1])) {
                is_float = true;
                j++;
                while (j < s.size() && std::isdigit((unsigned char)s[j])) j++;
            }
            if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < s.size() && (s[k] == '+' || s[k] == '-')) k++;
                if (k < s.size() && std::isdigit((unsigned char)s[k])) {
                    is_float = true;
                    j = k;
                    while (j < s.size() && std::isdigit((unsigned char)s[j])) j++;
                }
            }
            std::string num;
            for (size_t k = i; k < j; k++)
                if (s[k] != '_') num += s[k];
            Token t{is_float ? Token::Kind::Float : Token::Kind::Int, num, {}};
            t.value = is_float ? ojson(std::strtod(num.c_str(), nullptr)) : ojson(std::strtoll(num.c_str(), nullptr, 10));
            toks.push_back(t);
            i = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            std::string v;
            size_t j = i + 1;
            for (; j < s.size() && s[j] != c; j++) {
                if (s[j] != '\\' || j + 1 == s.size()) {
                    v += s[j];
                    continue;
                }
                const char e = s[++j];
                switch (e) {
                    case 'n': v += '\n'; break;
                    case 't': v += '\t'; break;
                    case 'r': v += '\r'; break;
                    case '\\': v += '\\'; break;
                    case '\'': v += '\''; break;
                    case '"': v += '"'; break;
                    default: v += '\\'; v += e; break;
                }
            }
            if (j >= s.size()) syntax_error(line, "unterminated string literal");
            toks.push_back({Token::Kind::String, v, ojson(v)});
            i = j + 1;
            continue;
        }
        static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                     "=",  "|",  ".",  ",",  ":",  "(",  ")", "[", "]", "{", "}"};
        bool matched = false;
        for (const char* op : kOps) {
            const size_t n = std::char_traits<char>::length(op);
            if (s.compare(i, n, op) == 0) {
                toks.push_back({Token::Kind::Op, op, {}});
                i += n;
                matched = true;
                break;
            }
        }
        if (!matched) syntax_error(line, strfmt("unexpected character '%c'", c));
    }
    toks.push_back({Token::Kind::End, "", {}});
    return toks;
}

// ---------------------------------------------------------------- expressions

class ExprParser {
public:
    ExprParser(std::vector<Token> toks, int line) : t_(std::move(toks)), line_(line) {}

    const Token& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
    bool at_end() const { return peek().kind == Token::Kind::End; }
    bool is_op(const char* op, size_t k = 0) const { return peek(k).kind == Token::Kind::Op && peek(k).text == op; }
    bool is_name(const char* n, size_t k = 0) const { return peek(k).kind == Token::Kind::Name && peek(k).text == n; }
    bool skip_op(const char* op) {
        if (!is_op(op)) return false;
        p_++;
        return true;
    }
    bool skip_name(const char* n) {
        if (!is_name(n)) return false;
        p_++;
        return true;
    }
    void expect_op(const char* op) {
        if (!skip_op(op)) error(strfmt("expected '%s'", op));
    }
    std::string expect_name() {
        if (peek().kind != Token::Kind::Name) error("expected a name");
        return t_[p_++].text;
    }
    void expect_end() {
        if (!at_end()) error(strfmt("unexpected '%s'", peek().text.c_str()));
    }
    [[noreturn]] void error(const std::string& msg) const {
        syntax_error(line_, msg + (at_end() ? " at end of tag" : strfmt(" near '%s'", peek().text.c_str())));
    }

    ExprP make(Expr::Kind k) const { return std::make_unique<Expr>(k, line_); }

    ExprP expression() { return cond(); }

    // An expression without inline if (for-loop iterables, where `if` filters).
    ExprP or_expr() {
        ExprP l = and_expr();
        while (skip_name("or")) {
            ExprP e = make(Expr::Kind::Or);
            e->a = std::move(l);
            e->b = and_expr();
            l = std::move(e);
        }
        return l;
    }

    // Comma-separated expressions; more than one (or a trailing comma) is a tuple.
    ExprP tuple_or_expr(bool with_cond = true) {
        ExprP first = with_cond ? expression() : or_expr();
        if (!is_op(",")) return first;
        ExprP t = make(Expr::Kind::Tuple);
        t->items.push_back(std::move(first));
        while (skip_op(",")) {
            if (at_end() || is_op(")") || is_op("%")) break;
            t->items.push_back(with_cond ? expression() : or_expr());
        }
        return t;
    }

private:
    ExprP cond() {
        ExprP then = or_expr();
        while (skip_name("if")) {
            ExprP e = make(Expr::Kind::Cond);
            e->a = std::move(then);
            e->b = or_expr();
            if (skip_name("else")) e->c = cond();
            then = std::move(e);
        }
        return then;
    }
    ExprP and_expr() {
        ExprP l = not_expr();
        while (skip_name("and")) {
            ExprP e = make(Expr::Kind::And);
            e->a = std::move(l);
            e->b = not_expr();
            l = std::move(e);
        }
        return l;
    }
    ExprP not_expr() {
        if (skip_name("not")) {
            ExprP e = make(Expr::Kind::Unary);
            e->name = "not";
            e->a = not_expr();
            return e;
        }
        return compare();
    }
    // Chained comparisons mean what they do in Python: a < b < c is
    // (a < b) and (b < c).
    ExprP compare() {
        ExprP l = math1();
        const Expr* last_right = nullptr;
        for (;;) {
            std::string op;
            if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">=")) {
                op = peek().text;
                p_++;
            } else if (is_name("in")) {
                op = "in";
                p_++;
            } else if (is_name("not") && is_name("in", 1)) {
                op = "not in";
                p_ += 2;
            } else {
                return l;
            }
            ExprP e = make(Expr::Kind::Binary);
            e->name = op;
            if (last_right) {
                // The shared middle operand is evaluated twice (from a copy of
                // its tree); template expressions have no side effects.
                e->a = clone(*last_right);
                e->b = math1();
                last_right = e->b.get();
                ExprP both = make(Expr::Kind::And);
                both->a = std::move(l);
                both->b = std::move(e);
                l = std::move(both);
            } else {
                e->a = std::move(l);
                e->b = math1();
                last_right = e->b.get();
                l = std::move(e);
            }
        }
    }
    static ExprP clone(const Expr& x) {
        auto c = std::make_unique<Expr>(x.kind, x.line);
        c->lit = x.lit;
        c->name = x.name;
        c->negate = x.negate;
        for (const ExprP& i : x.items) c->items.push_back(clone(*i));
        for (const auto& [k, v] : x.kwargs) c->kwargs.emplace_back(k, clone(*v));
        if (x.a) c->a = clone(*x.a);
        if (x.b) c->b = clone(*x.b);
        if (x.c) c->c = clone(*x.c);
        if (x.d) c->d = clone(*x.d);
        return c;
    }
    ExprP binary_chain(ExprP (ExprParser::*next)(), std::initializer_list<const char*> ops) {
        ExprP l = (this->*next)();
        for (;;) {
            const char* hit = nullptr;
            for (const char* op : ops)
                if (is_op(op)) hit = op;
            if (!hit) return l;
            p_++;
            ExprP e = make(Expr::Kind::Binary);
            e->name = hit;
            e->a = std::move(l);
            e->b = (this->*next)();
            l = std::move(e);
        }
    }
    ExprP math1() { return binary_chain(&ExprParser::concat, {"+", "-"}); }
    ExprP concat() { return binary_chain(&ExprParser::math2, {"~"}); }
    ExprP math2() { return binary_chain(&ExprParser::power, {"*", "/", "//", "%"}); }
    ExprP power() { return binary_chain(&ExprParser::unary_f, {"**"}); }
    ExprP unary_f() { return unary(true); }
    // As in Jinja2, filters apply to the whole unary expression: -3|abs is 3.
    ExprP unary(bool with_filters = true) {
        ExprP x;
        if (is_op("-") || is_op("+")) {
            x = make(Expr::Kind::Unary);
            x->name = peek().text;
            p_++;
            x->a = unary(false);
        } else {
            x = postfix(primary());
        }
        return with_filters ? filters(std::move(x)) : std::move(x);
    }
    void call_args(Expr& e) {
        // after '('
        if (skip_op(")")) return;
        for (;;) {
            if (peek().kind == Token::Kind::Name && is_op("=", 1)) {
                std::string k = expect_name();
                p_++;
                e.kwargs.emplace_back(k, expression());
            } else {
                e.items.push_back(expression());
            }
            if (skip_op(")")) return;
            expect_op(",");
        }
    }
    ExprP filters(ExprP x) {
        for (;;) {
            if (skip_op("|")) {
                ExprP f = make(Expr::Kind::Filter);
                f->name = expect_name();
                f->a = std::move(x);
                if (skip_op("(")) call_args(*f);
                x = postfix(std::move(f));
            } else if (skip_name("is")) {
                ExprP t = make(Expr::Kind::Test);
                t->negate = skip_name("not");
                t->name = expect_name();
                t->a = std::move(x);
                if (skip_op("(")) {
                    call_args(*t);
                } else if (!at_end() && (peek().kind == Token::Kind::String || peek().kind == Token::Kind::Int ||
                                         peek().kind == Token::Kind::Float ||
                                         (peek().kind == Token::Kind::Name && !is_name("and") && !is_name("or") &&
                                          !is_name("else") && !is_name("if") && !is_name("in") && !is_name("not") &&
                                          !is_name("is")))) {
                    // `x is divisibleby 3`, `x is sameas none`: one bare argument.
                    t->items.push_back(primary());
                }
                x = std::move(t);
            } else {
                return x;
            }
        }
    }
    ExprP postfix(ExprP x) {
        for (;;) {
            if (skip_op(".")) {
                ExprP e = make(Expr::Kind::Attr);
                if (peek().kind == Token::Kind::Int) {
                    e = make(Expr::Kind::Index);
                    e->a = std::move(x);
                    e->b = make(Expr::Kind::Literal);
                    e->b->lit = t_[p_++].value;
                } else {
                    e->name = expect_name();
                    e->a = std::move(x);
                }
                x = std::move(e);
            } else if (skip_op("[")) {
                ExprP lo, hi, step;
                bool slice = false;
                if (!is_op(":")) lo = expression();
                if (skip_op(":")) {
                    slice = true;
                    if (!is_op(":") && !is_op("]")) hi = expression();
                    if (skip_op(":") && !is_op("]")) step = expression();
                }
                expect_op("]");
                ExprP e = make(slice ? Expr::Kind::Slice : Expr::Kind::Index);
                e->a = std::move(x);
                e->b = std::move(lo);
                e->c = std::move(hi);
                e->d = std::move(step);
                x = std::move(e);
            } else if (skip_op("(")) {
                ExprP e = make(Expr::Kind::Call);
                e->a = std::move(x);
                call_args(*e);
                x = std::move(e);
            } else {
                return x;
            }
        }
    }
    ExprP primary() {
        const Token& t = peek();
        if (t.kind == Token::Kind::String) {
            // Adjacent string literals concatenate.
            std::string s;
            while (peek().kind == Token::Kind::String) s += t_[p_++].text;
            ExprP e = make(Expr::Kind::Literal);
            e->lit = s;
            return e;
        }
        if (t.kind == Token::Kind::Int || t.kind == Token::Kind::Float) {
            ExprP e = make(Expr::Kind::Literal);
            e->lit = t.value;
            p_++;
            return e;
        }
        if (t.kind == Token::Kind::Name) {
            p_++;
            ExprP e = make(Expr::Kind::Literal);
            if (t.text == "true" || t.text == "True") e->lit = true;
            else if (t.text == "false" || t.text == "False") e->lit = false;
            else if (t.text == "none" || t.text == "None") e->lit = nullptr;
            else {
                e = make(Expr::Kind::Name);
                e->name = t.text;
            }
            return e;
        }
        if (skip_op("(")) {
            if (skip_op(")")) return make(Expr::Kind::Tuple);
            ExprP e = tuple_or_expr();
            expect_op(")");
            return e;
        }
        if (skip_op("[")) {
            ExprP e = make(Expr::Kind::List);
            while (!skip_op("]")) {
                e->items.push_back(expression());
                if (!is_op("]")) expect_op(",");
            }
            return e;
        }
        if (skip_op("{")) {
            ExprP e = make(Expr::Kind::Dict);
            while (!skip_op("}")) {
                e->items.push_back(expression());
                expect_op(":");
                e->items.push_back(expression());
                if (!is_op("}")) expect_op(",");
            }
            return e;
        }
        error("expected an expression");
    }

    std::vector<Token> t_;
    size_t p_ = 0;
    int line_;
};

// ---------------------------------------------------------------- statements

class StmtParser {
public:
    explicit StmtParser(std::vector<Segment> segs) : s_(std::move(segs)) {}

    Body parse_all() {
        std::string end;
        Body b = parse_body({}, &end);
        return b;
    }

private:
    static std::string keyword(const Segment& seg) {
        size_t i = 0;
        while (i < seg.text.size() && std::isspace((unsigned char)seg.text[i])) i++;
        size_t j = i;
        while (j < seg.text.size() && (std::isalnum((unsigned char)seg.text[j]) || seg.text[j] == '_')) j++;
        return seg.text.substr(i, j - i);
    }

    // Parses nodes until one of `ends` (a statement keyword); returns it via *end.
    Body parse_body(std::initializer_list<const char*> ends, std::string* end) {
        Body body;
        while (i_ < s_.size()) {
            const Segment& seg = s_[i_];
            if (seg.kind == Segment::Kind::Text) {
                auto n = std::make_unique<Node>(Node::Kind::Text, seg.line);
                n->text = seg.text;
                body.push_back(std::move(n));
                i_++;
                continue;
            }
            if (seg.kind == Segment::Kind::Expr) {
                ExprParser p(tokenize(seg.text, seg.line), seg.line);
                auto n = std::make_unique<Node>(Node::Kind::Output, seg.line);
                n->expr = p.expression();
                p.expect_end();
                body.push_back(std::move(n));
                i_++;
                continue;
            }
            const std::string kw = keyword(seg);
            for (const char* e : ends) {
                if (kw == e) {
                    *end = kw;
                    return body;
                }
            }
            body.push_back(statement(kw, seg));
        }
        if (ends.size() > 0) syntax_error(s_.empty() ? 1 : s_.back().line, strfmt("missing '%s'", *(ends.end() - 1)));
        *end = "";
        return body;
    }

    NodeP statement(const std::string& kw, const Segment& seg) {
        ExprParser p(tokenize(seg.text, seg.line), seg.line);
        p.expect_name();  // the keyword
        i_++;
        if (kw == "if") return parse_if(p, seg);
        if (kw == "for") return parse_for(p, seg);
        if (kw == "set") return parse_set(p, seg);
        if (kw == "macro") return parse_macro(p, seg);
        if (kw == "break" || kw == "continue") {
            p.expect_end();
            return std::make_unique<Node>(kw == "break" ? Node::Kind::Break : Node::Kind::Continue, seg.line);
        }
        if (kw == "generation") {
            // HF's {% generation %} marks assistant text for training masks; it renders as its content.
            p.expect_end();
            auto n = std::make_unique<Node>(Node::Kind::If, seg.line);
            auto yes = std::make_unique<Expr>(Expr::Kind::Literal, seg.line);
            yes->lit = true;
            std::string end;
            n->branches.emplace_back(std::move(yes), parse_body({"endgeneration"}, &end));
            end_tag();
            return n;
        }
        syntax_error(seg.line, strfmt("unsupported statement '%s'", kw.c_str()));
    }

    void end_tag() {
        const Segment& seg = s_[i_];
        ExprParser p(tokenize(seg.text, seg.line), seg.line);
        p.expect_name();
        p.expect_end();
        i_++;
    }

    NodeP parse_if(ExprParser& p, const Segment& seg) {
        auto n = std::make_unique<Node>(Node::Kind::If, seg.line);
        ExprP c = p.expression();
        p.expect_end();
        for (;;) {
            std::string end;
            Body b = parse_body({"elif", "else", "endif"}, &end);
            n->branches.emplace_back(std::move(c), std::move(b));
            const Segment& es = s_[i_];
            ExprParser q(tokenize(es.text, es.line), es.line);
            q.expect_name();
            i_++;
            if (end == "endif") {
                q.expect_end();
                return n;
            }
            if (end == "else") {
                q.expect_end();
                Body eb = parse_body({"endif"}, &end);
                n->branches.emplace_back(nullptr, std::move(eb));
                end_tag();
                return n;
            }
            c = q.expression();  // elif
            q.expect_end();
        }
    }

    NodeP parse_for(ExprParser& p, const Segment& seg) {
        auto n = std::make_unique<Node>(Node::Kind::For, seg.line);
        n->targets.push_back(p.expect_name());
        while (p.skip_op(",")) n->targets.push_back(p.expect_name());
        if (!p.skip_name("in")) p.error("expected 'in'");
        n->expr = p.tuple_or_expr(false);
        if (p.skip_name("if")) n->filter = p.or_expr();
        if (p.skip_name("recursive")) p.error("recursive loops are not supported");
        p.expect_end();
        std::string end;
        n->body = parse_body({"else", "endfor"}, &end);
        if (end == "else") {
            end_tag();
            n->else_body = parse_body({"endfor"}, &end);
        }
        end_tag();
        return n;
    }

    NodeP parse_set(ExprParser& p, const Segment& seg) {
        std::string first = p.expect_name();
        if (p.skip_op(".")) {
            auto n = std::make_unique<Node>(Node::Kind::Set, seg.line);
            n->targets.push_back(first);
            n->attr = p.expect_name();
            p.expect_op("=");
            n->expr = p.tuple_or_expr();
            p.expect_end();
            return n;
        }
        std::vector<std::string> names{first};
        while (p.skip_op(",")) names.push_back(p.expect_name());
        if (p.at_end() && names.size() == 1) {
            auto n = std::make_unique<Node>(Node::Kind::SetBlock, seg.line);
            n->targets = names;
            std::string end;
            n->body = parse_body({"endset"}, &end);
            end_tag();
            return n;
        }
        auto n = std::make_unique<Node>(Node::Kind::Set, seg.line);
        n->targets = names;
        p.expect_op("=");
        n->expr = p.tuple_or_expr();
        p.expect_end();
        return n;
    }

    NodeP parse_macro(ExprParser& p, const Segment& seg) {
        auto n = std::make_unique<Node>(Node::Kind::Macro, seg.line);
        n->name = p.expect_name();
        p.expect_op("(");
        while (!p.skip_op(")")) {
            std::string param = p.expect_name();
            ExprP def;
            if (p.skip_op("=")) def = p.expression();
            n->params.emplace_back(param, std::move(def));
            if (!p.is_op(")")) p.expect_op(",");
        }
        p.expect_end();
        std::string end;
        n->body = parse_body({"endmacro"}, &end);
        end_tag();
        return n;
    }

    std::vector<Segment> s_;
    size_t i_ = 0;
};

}  // namespace

Program parse(const std::string& source) {
    StmtParser sp(segment(source));
    Program prog;
    prog.body = sp.parse_all();
    return prog;
}

}  // namespace qinfer::chat::jinja
