#include "chat/output_parser.h"

#include <algorithm>

#include "chat/pytext.h"

namespace qinfer::chat {

namespace {

constexpr std::string_view kThink = "<think>";
constexpr std::string_view kEndThink = "</think>";
constexpr std::string_view kCall = "<tool_call>";
constexpr std::string_view kEndCall = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Longest k < tag.size() such that buf ends with the first k bytes of tag.
size_t partial_suffix(const std::string& buf, std::string_view tag) {
    for (size_t k = std::min(buf.size(), tag.size() - 1); k > 0; k--)
        if (buf.compare(buf.size() - k, k, tag.data(), k) == 0) return k;
    return 0;
}

// Splits s into (text up to its last non-whitespace char, trailing whitespace).
std::pair<std::string, std::string> split_trailing_ws(const std::string& s) {
    size_t e = s.size();
    while (e > 0 && is_ws(s[e - 1])) e--;
    return {s.substr(0, e), s.substr(e)};
}

void drop_leading_newlines(std::string& s) {
    size_t i = 0;
    while (i < s.size() && (s[i] == '\n' || s[i] == '\r')) i++;
    s.erase(0, i);
}

}  // namespace

OutputParser::OutputParser(Options opt) : opt_(std::move(opt)) {
    mode_ = opt_.start_in_reasoning && opt_.parse_reasoning ? Mode::Reasoning : Mode::Start;
    if (!opt_.tools_json.empty()) {
        try {
            const ojson tools = ojson::parse(opt_.tools_json);
            for (const ojson& t : tools) {
                const ojson& fn = t.contains("function") ? t["function"] : t;
                if (!fn.contains("name") || !fn.contains("parameters")) continue;
                const ojson& props = fn["parameters"].value("properties", ojson::object());
                for (auto it = props.begin(); it != props.end(); ++it)
                    if (it.value().is_object() && it.value().value("type", "") == "string")
                        string_params_.emplace_back(fn["name"].get<std::string>(), it.key());
            }
        } catch (const std::exception&) {
            // Schemas only refine value typing; without them values are typed by content.
        }
    }
}

void OutputParser::add_reasoning(std::string s, ParsedDelta& d) {
    if (s.empty()) return;
    reasoning_ += s;
    d.reasoning += s;
}

void OutputParser::add_content(std::string s, ParsedDelta& d) {
    if (s.empty()) return;
    content_ += s;
    d.content += s;
}

ParsedDelta OutputParser::push(std::string_view text) {
    ParsedDelta d;
    buf_.append(text);
    run(false, d);
    return d;
}

ParsedDelta OutputParser::finish() {
    ParsedDelta d;
    run(true, d);
    return d;
}

void OutputParser::run(bool final, ParsedDelta& d) {
    for (;;) {
        switch (mode_) {
            case Mode::Start: {
                if (!opt_.parse_reasoning) {
                    mode_ = Mode::Content;
                    strip_newlines_ = false;
                    continue;
                }
                size_t i = 0;
                while (i < buf_.size() && is_ws(buf_[i])) i++;
                if (i == buf_.size() && !final) return;
                const std::string_view rest = std::string_view(buf_).substr(i);
                if (rest.substr(0, kThink.size()) == kThink) {
                    buf_.erase(0, i + kThink.size());
                    mode_ = Mode::Reasoning;
                    strip_newlines_ = true;
                    continue;
                }
                if (!final && kThink.substr(0, rest.size()) == rest) return;  // maybe "<thi"
                mode_ = Mode::Content;
                strip_newlines_ = false;
                continue;
            }
            case Mode::Reasoning: {
                if (strip_newlines_) {
                    drop_leading_newlines(buf_);
                    if (buf_.empty() && !final) return;
                    strip_newlines_ = false;
                }
                size_t p = buf_.find(kEndThink);
                size_t tag = kEndThink.size();
                bool to_call = false;
                if (opt_.xml_tool_calls && opt_.parse_tool_calls) {
                    // Qwen3.5 may open a tool call without closing its reasoning.
                    const size_t q = buf_.find(kCall);
                    if (q < p) {
                        p = q;
                        tag = kCall.size();
                        to_call = true;
                    }
                }
                if (p != std::string::npos) {
                    add_reasoning(split_trailing_ws(ws_ + buf_.substr(0, p)).first, d);
                    ws_.clear();
                    buf_.erase(0, p + tag);
                    mode_ = to_call ? Mode::ToolCall : Mode::Content;
                    strip_newlines_ = true;
                    continue;
                }
                size_t hold = final ? 0 : partial_suffix(buf_, kEndThink);
                if (!final && opt_.xml_tool_calls && opt_.parse_tool_calls)
                    hold = std::max(hold, partial_suffix(buf_, kCall));
                auto [body, ws] = split_trailing_ws(ws_ + buf_.substr(0, buf_.size() - hold));
                add_reasoning(body, d);
                ws_ = final ? std::string() : ws;  // trailing whitespace of the reasoning is dropped
                buf_.erase(0, buf_.size() - hold);
                return;
            }
            case Mode::Content: {
                if (strip_newlines_) {
                    drop_leading_newlines(buf_);
                    if (buf_.empty() && !final) return;
                    strip_newlines_ = false;
                }
                if (!opt_.parse_tool_calls) {
                    add_content(std::exchange(buf_, {}), d);
                    return;
                }
                const size_t p = buf_.find(kCall);
                if (p != std::string::npos) {
                    // Whitespace between the content and a tool call is not content
                    // (kept aside in case the "call" does not parse).
                    auto [body, ws] = split_trailing_ws(ws_ + buf_.substr(0, p));
                    add_content(body, d);
                    pre_call_ws_ = ws;
                    ws_.clear();
                    buf_.erase(0, p + kCall.size());
                    mode_ = Mode::ToolCall;
                    continue;
                }
                const size_t hold = final ? 0 : partial_suffix(buf_, kCall);
                if (final) {
                    add_content(ws_ + buf_, d);
                    ws_.clear();
                    buf_.clear();
                    return;
                }
                auto [body, ws] = split_trailing_ws(ws_ + buf_.substr(0, buf_.size() - hold));
                add_content(body, d);
                ws_ = ws;
                buf_.erase(0, buf_.size() - hold);
                return;
            }
            case Mode::ToolCall: {
                const size_t p = buf_.find(kEndCall);
                if (p == std::string::npos && !final) return;
                const std::string block = buf_.substr(0, p);
                ToolCall tc;
                const bool ok = parse_call(block, tc);
                if (ok) {
                    calls_.push_back(tc);
                    d.tool_calls.push_back(tc);
                } else {
                    // Not a tool call after all: keep the text as it was.
                    add_content(pre_call_ws_ + std::string(kCall) + block +
                                    (p != std::string::npos ? std::string(kEndCall) : ""),
                                d);
                }
                pre_call_ws_.clear();
                buf_.erase(0, p == std::string::npos ? buf_.size() : p + kEndCall.size());
                mode_ = Mode::Content;
                strip_newlines_ = ok;
                if (final && buf_.empty()) return;
                continue;
            }
        }
    }
}

bool OutputParser::string_param(const std::string& fn, const std::string& param) const {
    return std::find(string_params_.begin(), string_params_.end(), std::make_pair(fn, param)) != string_params_.end();
}

bool OutputParser::parse_call(const std::string& block, ToolCall& out) const {
    const std::string t = py_strip(block);
    if (!t.empty() && t[0] == '{') {
        // Qwen3: {"name": "...", "arguments": {...}}
        ojson j;
        try {
            j = ojson::parse(t);
        } catch (const std::exception&) {
            return false;
        }
        if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
        out.name = j["name"].get<std::string>();
        const ojson args = j.contains("arguments") ? j["arguments"] : ojson::object();
        out.arguments = args.is_string() ? args.get<std::string>() : args.dump();
        return true;
    }
    // Qwen3.5: <function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>
    const std::string_view fn_tag = "<function=";
    if (t.compare(0, fn_tag.size(), fn_tag) != 0) return false;
    const size_t name_end = t.find('>', fn_tag.size());
    if (name_end == std::string::npos) return false;
    out.name = py_strip(t.substr(fn_tag.size(), name_end - fn_tag.size()));
    if (out.name.empty()) return false;
    ojson args = ojson::object();
    const std::string_view p_tag = "<parameter=";
    const std::string_view p_end = "</parameter>";
    size_t pos = name_end + 1;
    for (;;) {
        const size_t ps = t.find(p_tag, pos);
        if (ps == std::string::npos) break;
        const size_t ke = t.find('>', ps + p_tag.size());
        if (ke == std::string::npos) return false;
        const std::string key = t.substr(ps + p_tag.size(), ke - ps - p_tag.size());
        size_t vs = ke + 1;
        if (vs < t.size() && t[vs] == '\n') vs++;
        size_t ve = t.find(p_end, vs);
        if (ve == std::string::npos) return false;
        pos = ve + p_end.size();
        if (ve > vs && t[ve - 1] == '\n') ve--;
        const std::string value = t.substr(vs, ve - vs);
        if (string_param(out.name, key)) {
            args[key] = value;
        } else {
            try {
                args[key] = ojson::parse(value);
            } catch (const std::exception&) {
                args[key] = value;
            }
        }
    }
    out.arguments = args.dump();
    return true;
}

ParsedDelta parse_output(std::string_view text, const OutputParser::Options& opt) {
    OutputParser p(opt);
    ParsedDelta d = p.push(text);
    ParsedDelta f = p.finish();
    d.reasoning += f.reasoning;
    d.content += f.content;
    d.tool_calls.insert(d.tool_calls.end(), f.tool_calls.begin(), f.tool_calls.end());
    return d;
}

}  // namespace qinfer::chat
