// Chat rendering: the exact expected strings of spec/chat.md §4/§5, and a
// larger set of conversations rendered by Python Jinja2 (configured like HF
// transformers: sandboxed, trim_blocks, lstrip_blocks, tojson =
// json.dumps(ensure_ascii=False)) from the real Qwen3 and Qwen3.5 templates.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chat/chatml.h"
#include "chat/pytext.h"
#include "chat/template.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "testutil.h"

using namespace qinfer;
using namespace qinfer::chat;

namespace {

ChatMessage msg(std::string role, std::string content) {
    ChatMessage m;
    m.role = std::move(role);
    m.content = std::move(content);
    return m;
}

ChatMessage with_reasoning(ChatMessage m, std::string r) {
    m.reasoning_content = std::move(r);
    return m;
}

ChatMessage with_call(ChatMessage m, std::string name, std::string args) {
    m.tool_calls.push_back({"", std::move(name), std::move(args)});
    return m;
}

std::string render(const std::vector<ChatMessage>& m, Flavor f, bool gen = true, bool think = true,
                   std::string tools = "") {
    ChatOptions o;
    o.add_generation_prompt = gen;
    o.enable_thinking = think;
    o.tools_json = std::move(tools);
    return render_chatml(m, o, f);
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// ---- spec/chat.md §4 (Qwen3), exact strings from the table

TEST(ChatQwen3, SpecSystemUser) {
    EXPECT_EQ(render({msg("system", "You are helpful."), msg("user", "Hi")}, Flavor::Qwen3),
              "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n");
}

TEST(ChatQwen3, SpecNoThink) {
    EXPECT_EQ(render({msg("user", "Hi")}, Flavor::Qwen3, true, false),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatQwen3, SpecHistoryThinkDropped) {
    EXPECT_EQ(render({msg("user", "Hi"), msg("assistant", "<think>\nhmm\n</think>\n\nHello!"), msg("user", "Bye")},
                     Flavor::Qwen3),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
              "<|im_start|>assistant\n");
}

TEST(ChatQwen3, SpecReasoningContentLast) {
    EXPECT_EQ(render({msg("user", "Hi"), with_reasoning(msg("assistant", "Hello!"), "hmm")}, Flavor::Qwen3, false),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello!<|im_end|>\n");
}

TEST(ChatQwen3, SpecToolCalls) {
    ChatMessage a = with_call(msg("assistant", "Let me check."), "get_weather", R"({"city": "Paris"})");
    a = with_call(a, "get_weather", R"({"city": "Rome"})");
    std::string out = render({msg("user", "Q"), a, msg("tool", "r1"), msg("user", "thanks")}, Flavor::Qwen3);
    EXPECT_TRUE(ends_with(out,
        "<|im_start|>assistant\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response><|im_end|>\n<|im_start|>user\n"
        "thanks<|im_end|>\n<|im_start|>assistant\n")) << out;
}

TEST(ChatQwen3, SpecToolCallWithReasoning) {
    ChatMessage a = with_call(with_reasoning(msg("assistant", ""), "r"), "f", R"({"a": 1})");
    std::string out = render({msg("user", "Q"), a, msg("tool", "x")}, Flavor::Qwen3);
    EXPECT_TRUE(ends_with(out,
        "<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")) << out;
}

// ---- spec/chat.md §5 (Qwen3.5), exact strings from the table

TEST(ChatQwen35, SpecSystemTrimmed) {
    EXPECT_EQ(render({msg("system", "  S  "), msg("user", "Hi")}, Flavor::Qwen35),
              "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
}

TEST(ChatQwen35, SpecAssistantLastGetsEmptyThink) {
    EXPECT_EQ(render({msg("user", "Hi"), msg("assistant", "Hello!")}, Flavor::Qwen35, false),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n");
}

TEST(ChatQwen35, SpecHistoryThinkDropped) {
    EXPECT_EQ(render({msg("user", "Hi"), msg("assistant", "<think>\nhmm\n</think>\n\nHello!"), msg("user", "Bye")},
                     Flavor::Qwen35),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
              "<|im_start|>assistant\n<think>\n");
}

TEST(ChatQwen35, SpecXmlToolCallValueSpelling) {
    ChatMessage a = with_call(with_reasoning(msg("assistant", ""), "need tool"), "f",
                              R"({"a": 2, "b": 2.5, "c": null, "d": [1, "x"], "e": {"k": "v"}, "s": "text\nmore"})");
    EXPECT_EQ(render({msg("user", "Q"), a, msg("tool", "ok"), msg("tool", "ok2")}, Flavor::Qwen35),
              "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nneed tool\n</think>\n\n<tool_call>\n"
              "<function=f>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n<parameter=c>\nNone\n"
              "</parameter>\n<parameter=d>\n[1, \"x\"]\n</parameter>\n<parameter=e>\n{\"k\": \"v\"}\n</parameter>\n"
              "<parameter=s>\ntext\nmore\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n"
              "<tool_response>\nok\n</tool_response>\n<tool_response>\nok2\n</tool_response><|im_end|>\n"
              "<|im_start|>assistant\n<think>\n");
}

TEST(ChatQwen35, SpecToolsHeaderThenSystem) {
    const std::string tools =
        R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])";
    ChatMessage a = with_call(msg("assistant", "I'll check."), "get_weather", R"({"location": "Paris", "verbose": true})");
    std::string out = render({msg("system", "You are a helpful assistant."), msg("user", "What's the weather in Paris?"), a,
                              msg("tool", "22C"), msg("user", "Thanks")},
                             Flavor::Qwen35, true, true, tools);
    EXPECT_EQ(out.rfind("<|im_start|>system\n# Tools\n\n", 0), 0u) << out;
    EXPECT_TRUE(ends_with(out,
        "</IMPORTANT>\n\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat's the weather in Paris?"
        "<|im_end|>\n<|im_start|>assistant\nI'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\n"
        "Paris\n</parameter>\n<parameter=verbose>\nTrue\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n")) << out;
}

TEST(ChatQwen35, Errors) {
    EXPECT_THROW(render({}, Flavor::Qwen35), Error);
    EXPECT_THROW(render({msg("system", "s"), msg("assistant", "x")}, Flavor::Qwen35), Error);
    EXPECT_THROW(render({msg("user", "u"), msg("system", "s")}, Flavor::Qwen35), Error);
    EXPECT_THROW(render({msg("user", "u"), msg("narrator", "x")}, Flavor::Qwen35), Error);
    EXPECT_THROW(render({msg("user", "u"), with_call(msg("assistant", ""), "f", "[1, 2]")}, Flavor::Qwen35, false), Error);
    EXPECT_THROW(render({msg("user", "u"), with_call(msg("assistant", ""), "f", "{bad")}, Flavor::Qwen35, false), Error);
    EXPECT_THROW(render({msg("user", "u")}, Flavor::Qwen3, true, true, "{not json"), Error);
    EXPECT_THROW(render({msg("user", "u")}, Flavor::Qwen3, true, true, R"({"type": "function"})"), Error);
}

TEST(Chat, DeveloperRoleIsSystem) {
    EXPECT_EQ(render({msg("developer", "D"), msg("user", "Hi")}, Flavor::Qwen3),
              render({msg("system", "D"), msg("user", "Hi")}, Flavor::Qwen3));
}

TEST(Chat, GenerationStartsInReasoning) {
    EXPECT_TRUE(generation_starts_in_reasoning(render({msg("user", "Hi")}, Flavor::Qwen35)));
    EXPECT_FALSE(generation_starts_in_reasoning(render({msg("user", "Hi")}, Flavor::Qwen35, true, false)));
    EXPECT_FALSE(generation_starts_in_reasoning(render({msg("user", "Hi")}, Flavor::Qwen3)));
}

// ---- Python spellings used by tojson / |string / |trim

TEST(PyText, JsonDumps) {
    auto j = ojson::parse(R"({"b": [1, 2.5, "é<&>'", null, true], "a": {"x": 1e16, "y": 0.0001, "z": 1e-05, "w": 100.0}})");
    EXPECT_EQ(py_json(j),
              R"({"b": [1, 2.5, "é<&>'", null, true], "a": {"x": 1e+16, "y": 0.0001, "z": 1e-05, "w": 100.0}})");
    EXPECT_EQ(py_json(ojson("tab\tnl\n\x01")), "\"tab\\tnl\\n\\u0001\"");
}

TEST(PyText, StrAndRepr) {
    EXPECT_EQ(py_str(ojson(true)), "True");
    EXPECT_EQ(py_str(ojson(nullptr)), "None");
    EXPECT_EQ(py_str(ojson(2.0)), "2.0");
    EXPECT_EQ(py_str(ojson(123456789012345678.0)), "1.2345678901234568e+17");
    EXPECT_EQ(py_str(ojson(-0.5)), "-0.5");
    EXPECT_EQ(py_str(ojson("it's")), "it's");
    EXPECT_EQ(py_str(ojson::parse(R"([1, "x", "it's", {"k": false}])")), R"([1, 'x', "it's", {'k': False}])");
}

TEST(PyText, Strip) {
    EXPECT_EQ(py_strip(" \t\n x y \u3000\u00a0"), "x y");
    EXPECT_EQ(py_strip("\n\n a \n", "\n"), " a ");
    EXPECT_EQ(py_lstrip("\n\nab\n", "\n"), "ab\n");
    EXPECT_EQ(py_rstrip("\n\nab\n\n", "\n"), "\n\nab");
    EXPECT_EQ(py_strip("   "), "");
}

// ---- Renders of the real templates by Python Jinja2

namespace {

const char* kGolden = R"GOLD([
{"name": "system_user_gen", "flavor": "qwen3", "messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "system_user_gen", "flavor": "qwen35", "messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n", "error": null},
{"name": "system_padded", "flavor": "qwen3", "messages": [{"role": "system", "content": "  S  "}, {"role": "user", "content": "Hi"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>system\n  S  <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "system_padded", "flavor": "qwen35", "messages": [{"role": "system", "content": "  S  "}, {"role": "user", "content": "Hi"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n", "error": null},
{"name": "user_nothink", "flavor": "qwen3", "messages": [{"role": "user", "content": "Hi"}], "tools": null, "gen": true, "think": false, "expected": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", "error": null},
{"name": "user_nothink", "flavor": "qwen35", "messages": [{"role": "user", "content": "Hi"}], "tools": null, "gen": true, "think": false, "expected": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", "error": null},
{"name": "history_think_stripped", "flavor": "qwen3", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"}, {"role": "user", "content": "Bye"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "history_think_stripped", "flavor": "qwen35", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"}, {"role": "user", "content": "Bye"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n", "error": null},
{"name": "reasoning_content_last", "flavor": "qwen3", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "reasoning_content": "hmm"}], "tools": null, "gen": false, "think": true, "expected": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello!<|im_end|>\n", "error": null},
{"name": "reasoning_content_last", "flavor": "qwen35", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "reasoning_content": "hmm"}], "tools": null, "gen": false, "think": true, "expected": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello!<|im_end|>\n", "error": null},
{"name": "assistant_last_plain", "flavor": "qwen3", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], "tools": null, "gen": false, "think": true, "expected": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n", "error": null},
{"name": "assistant_last_plain", "flavor": "qwen35", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], "tools": null, "gen": false, "think": true, "expected": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n", "error": null},
{"name": "tool_calls_json", "flavor": "qwen3", "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "Let me check.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}, {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]}, {"role": "tool", "content": "r1"}, {"role": "user", "content": "thanks"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response><|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "tool_call_empty_content_reasoning", "flavor": "qwen3", "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}, {"role": "tool", "content": "x"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "tool_call_empty_content_reasoning", "flavor": "qwen35", "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}, {"role": "tool", "content": "x"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n", "error": null},
{"name": "tool_call_types", "flavor": "qwen35", "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "reasoning_content": "need tool", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": 2, \"b\": 2.5, \"c\": null, \"d\": [1, \"x\"], \"e\": {\"k\": \"v\"}, \"s\": \"text\\nmore\", \"t\": true, \"big\": 1e16, \"small\": 0.00001}"}}]}, {"role": "tool", "content": "ok"}, {"role": "tool", "content": "ok2"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nneed tool\n</think>\n\n<tool_call>\n<function=f>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n<parameter=c>\nNone\n</parameter>\n<parameter=d>\n[1, \"x\"]\n</parameter>\n<parameter=e>\n{\"k\": \"v\"}\n</parameter>\n<parameter=s>\ntext\nmore\n</parameter>\n<parameter=t>\nTrue\n</parameter>\n<parameter=big>\n1e+16\n</parameter>\n<parameter=small>\n1e-05\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response>\n<tool_response>\nok2\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n", "error": null},
{"name": "tools_system_call", "flavor": "qwen3", "messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What's the weather in Paris?"}, {"role": "assistant", "content": "I'll check.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\", \"verbose\": true}"}}]}, {"role": "tool", "content": "22C"}, {"role": "user", "content": "Thanks"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City name, e.g. Paris"}, "verbose": {"type": "boolean"}}, "required": ["location"]}}}], "gen": true, "think": true, "expected": "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", \"description\": \"City name, e.g. Paris\"}, \"verbose\": {\"type\": \"boolean\"}}, \"required\": [\"location\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n<|im_start|>assistant\nI'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"verbose\": true}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "tools_system_call", "flavor": "qwen35", "messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What's the weather in Paris?"}, {"role": "assistant", "content": "I'll check.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\", \"verbose\": true}"}}]}, {"role": "tool", "content": "22C"}, {"role": "user", "content": "Thanks"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City name, e.g. Paris"}, "verbose": {"type": "boolean"}}, "required": ["location"]}}}], "gen": true, "think": true, "expected": "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", \"description\": \"City name, e.g. Paris\"}, \"verbose\": {\"type\": \"boolean\"}}, \"required\": [\"location\"]}}}\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>\n\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n<|im_start|>assistant\nI'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n<parameter=verbose>\nTrue\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n<think>\n", "error": null},
{"name": "tools_no_system", "flavor": "qwen3", "messages": [{"role": "user", "content": "Compute 2+2"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City name, e.g. Paris"}, "verbose": {"type": "boolean"}}, "required": ["location"]}}}, {"type": "function", "function": {"name": "calc", "description": "Évalue une expression « mathématique » <b>&</b>", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}, "precision": {"type": "number", "default": 0.5}}}}}], "gen": true, "think": true, "expected": "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", \"description\": \"City name, e.g. Paris\"}, \"verbose\": {\"type\": \"boolean\"}}, \"required\": [\"location\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"calc\", \"description\": \"Évalue une expression « mathématique » <b>&</b>\", \"parameters\": {\"type\": \"object\", \"properties\": {\"expr\": {\"type\": \"string\"}, \"precision\": {\"type\": \"number\", \"default\": 0.5}}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nCompute 2+2<|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "tools_no_system", "flavor": "qwen35", "messages": [{"role": "user", "content": "Compute 2+2"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City name, e.g. Paris"}, "verbose": {"type": "boolean"}}, "required": ["location"]}}}, {"type": "function", "function": {"name": "calc", "description": "Évalue une expression « mathématique » <b>&</b>", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}, "precision": {"type": "number", "default": 0.5}}}}}], "gen": true, "think": true, "expected": "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", \"description\": \"City name, e.g. Paris\"}, \"verbose\": {\"type\": \"boolean\"}}, \"required\": [\"location\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"calc\", \"description\": \"Évalue une expression « mathématique » <b>&</b>\", \"parameters\": {\"type\": \"object\", \"properties\": {\"expr\": {\"type\": \"string\"}, \"precision\": {\"type\": \"number\", \"default\": 0.5}}}}}\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT><|im_end|>\n<|im_start|>user\nCompute 2+2<|im_end|>\n<|im_start|>assistant\n<think>\n", "error": null},
{"name": "tools_empty_system", "flavor": "qwen3", "messages": [{"role": "system", "content": "   "}, {"role": "user", "content": "Compute 2+2"}], "tools": [{"type": "function", "function": {"name": "calc", "description": "Évalue une expression « mathématique » <b>&</b>", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}, "precision": {"type": "number", "default": 0.5}}}}}], "gen": true, "think": false, "expected": "<|im_start|>system\n   \n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"calc\", \"description\": \"Évalue une expression « mathématique » <b>&</b>\", \"parameters\": {\"type\": \"object\", \"properties\": {\"expr\": {\"type\": \"string\"}, \"precision\": {\"type\": \"number\", \"default\": 0.5}}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nCompute 2+2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", "error": null},
{"name": "tools_empty_system", "flavor": "qwen35", "messages": [{"role": "system", "content": "   "}, {"role": "user", "content": "Compute 2+2"}], "tools": [{"type": "function", "function": {"name": "calc", "description": "Évalue une expression « mathématique » <b>&</b>", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}, "precision": {"type": "number", "default": 0.5}}}}}], "gen": true, "think": false, "expected": "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"calc\", \"description\": \"Évalue une expression « mathématique » <b>&</b>\", \"parameters\": {\"type\": \"object\", \"properties\": {\"expr\": {\"type\": \"string\"}, \"precision\": {\"type\": \"number\", \"default\": 0.5}}}}}\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT><|im_end|>\n<|im_start|>user\nCompute 2+2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", "error": null},
{"name": "multi_step_tools", "flavor": "qwen3", "messages": [{"role": "user", "content": "Plan a trip"}, {"role": "assistant", "content": "<think>\nfirst\n</think>\n\nStep 1", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Oslo\"}"}}]}, {"role": "tool", "content": "cold"}, {"role": "assistant", "content": "", "reasoning_content": "second", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Rome\"}"}}, {"type": "function", "function": {"name": "calc", "arguments": "{\"expr\": \"1+1\"}"}}]}, {"role": "tool", "content": "warm"}, {"role": "tool", "content": "2"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>user\nPlan a trip<|im_end|>\n<|im_start|>assistant\n<think>\nfirst\n</think>\n\nStep 1\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Oslo\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\ncold\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nsecond\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"1+1\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nwarm\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "multi_step_tools", "flavor": "qwen35", "messages": [{"role": "user", "content": "Plan a trip"}, {"role": "assistant", "content": "<think>\nfirst\n</think>\n\nStep 1", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Oslo\"}"}}]}, {"role": "tool", "content": "cold"}, {"role": "assistant", "content": "", "reasoning_content": "second", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Rome\"}"}}, {"type": "function", "function": {"name": "calc", "arguments": "{\"expr\": \"1+1\"}"}}]}, {"role": "tool", "content": "warm"}, {"role": "tool", "content": "2"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>user\nPlan a trip<|im_end|>\n<|im_start|>assistant\n<think>\nfirst\n</think>\n\nStep 1\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nOslo\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\ncold\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nsecond\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nRome\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=calc>\n<parameter=expr>\n1+1\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nwarm\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n", "error": null},
{"name": "chinese", "flavor": "qwen3", "messages": [{"role": "system", "content": "你是一个有帮助的助手。"}, {"role": "user", "content": "你好，世界！请用中文回答。"}, {"role": "assistant", "content": "你好！有什么可以帮你的吗？"}, {"role": "user", "content": "讲个笑话"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>system\n你是一个有帮助的助手。<|im_end|>\n<|im_start|>user\n你好，世界！请用中文回答。<|im_end|>\n<|im_start|>assistant\n你好！有什么可以帮你的吗？<|im_end|>\n<|im_start|>user\n讲个笑话<|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "chinese", "flavor": "qwen35", "messages": [{"role": "system", "content": "你是一个有帮助的助手。"}, {"role": "user", "content": "你好，世界！请用中文回答。"}, {"role": "assistant", "content": "你好！有什么可以帮你的吗？"}, {"role": "user", "content": "讲个笑话"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>system\n你是一个有帮助的助手。<|im_end|>\n<|im_start|>user\n你好，世界！请用中文回答。<|im_end|>\n<|im_start|>assistant\n你好！有什么可以帮你的吗？<|im_end|>\n<|im_start|>user\n讲个笑话<|im_end|>\n<|im_start|>assistant\n<think>\n", "error": null},
{"name": "assistant_mid_reasoning_kept", "flavor": "qwen3", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": "r1"}, {"role": "assistant", "content": "c", "reasoning_content": ""}, {"role": "user", "content": "d"}, {"role": "assistant", "content": "e"}], "tools": null, "gen": false, "think": true, "expected": "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>assistant\nc<|im_end|>\n<|im_start|>user\nd<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\ne<|im_end|>\n", "error": null},
{"name": "assistant_mid_reasoning_kept", "flavor": "qwen35", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": "r1"}, {"role": "assistant", "content": "c", "reasoning_content": ""}, {"role": "user", "content": "d"}, {"role": "assistant", "content": "e"}], "tools": null, "gen": false, "think": true, "expected": "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>assistant\nc<|im_end|>\n<|im_start|>user\nd<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\ne<|im_end|>\n", "error": null},
{"name": "tool_response_user_text", "flavor": "qwen3", "messages": [{"role": "user", "content": "q1"}, {"role": "user", "content": "<tool_response>\nx\n</tool_response>"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>user\nq1<|im_end|>\n<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "tool_response_user_text", "flavor": "qwen35", "messages": [{"role": "user", "content": "q1"}, {"role": "user", "content": "<tool_response>\nx\n</tool_response>"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>user\nq1<|im_end|>\n<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n", "error": null},
{"name": "second_system", "flavor": "qwen3", "messages": [{"role": "system", "content": "one"}, {"role": "user", "content": "u"}, {"role": "system", "content": "two"}, {"role": "user", "content": "v"}], "tools": null, "gen": true, "think": true, "expected": "<|im_start|>system\none<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>system\ntwo<|im_end|>\n<|im_start|>user\nv<|im_end|>\n<|im_start|>assistant\n", "error": null},
{"name": "newlines_kept", "flavor": "qwen3", "messages": [{"role": "user", "content": "\n\nline1\nline2\n\n"}, {"role": "assistant", "content": "\n\n<think>\n\nreason\n\n</think>\n\n\nanswer\n"}], "tools": null, "gen": false, "think": true, "expected": "<|im_start|>user\n\n\nline1\nline2\n\n<|im_end|>\n<|im_start|>assistant\n<think>\nreason\n</think>\n\nanswer\n<|im_end|>\n", "error": null},
{"name": "newlines_kept", "flavor": "qwen35", "messages": [{"role": "user", "content": "\n\nline1\nline2\n\n"}, {"role": "assistant", "content": "\n\n<think>\n\nreason\n\n</think>\n\n\nanswer\n"}], "tools": null, "gen": false, "think": true, "expected": "<|im_start|>user\nline1\nline2<|im_end|>\n<|im_start|>assistant\n<think>\nreason\n</think>\n\nanswer<|im_end|>\n", "error": null},
{"name": "err_no_user", "flavor": "qwen35", "messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "x"}], "tools": null, "gen": true, "think": true, "expected": null, "error": "No user query found in messages."},
{"name": "err_system_late", "flavor": "qwen35", "messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "s"}], "tools": null, "gen": true, "think": true, "expected": null, "error": "System message must be at the beginning."},
{"name": "err_bad_role", "flavor": "qwen35", "messages": [{"role": "user", "content": "u"}, {"role": "narrator", "content": "x"}], "tools": null, "gen": true, "think": true, "expected": null, "error": "Unexpected message role."}
])GOLD";

std::vector<ChatMessage> messages_from(const ojson& arr) {
    std::vector<ChatMessage> out;
    for (const ojson& j : arr) {
        ChatMessage m;
        m.role = j.at("role").get<std::string>();
        m.content = j.value("content", "");
        if (j.contains("reasoning_content")) m.reasoning_content = j["reasoning_content"].get<std::string>();
        if (j.contains("tool_calls"))
            for (const ojson& t : j["tool_calls"])
                m.tool_calls.push_back({"", t["function"]["name"].get<std::string>(),
                                        t["function"]["arguments"].get<std::string>()});
        out.push_back(m);
    }
    return out;
}

}  // namespace

TEST(ChatGolden, MatchesJinja2RendersOfRealTemplates) {
    const ojson cases = ojson::parse(kGolden);
    ASSERT_GT(cases.size(), 30u);
    for (const ojson& c : cases) {
        const std::string name = c["flavor"].get<std::string>() + "/" + c["name"].get<std::string>();
        const Flavor f = c["flavor"] == "qwen35" ? Flavor::Qwen35 : Flavor::Qwen3;
        ChatOptions o;
        o.add_generation_prompt = c["gen"].get<bool>();
        o.enable_thinking = c["think"].get<bool>();
        if (!c["tools"].is_null()) o.tools_json = c["tools"].dump();
        const auto msgs = messages_from(c["messages"]);
        if (c["expected"].is_null()) {
            EXPECT_THROW(render_chatml(msgs, o, f), Error) << name;
        } else {
            EXPECT_EQ(render_chatml(msgs, o, f), c["expected"].get<std::string>()) << name;
        }
    }
}

TEST(ChatGolden, JinjaRunsTheRealQwen3TemplateExactly) {
    // The reference vocabulary carries Qwen3's tokenizer_config.json template.
    if (!test::reference_available()) GTEST_SKIP() << "reference data missing in " << test::reference_dir();
    auto f = gguf::File::open(test::reference_path("vocab-qwen3.gguf"));
    const ChatTemplate jinja = ChatTemplate::from_gguf(*f, "", true);
    ASSERT_TRUE(jinja.uses_jinja()) << jinja.warning();
    const ChatTemplate builtin = ChatTemplate::from_gguf(*f);
    ASSERT_FALSE(builtin.uses_jinja());
    EXPECT_EQ(builtin.flavor(), Flavor::Qwen3);
    const ojson cases = ojson::parse(kGolden);
    int n = 0;
    for (const ojson& c : cases) {
        if (c["flavor"] != "qwen3") continue;
        const std::string name = c["name"].get<std::string>();
        ChatOptions o;
        o.add_generation_prompt = c["gen"].get<bool>();
        o.enable_thinking = c["think"].get<bool>();
        if (!c["tools"].is_null()) o.tools_json = c["tools"].dump();
        const auto msgs = messages_from(c["messages"]);
        EXPECT_EQ(jinja.render(msgs, o), c["expected"].get<std::string>()) << name;
        EXPECT_EQ(builtin.render(msgs, o), c["expected"].get<std::string>()) << name;
        n++;
    }
    EXPECT_GT(n, 15);
    EXPECT_FALSE(jinja.starts_in_reasoning(ChatOptions{}));
}

TEST(ChatTemplateSelection, FlavourFromTemplateText) {
    EXPECT_EQ(detect_flavor("", Flavor::Qwen35), Flavor::Qwen35);
    EXPECT_EQ(detect_flavor("{{ '<|im_start|>' }}", Flavor::Qwen35), Flavor::Qwen3);
    EXPECT_EQ(detect_flavor("<|im_start|> ... '<tool_call>\n<function=' ...", Flavor::Qwen3), Flavor::Qwen35);
    // A user template is run by the Jinja engine, with the variables llama.cpp passes.
    const ChatTemplate t = ChatTemplate::jinja(
        "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{{ bos_token }}{{ enable_thinking }}"
        "{{ add_generation_prompt }}{{ extra }}");
    ChatOptions o;
    o.kwargs_json = R"({"extra": "!"})";
    EXPECT_EQ(t.render({ChatMessage("developer", "d"), ChatMessage("user", "u")}, o),
              "[system:d][user:u]<|endoftext|>TrueTrue!");
    EXPECT_THROW(ChatTemplate::jinja("{% if %}"), Error);
}
