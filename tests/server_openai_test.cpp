// OpenAI request parsing and response shapes without a model: tool calls and
// reasoning parsed from model text into `tool_calls` / `reasoning_content`
// (streamed and whole), request fields into the generation request.
#include <gtest/gtest.h>

#include "server/openai.h"

using namespace qinfer;
using namespace qinfer::server;

namespace {

const char* kTools = R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
  "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])";

Reply make_reply(bool xml) {
    Reply r;
    r.chat = true;
    chat::OutputParser::Options po;
    po.parse_tool_calls = true;
    po.xml_tool_calls = xml;
    po.tools_json = kTools;
    r.parser = std::make_unique<chat::OutputParser>(po);
    return r;
}

GenerateResult stopped(int n) {
    GenerateResult g;
    g.finish_reason = FinishReason::Stop;
    g.n_prompt = 20;
    g.n_cached = 5;
    g.n_generated = n;
    return g;
}

// Feeds text in small pieces, as tokens arrive; returns the streamed chunks.
std::vector<json> stream_text(Reply& r, const std::string& text) {
    std::vector<json> out;
    for (size_t i = 0; i < text.size(); i += 3)
        for (json& c : r.deltas(r.parser->push(text.substr(i, 3)))) out.push_back(std::move(c));
    for (json& c : r.deltas(r.parser->finish())) out.push_back(std::move(c));
    return out;
}

}  // namespace

