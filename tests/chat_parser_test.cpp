// Output parser: reasoning / content / tool calls, whole and streamed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chat/output_parser.h"
#include "sampling/rng.h"

using namespace qinfer;
using namespace qinfer::chat;

namespace {

OutputParser::Options opts(bool in_reasoning = false, bool xml = false, std::string tools = "") {
    OutputParser::Options o;
    o.start_in_reasoning = in_reasoning;
    o.xml_tool_calls = xml;
    o.tools_json = std::move(tools);
    return o;
}

// Feeds `text` in pieces cut at the given positions; returns the joined deltas.
ParsedDelta streamed(const std::string& text, const OutputParser::Options& o, const std::vector<size_t>& cuts) {
    OutputParser p(o);
    ParsedDelta all;
    size_t prev = 0;
    auto add = [&](const ParsedDelta& d) {
        all.reasoning += d.reasoning;
        all.content += d.content;
        all.tool_calls.insert(all.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    };
    for (size_t c : cuts) {
        add(p.push(std::string_view(text).substr(prev, c - prev)));
        prev = c;
    }
    add(p.push(std::string_view(text).substr(prev)));
    add(p.finish());
    EXPECT_EQ(p.reasoning(), all.reasoning);
    EXPECT_EQ(p.content(), all.content);
    return all;
}

void expect_same(const ParsedDelta& a, const ParsedDelta& b, const std::string& what) {
    EXPECT_EQ(a.reasoning, b.reasoning) << what;
    EXPECT_EQ(a.content, b.content) << what;
    ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
    for (size_t i = 0; i < a.tool_calls.size(); i++) {
        EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
        EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
    }
}

}  // namespace

TEST(OutputParser, Qwen3ThinkThenAnswer) {
    auto d = parse_output("<think>\nLet me think.\nMore.\n</think>\n\nHello!", opts());
    EXPECT_EQ(d.reasoning, "Let me think.\nMore.");
    EXPECT_EQ(d.content, "Hello!");
    EXPECT_TRUE(d.tool_calls.empty());
}

TEST(OutputParser, EmptyThinkBlock) {
    auto d = parse_output("<think>\n\n</think>\n\nHi there", opts());
    EXPECT_EQ(d.reasoning, "");
    EXPECT_EQ(d.content, "Hi there");
}

TEST(OutputParser, StartsInReasoningForQwen35Prompts) {
    auto d = parse_output("The user greets.\n</think>\n\nHello!", opts(true));
    EXPECT_EQ(d.reasoning, "The user greets.");
    EXPECT_EQ(d.content, "Hello!");
    // Cut off while thinking: everything is reasoning.
    auto cut = parse_output("still thinking\n", opts(true));
    EXPECT_EQ(cut.reasoning, "still thinking");
    EXPECT_EQ(cut.content, "");
}

TEST(OutputParser, PlainContentAndLookalikeTags) {
    EXPECT_EQ(parse_output("Hello", opts()).content, "Hello");
    EXPECT_EQ(parse_output("a <thing> b </think c", opts()).content, "a <thing> b </think c");
    EXPECT_EQ(parse_output("ends with <tool_ca", opts()).content, "ends with <tool_ca");
    EXPECT_EQ(parse_output("<thin", opts()).content, "<thin");
    // Only a leading <think> opens reasoning.
    EXPECT_EQ(parse_output("x <think>y</think>", opts()).content, "x <think>y</think>");
}

TEST(OutputParser, ReasoningDisabledKeepsTags) {
    OutputParser::Options o = opts();
    o.parse_reasoning = false;
    auto d = parse_output("<think>\nr\n</think>\n\nA", o);
    EXPECT_EQ(d.content, "<think>\nr\n</think>\n\nA");
    EXPECT_EQ(d.reasoning, "");
}

TEST(OutputParser, Qwen3JsonToolCalls) {
    auto d = parse_output(
        "<think>\nneed weather\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
        "{}}\n</tool_call>",
        opts());
    EXPECT_EQ(d.reasoning, "need weather");
    EXPECT_EQ(d.content, "Let me check.");
    ASSERT_EQ(d.tool_calls.size(), 2u);
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(d.tool_calls[0].arguments, R"({"city":"Paris","days":2})");
    EXPECT_EQ(d.tool_calls[1].name, "get_time");
    EXPECT_EQ(d.tool_calls[1].arguments, "{}");
}

TEST(OutputParser, Qwen35XmlToolCall) {
    const std::string text =
        "I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n<parameter=opts>\n{\"unit\": \"C\"}\n</parameter>\n"
        "<parameter=note>\nline1\nline2\n</parameter>\n</function>\n</tool_call>";
    auto d = parse_output(text, opts(false, true));
    EXPECT_EQ(d.content, "I'll check.");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(d.tool_calls[0].arguments, R"({"location":"Paris","days":2,"opts":{"unit":"C"},"note":"line1\nline2"})");
    // With a schema saying "days" is a string, the raw text is kept.
    const std::string tools =
        R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"days":{"type":"string"}}}}}])";
    auto s = parse_output(text, opts(false, true, tools));
    EXPECT_EQ(s.tool_calls[0].arguments, R"({"location":"Paris","days":"2","opts":{"unit":"C"},"note":"line1\nline2"})");
}