TEST(ServerOpenAI, JsonToolCallBecomesToolCalls) {
    const std::string text =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
    Reply whole = make_reply(false);
    whole.parser->push(text);
    const json out = final_reply(whole, stopped(30), false);
    const json& choice = out["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls");
    EXPECT_TRUE(choice["message"]["content"].is_null());
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
    const json& tc = choice["message"]["tool_calls"][0];
    EXPECT_EQ(tc["type"], "function");
    EXPECT_EQ(tc["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(tc["function"]["arguments"].get<std::string>()), json::parse(R"({"city":"Paris","days":2})"));
    EXPECT_EQ(tc["id"].get<std::string>().rfind("call_", 0), 0u);
    EXPECT_EQ(out["usage"]["prompt_tokens_details"]["cached_tokens"], 5);
    EXPECT_EQ(out["usage"]["total_tokens"], 50);
    EXPECT_EQ(out["timings"]["prompt_n"], 15);

    // Streamed: exactly one chunk carries the call, with its index.
    Reply streamed = make_reply(false);
    const std::vector<json> chunks = stream_text(streamed, text);
    int n_calls = 0;
    for (const json& c : chunks) {
        const json& d = c["choices"][0]["delta"];
        EXPECT_FALSE(d.contains("content")) << c.dump();
        if (d.contains("tool_calls")) {
            n_calls++;
            EXPECT_EQ(d["tool_calls"][0]["index"], 0);
            EXPECT_EQ(d["tool_calls"][0]["function"]["name"], "get_weather");
        }
        EXPECT_EQ(c["object"], "chat.completion.chunk");
    }
    EXPECT_EQ(n_calls, 1);
}

TEST(ServerOpenAI, XmlToolCallArgumentsFollowTheSchema) {
    // Qwen3.5 format: "city" is a string parameter (taken verbatim), "days" an integer.
    Reply r = make_reply(true);
    r.parser->push("Let me check.<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n"
                   "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>");
    const json out = final_reply(r, stopped(40), false);
    const json& msg = out["choices"][0]["message"];
    EXPECT_EQ(msg["content"], "Let me check.");
    ASSERT_EQ(msg["tool_calls"].size(), 1u);
    EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
              json::parse(R"({"city":"42","days":3})"));
}

TEST(ServerOpenAI, ReasoningSplitFromContent) {
    Reply r = make_reply(false);
    const std::vector<json> chunks = stream_text(r, "<think>\nweighing it\n</think>\n\nThe answer.");
    std::string reasoning, content;
    for (const json& c : chunks) {
        const json& d = c["choices"][0]["delta"];
        if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
        if (d.contains("content")) content += d["content"].get<std::string>();
    }
    EXPECT_EQ(reasoning, "weighing it");
    EXPECT_EQ(content, "The answer.");
    const json out = final_reply(r, stopped(9), true);
    EXPECT_EQ(out["choices"][0]["message"]["reasoning_content"], "weighing it");
    EXPECT_EQ(out["choices"][0]["message"]["content"], "The answer.");
    EXPECT_EQ(out["choices"][0]["finish_reason"], "stop");
}

TEST(ServerOpenAI, ChatRequestFields) {
    const json body = json::parse(R"({
      "model": "anything", "unknown_field": [1, 2],
      "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
        {"role": "assistant", "content": null, "reasoning_content": "need a tool",
         "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "21 C"}
      ],
      "tools": [{"type": "function", "function": {"name": "get_weather"}}],
      "chat_template_kwargs": {"enable_thinking": false},
      "max_completion_tokens": 33, "temperature": 0.5, "top_k": 7, "top_p": 0.9, "min_p": 0.1,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "repeat_penalty": 1.1, "seed": 1234,
      "stop": ["END", "\n\n"], "stream": true, "stream_options": {"include_usage": true},
      "logit_bias": {"42": -100, "7": 2.5}
    })");
    const ApiRequest r = parse_chat_request(body, SamplingParams{});
    ASSERT_EQ(r.gen.messages.size(), 4u);
    EXPECT_EQ(r.gen.messages[0].role, "system");
    EXPECT_EQ(r.gen.messages[1].content, "Weather in Paris?");
    EXPECT_EQ(r.gen.messages[2].reasoning_content.value_or(""), "need a tool");
    ASSERT_EQ(r.gen.messages[2].tool_calls.size(), 1u);
    EXPECT_EQ(r.gen.messages[2].tool_calls[0].name, "get_weather");
    EXPECT_EQ(r.gen.messages[3].tool_call_id, "call_9");
    EXPECT_TRUE(r.has_tools);
    EXPECT_EQ(json::parse(r.gen.chat.tools_json)[0]["function"]["name"], "get_weather");
    EXPECT_FALSE(r.gen.chat.enable_thinking);
    EXPECT_EQ(r.gen.max_tokens, 33);
    EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
    EXPECT_EQ(r.gen.sampling.top_k, 7);
    EXPECT_FLOAT_EQ(r.gen.sampling.top_p, 0.9f);
    EXPECT_FLOAT_EQ(r.gen.sampling.min_p, 0.1f);
    EXPECT_FLOAT_EQ(r.gen.sampling.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(r.gen.sampling.frequency_penalty, -0.5f);
    EXPECT_FLOAT_EQ(r.gen.sampling.repeat_penalty, 1.1f);
    EXPECT_EQ(r.gen.sampling.seed, 1234);
    EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"END", "\n\n"}));
    EXPECT_TRUE(r.stream);
    EXPECT_TRUE(r.include_usage);
    ASSERT_EQ(r.gen.sampling.logit_bias.size(), 2u);

    // Defaults come from the model when the request says nothing.
    SamplingParams model_defaults;
    model_defaults.temperature = 0.6f;
    model_defaults.top_k = 20;
    const ApiRequest d = parse_chat_request(json::parse(R"({"messages":[{"role":"user","content":"x"}]})"), model_defaults);
    EXPECT_FLOAT_EQ(d.gen.sampling.temperature, 0.6f);
    EXPECT_EQ(d.gen.sampling.top_k, 20);
    EXPECT_EQ(d.gen.max_tokens, -1);
    EXPECT_TRUE(d.gen.chat.enable_thinking);

    // tool_choice "none" drops the tools.
    const ApiRequest n = parse_chat_request(
        json::parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"})"),
        SamplingParams{});
    EXPECT_FALSE(n.has_tools);
    EXPECT_TRUE(n.gen.chat.tools_json.empty());
}

TEST(ServerOpenAI, ErrorBodyShape) {
    const json e = json::parse(error_body(400, "'top_p' must be between 0 and 1, got 3", "top_p"));
    EXPECT_EQ(e["error"]["message"], "'top_p' must be between 0 and 1, got 3");
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_EQ(e["error"]["param"], "top_p");
    EXPECT_EQ(e["error"]["code"], 400);
    EXPECT_EQ(json::parse(error_body(401, "no key"))["error"]["type"], "authentication_error");
    EXPECT_TRUE(json::parse(error_body(503, "busy"))["error"]["param"].is_null());
    // Invalid UTF-8 from a model never breaks the JSON.
    EXPECT_NO_THROW(json::parse(dump(json{{"text", std::string("a\xff" "b")}})));
}