TEST(OutputParser, ToolCallEndsReasoningInXmlMode) {
    auto d = parse_output("need a tool\n<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n</function>\n</tool_call>",
                          opts(true, true));
    EXPECT_EQ(d.reasoning, "need a tool");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].arguments, R"({"a":"x"})");
}

TEST(OutputParser, UnterminatedAndBrokenToolCalls) {
    auto d = parse_output("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", opts());
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].arguments, R"({"a":1})");
    auto bad = parse_output("see <tool_call> not json </tool_call> ok", opts());
    EXPECT_TRUE(bad.tool_calls.empty());
    EXPECT_EQ(bad.content, "see <tool_call> not json </tool_call> ok");
    auto cut = parse_output("<tool_call>\n{\"name\": \"f\", \"argu", opts());
    EXPECT_TRUE(cut.tool_calls.empty());
    EXPECT_EQ(cut.content, "<tool_call>\n{\"name\": \"f\", \"argu");
}

TEST(OutputParser, StreamingGivesTheSameResultForAnySplit) {
    const std::vector<std::pair<std::string, OutputParser::Options>> cases = {
        {"<think>\nLet me think.\n\n</think>\n\nHello!\n", opts()},
        {"  <think>\nr\n</think>\n\nA<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"<think>\"}}\n</tool_call>\n\n"
         "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>", opts()},
        {"reasoning </thin still\n</think>\n\n你好，世界 </tool_ a <tool_call>\n<function=f>\n<parameter=a>\n1\n"
         "</parameter>\n</function>\n</tool_call>", opts(true, true)},
        {"plain text with < and </ and <t", opts()},
    };
    Rng rng(3);
    for (const auto& [text, o] : cases) {
        const ParsedDelta whole = parse_output(text, o);
        // Every single split point, then byte by byte, then random splits.
        for (size_t c = 0; c <= text.size(); c++) expect_same(streamed(text, o, {c}), whole, text + " @" + std::to_string(c));
        std::vector<size_t> every;
        for (size_t c = 1; c < text.size(); c++) every.push_back(c);
        expect_same(streamed(text, o, every), whole, text + " bytewise");
        for (int trial = 0; trial < 50; trial++) {
            std::vector<size_t> cuts;
            for (size_t c = 1; c < text.size(); c++)
                if (rng.uniform() < 0.3) cuts.push_back(c);
            expect_same(streamed(text, o, cuts), whole, text + " random");
        }
    }
}

TEST(OutputParser, StreamedDeltasNeverShowPartialTags) {
    const std::string text = "<think>\nabc\n</think>\n\nxyz<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    OutputParser p(opts());
    for (char c : text) {
        ParsedDelta d = p.push(std::string(1, c));
        EXPECT_EQ(d.content.find('<'), std::string::npos) << d.content;
        EXPECT_EQ(d.reasoning.find('<'), std::string::npos) << d.reasoning;
    }
    p.finish();
    EXPECT_EQ(p.content(), "xyz");
    EXPECT_EQ(p.reasoning(), "abc");
    EXPECT_EQ(p.tool_calls().size(), 1u);
}
