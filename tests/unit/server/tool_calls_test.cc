// Tool-call parsers on canned outputs of each family (well-formed and malformed), the request
// fields, forced-call schemas and the streaming hold-back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "server/generation_tools.h"
#include "server/structured_output.h"
#include "server/template_renderer.h"
#include "server/tool_calls.h"
#include "unit/tokenizer/real_tokenizers.h"

namespace dh::server {
namespace {

TEST(ToolParsers, DeepSeekV3) {
  const std::string text =
      "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>\n"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
  ToolParseResult r = ParseToolCalls(ToolParser::kDeepSeekV3, text, {"<｜end▁of▁sentence｜>"});
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","days":2})");
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(r.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
}

TEST(ToolParsers, DeepSeekV31Form) {
  ToolParseResult r = ParseToolCalls(
      ToolParser::kDeepSeekV3,
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\":\"x\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "search");
  EXPECT_EQ(r.calls[0].arguments, R"({"q":"x"})");
  EXPECT_EQ(r.content, "");
}

TEST(ToolParsers, DeepSeekMalformedFallsBackToContent) {
  for (const std::string text : {
           "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{bad json\n```<｜tool▁call▁end｜>",
           "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}",  // cut short
           "<｜tool▁calls▁begin｜>garbage",
           "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>\n```json\n{}\n```<｜tool▁call▁end｜>",
       }) {
    ToolParseResult r = ParseToolCalls(ToolParser::kDeepSeekV3, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  EXPECT_EQ(ParseToolCalls(ToolParser::kDeepSeekV3, "no calls here").content, "no calls here");
}

TEST(ToolParsers, Hermes) {
  ToolParseResult r = ParseToolCalls(
      ToolParser::kHermes,
      "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"neg\", \"arguments\": \"{\\\"x\\\": 3}\"}\n</tool_call><|im_end|>",
      {"<|im_end|>"});
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "add");
  EXPECT_EQ(r.calls[0].arguments, R"({"a":1,"b":2})");
  EXPECT_EQ(r.calls[1].arguments, R"({"x": 3})");
  // An unclosed last call is still read.
  EXPECT_EQ(ParseToolCalls(ToolParser::kHermes, "<tool_call>{\"name\":\"f\",\"arguments\":{}}").calls.size(), 1u);
}

TEST(ToolParsers, HermesMalformed) {
  for (const std::string text : {"<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",
                                 "<tool_call>{\"arguments\": {}}</tool_call>",
                                 "<tool_call>[1,2]</tool_call>", "<tool_call></tool_call>",
                                 "<tool_call>{\"name\":\"f\",\"arguments\":7}</tool_call>"}) {
    ToolParseResult r = ParseToolCalls(ToolParser::kHermes, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolParsers, Llama3Json) {
  ToolParseResult a = ParseToolCalls(ToolParser::kLlama3Json,
                                     "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"s\": \"a;b\"}}; "
                                     "{\"name\": \"g\", \"parameters\": {}}<|eom_id|>",
                                     {"<|eom_id|>"});
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0].arguments, R"({"s":"a;b"})");
  EXPECT_EQ(a.calls[1].name, "g");
  ToolParseResult b = ParseToolCalls(ToolParser::kLlama3Json, " {\"name\":\"f\",\"parameters\":{\"x\":1}}");
  ASSERT_EQ(b.calls.size(), 1u);
  for (const std::string text : {"Hello {\"name\":\"f\"}", "{\"name\": \"f\", \"parameters\": ", "{not json}",
                                 "{\"parameters\": {}}"}) {
    ToolParseResult r = ParseToolCalls(ToolParser::kLlama3Json, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolParsers, NamesAndDetection) {
  bool is_auto = false;
  ToolParser p;
  EXPECT_TRUE(ParseToolParserName("auto", &is_auto, &p));
  EXPECT_TRUE(is_auto);
  EXPECT_TRUE(ParseToolParserName("hermes", &is_auto, &p));
  EXPECT_EQ(p, ToolParser::kHermes);
  EXPECT_FALSE(ParseToolParserName("mistral", &is_auto, &p));
  EXPECT_EQ(DetectToolParser("{{'<｜tool▁call▁begin｜>'}}"), ToolParser::kDeepSeekV3);
  EXPECT_EQ(DetectToolParser("<tool_call>"), ToolParser::kHermes);
  EXPECT_EQ(DetectToolParser("plain"), ToolParser::kNone);
}

// `auto` follows the chat template's call syntax, and the vocabulary only when the template
// names none.
TEST(ToolParsers, AutoFollowsTheChatTemplateThenTheVocabulary) {
  const Tokenizer* deepseek = testing_util::RealTokenizer("deepseek-v3");
  const Tokenizer* qwen = testing_util::RealTokenizer("qwen3");
  if (deepseek == nullptr || qwen == nullptr) GTEST_SKIP() << "shared tokenizers absent";
  const auto dir = testing_util::SharedDir() / "data" / "tokenizers";
  for (const auto& [name, tok, want] :
       {std::tuple{"deepseek-v3", deepseek, ToolParser::kDeepSeekV3},
        std::tuple{"qwen3", qwen, ToolParser::kHermes}}) {
    auto renderer = LoadChatRenderer((dir / name).string(), "");
    ASSERT_TRUE(renderer.ok()) << name << ": " << renderer.status().message();
    EXPECT_EQ(internal::ResolveToolParser("auto", (*renderer)->Source(), tok), want) << name;
  }
  // A template that writes Hermes-style calls wins over DeepSeek's markers in the vocabulary.
  EXPECT_EQ(internal::ResolveToolParser("auto", "{{ '<tool_call>' }}", deepseek), ToolParser::kHermes);
  // No template markers: the vocabulary decides; an explicit name is taken as given.
  EXPECT_EQ(internal::ResolveToolParser("auto", "{{ messages }}", deepseek), ToolParser::kDeepSeekV3);
  EXPECT_EQ(internal::ResolveToolParser("auto", "", nullptr), ToolParser::kNone);
  EXPECT_EQ(internal::ResolveToolParser("none", "<tool_call>", qwen), ToolParser::kNone);
  EXPECT_EQ(internal::ResolveToolParser("llama3_json", "", deepseek), ToolParser::kLlama3Json);
}

// With a reasoning template the grammar starts after </think>: the span before it is free.
TEST(StructuredConstraint, StartsAfterTheReasoningEndTag) {
  const Tokenizer* tok = testing_util::RealTokenizer("qwen3");  // has a </think> token
  if (tok == nullptr) GTEST_SKIP() << "shared tokenizers absent";
  const std::optional<int32_t> think_end = tok->TokenToId("</think>");
  ASSERT_TRUE(think_end.has_value());
  StructuredOutput so(tok, tok->vocab_size());
  StructuredSpec spec;
  spec.kind = StructuredSpec::Kind::kChoice;
  spec.choices = {"yes", "no"};
  spec.param = "guided_choice";
  auto compiled = so.Compile(spec, nullptr);
  ASSERT_TRUE(std::holds_alternative<StructuredOutput::Compiled>(compiled));
  auto grammar = std::get<StructuredOutput::Compiled>(compiled);
  auto count_allowed = [](const std::vector<float>& logits) {
    return std::count_if(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); });
  };
  const std::vector<int32_t> eos = {1};
  auto gated = StructuredOutput::NewConstraint(grammar, think_end);
  std::vector<float> logits(static_cast<size_t>(tok->vocab_size()), 0.0f);
  ASSERT_TRUE(gated->Mask(logits, eos));
  EXPECT_EQ(count_allowed(logits), tok->vocab_size()) << "masked inside the reasoning span";
  gated->Accept(100);  // any reasoning token
  gated->Accept(*think_end);
  ASSERT_TRUE(gated->Mask(logits, eos));
  const auto allowed = count_allowed(logits);
  EXPECT_GT(allowed, 0);
  EXPECT_LT(allowed, 50) << "the choice grammar must apply after </think>";
  // Without the tag the grammar applies from the first token.
  auto plain = StructuredOutput::NewConstraint(grammar);
  std::vector<float> fresh(static_cast<size_t>(tok->vocab_size()), 0.0f);
  ASSERT_TRUE(plain->Mask(fresh, eos));
  EXPECT_EQ(count_allowed(fresh), allowed);
}

// "required" output streams as a header per call (id, name) and argument fragments whose
// concatenation is the call's parameters text, however the output is cut into pieces.
TEST(ForcedCallStreamer, HeadersThenArgumentFragmentsForAnyChunking) {
  const std::string output =
      R"([{"name":"get_weather","parameters":{"city":"Pa\"ris}","n":[1,{"a":"}"}]}}, )"
      R"({"name": "get_time", "parameters": {}}])";
  for (size_t chunk = 1; chunk <= 9; ++chunk) {
    ForcedCallStreamer s;
    std::vector<ForcedCallStreamer::Event> events;
    for (size_t at = 0; at < output.size(); at += chunk) s.Push(output.substr(at, chunk), &events);
    std::vector<std::string> ids, names, args;
    for (const auto& e : events) {
      if (!e.id.empty()) {
        ASSERT_EQ(e.index, static_cast<int>(ids.size())) << "chunk " << chunk;
        ids.push_back(e.id);
        names.push_back(e.name);
        args.emplace_back();
      }
      ASSERT_GE(e.index, 0);
      ASSERT_LT(e.index, static_cast<int>(args.size())) << "fragment before its header";
      args[e.index] += e.arguments;
    }
    ASSERT_EQ(names, (std::vector<std::string>{"get_weather", "get_time"})) << "chunk " << chunk;
    EXPECT_NE(ids[0], ids[1]);
    EXPECT_EQ(args[0], R"({"city":"Pa\"ris}","n":[1,{"a":"}"}]})") << "chunk " << chunk;
    EXPECT_EQ(args[1], "{}") << "chunk " << chunk;
    EXPECT_EQ(s.calls_started(), 2);
  }
  // Cut short inside the first call's name: nothing is announced yet.
  ForcedCallStreamer s;
  std::vector<ForcedCallStreamer::Event> events;
  s.Push(R"([{"name":"get_wea)", &events);
  EXPECT_TRUE(events.empty());
  EXPECT_EQ(s.calls_started(), 0);
}

Json Tools() {
  return Json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"}},"required":["city"]}}},
      {"type":"function","function":{"name":"get_time"}}])");
}

TEST(ToolRequest, ChoicesAndErrors) {
  auto named = ParseToolRequest({{"tools", Tools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  ASSERT_TRUE(std::holds_alternative<ToolRequest>(named));
  const ToolRequest& n = std::get<ToolRequest>(named);
  EXPECT_EQ(n.choice, ToolRequest::Choice::kNamed);
  EXPECT_EQ(n.forced_schema["required"][0], "city");
  auto calls = ForcedCallsFromOutput(n, R"({"city":"Oslo"})");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_TRUE(ForcedCallsFromOutput(n, R"({"city":"Os)").empty());

  auto req = ParseToolRequest({{"tools", Tools()}, {"tool_choice", "required"}, {"parallel_tool_calls", false}});
  ASSERT_TRUE(std::holds_alternative<ToolRequest>(req));
  const ToolRequest& r = std::get<ToolRequest>(req);
  EXPECT_EQ(r.forced_schema["maxItems"], 1);
  auto rc = ForcedCallsFromOutput(r, R"([{"name":"get_time","parameters":{}}])");
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].arguments, "{}");

  auto none = ParseToolRequest({{"tools", Tools()}, {"tool_choice", "none"}});
  EXPECT_EQ(std::get<ToolRequest>(none).choice, ToolRequest::Choice::kNone);
  auto def = ParseToolRequest({{"tools", Tools()}});
  EXPECT_EQ(std::get<ToolRequest>(def).choice, ToolRequest::Choice::kAuto);

  EXPECT_TRUE(std::holds_alternative<ApiError>(ParseToolRequest({{"tool_choice", "required"}})));
  EXPECT_TRUE(std::holds_alternative<ApiError>(
      ParseToolRequest({{"tools", Tools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}})));
  EXPECT_TRUE(std::holds_alternative<ApiError>(ParseToolRequest({{"tools", Json::parse(R"([{"type":"function"}])")}})));
  EXPECT_TRUE(std::holds_alternative<ApiError>(ParseToolRequest({{"tools", Tools()}, {"tool_choice", 3}})));
}

// What a client reassembles from a streamed auto-mode output.
struct Streamed {
  std::string content;
  std::vector<std::string> ids, names, args;
  bool ordered = true;  // every fragment after its call's header, headers in index order
};

Streamed StreamInChunks(ToolParser parser, const std::vector<std::string>& trailing, const std::string& output,
                        size_t chunk) {
  ToolCallStreamer s(parser, trailing);
  Streamed r;
  std::vector<ToolCallStreamer::Event> events;
  for (size_t at = 0; at < output.size(); at += chunk) r.content += s.Push(output.substr(at, chunk), &events);
  r.content += s.Finish(&events);
  for (const auto& e : events) {
    if (!e.id.empty()) {
      if (e.index != static_cast<int>(r.ids.size())) r.ordered = false;
      r.ids.push_back(e.id);
      r.names.push_back(e.name);
      r.args.emplace_back();
    }
    if (e.index < 0 || e.index >= static_cast<int>(r.args.size())) {
      r.ordered = false;
      continue;
    }
    r.args[e.index] += e.arguments;
  }
  EXPECT_EQ(s.calls_started(), static_cast<int>(r.ids.size()));
  return r;
}

struct StreamCase {
  ToolParser parser;
  std::vector<std::string> trailing;
  std::string output;
  std::string content;                 // expected content
  std::vector<std::string> names;      // expected calls
  std::vector<std::string> arguments;  // their arguments as JSON (compared parsed)
};

// Auto-mode output of each family, cut into chunks of every size 1..9: text before a call is
// content, each call is a header then argument fragments that concatenate to its arguments, and
// malformed calls (nothing announced yet) fall back to content whole.
TEST(ToolStreamer, CallsStreamInFragmentsForAnyChunking) {
  const std::vector<StreamCase> cases = {
      {ToolParser::kDeepSeekV3, {"<｜end▁of▁sentence｜>"},
       "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
       "```json\n{\"city\": \"Pa\\\"ris}\", \"days\": [2, {\"a\": \"```\"}]}\n```<｜tool▁call▁end｜>\n"
       "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>"
       "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
       "Let me check.", {"get_weather", "get_time"}, {R"({"city":"Pa\"ris}","days":[2,{"a":"```"}]})", "{}"}},
      {ToolParser::kDeepSeekV3, {},
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\":\"x\", \"n\": -1.5e3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "", {"search"}, {R"({"q":"x","n":-1.5e3})"}},
      {ToolParser::kHermes, {"<|im_end|>"},
       "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": true}}\n</tool_call>\n"
       "<tool_call>\n{\"arguments\": \"{\\\"x\\\": 3}\", \"name\": \"neg\"}\n</tool_call><|im_end|>",
       "Sure.\n", {"add", "neg"}, {R"({"a":1,"b":true})", R"({"x":3})"}},
      {ToolParser::kHermes, {}, "<tool_call>{\"name\":\"f\",\"arguments\":{}}", "", {"f"}, {"{}"}},
      {ToolParser::kLlama3Json, {"<|eom_id|>"},
       "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"s\": \"a;b\"}}; {\"name\": \"g\", \"parameters\": {}}<|eom_id|>",
       "", {"f", "g"}, {R"({"s":"a;b"})", "{}"}},
      {ToolParser::kLlama3Json, {}, " {\"name\":\"f\",\"parameters\":{\"x\":null}}", "", {"f"}, {R"({"x":null})"}},
      // Malformed before any header: everything is content.
      {ToolParser::kDeepSeekV3, {},
       "Hm.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n[1]\n```<｜tool▁call▁end｜>",
       "Hm.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n[1]\n```<｜tool▁call▁end｜>", {}, {}},
      {ToolParser::kDeepSeekV3, {},
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>\n```json\n{}\n```<｜tool▁call▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>\n```json\n{}\n```<｜tool▁call▁end｜>", {}, {}},
      {ToolParser::kDeepSeekV3, {}, "<｜tool▁calls▁begin｜>garbage", "<｜tool▁calls▁begin｜>garbage", {}, {}},
      {ToolParser::kHermes, {}, "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>", {}, {}},
      {ToolParser::kHermes, {}, "<tool_call>[1,2]</tool_call> ok", "<tool_call>[1,2]</tool_call> ok", {}, {}},
      {ToolParser::kHermes, {"<|im_end|>"}, "Hello <toolbox> and <|im_end|>", "Hello <toolbox> and ", {}, {}},
      {ToolParser::kLlama3Json, {}, "Hello {\"name\":\"f\"}", "Hello {\"name\":\"f\"}", {}, {}},
      {ToolParser::kLlama3Json, {}, "{\"answer\": 42}", "{\"answer\": 42}", {}, {}},
      // Broken after a call was announced: the calls stand, the rest is content.
      {ToolParser::kHermes, {},
       "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1}}</tool_call> and then some text",
       " and then some text", {"f"}, {R"({"a":1})"}},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const StreamCase& c = cases[ci];
    for (size_t chunk = 1; chunk <= 9; ++chunk) {
      Streamed r = StreamInChunks(c.parser, c.trailing, c.output, chunk);
      SCOPED_TRACE("case " + std::to_string(ci) + " chunk " + std::to_string(chunk));
      EXPECT_TRUE(r.ordered);
      EXPECT_EQ(r.content, c.content);
      ASSERT_EQ(r.names, c.names);
      for (size_t i = 0; i < c.names.size(); ++i) {
        const Json got = Json::parse(r.args[i], nullptr, false);
        ASSERT_FALSE(got.is_discarded()) << r.args[i];
        EXPECT_EQ(got, Json::parse(c.arguments[i]));
      }
      if (r.ids.size() == 2) {
        EXPECT_NE(r.ids[0], r.ids[1]);
      }
    }
  }
}

// A header waits for the name; fragments go out as the arguments grow, never ahead of a valid
// JSON prefix; a cut-off call keeps what was sent.
TEST(ToolStreamer, FragmentsFollowTheText) {
  ToolCallStreamer s(ToolParser::kHermes, {});
  std::vector<ToolCallStreamer::Event> ev;
  EXPECT_EQ(s.Push("Calling.<tool_call>{\"name\":\"get_w", &ev), "Calling.");
  EXPECT_TRUE(ev.empty());
  s.Push("eather\",\"arguments\":{\"city\":\"Pa", &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].name, "get_weather");
  EXPECT_EQ(ev[0].arguments, "{\"city\":\"Pa");
  ev.clear();
  s.Push("ris\",", &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_TRUE(ev[0].id.empty());
  EXPECT_EQ(ev[0].arguments, "ris\",");
  ev.clear();
  EXPECT_EQ(s.Finish(&ev), "");  // cut short (length): the call stays as sent
  EXPECT_TRUE(ev.empty());
  EXPECT_EQ(s.calls_started(), 1);

  // JSON that breaks after the header: the call ends where the text was last valid, the rest is
  // content.
  ToolCallStreamer d(ToolParser::kDeepSeekV3, {});
  ev.clear();
  std::string content = d.Push("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{", &ev);
  content += d.Push("bad json\n```<｜tool▁call▁end｜>", &ev);
  content += d.Finish(&ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].name, "f");
  EXPECT_EQ(ev[0].arguments, "{");
  EXPECT_EQ(content, "bad json\n```<｜tool▁call▁end｜>");
}

TEST(StructuredSpec, FieldsAndConflicts) {
  auto a = ParseStructuredSpec({{"guided_choice", {"yes", "no"}}});
  ASSERT_TRUE(std::holds_alternative<StructuredSpec>(a));
  EXPECT_EQ(std::get<StructuredSpec>(a).kind, StructuredSpec::Kind::kChoice);
  auto b = ParseStructuredSpec(Json::parse(R"({"response_format":{"type":"json_schema","json_schema":
      {"name":"x","strict":false,"schema":{"type":"object"}}}})"));
  ASSERT_TRUE(std::holds_alternative<StructuredSpec>(b));
  EXPECT_FALSE(std::get<StructuredSpec>(b).strict);
  auto c = ParseStructuredSpec({{"guided_json", R"({"type":"integer"})"}});
  ASSERT_TRUE(std::holds_alternative<StructuredSpec>(c));
  EXPECT_EQ(std::get<StructuredSpec>(c).schema["type"], "integer");
  auto d = ParseStructuredSpec({{"structured_outputs", {{"regex", "[a-z]+"}}}});
  EXPECT_EQ(std::get<StructuredSpec>(d).kind, StructuredSpec::Kind::kRegex);
  EXPECT_TRUE(std::holds_alternative<ApiError>(ParseStructuredSpec({{"guided_regex", "a"}, {"grammar", "root ::= \"a\""}})));
  EXPECT_TRUE(std::holds_alternative<ApiError>(ParseStructuredSpec({{"guided_choice", Json::array()}})));
  EXPECT_TRUE(std::holds_alternative<ApiError>(ParseStructuredSpec({{"guided_json", "{oops"}})));
  auto none = ParseStructuredSpec({{"response_format", {{"type", "text"}}}});
  EXPECT_EQ(std::get<StructuredSpec>(none).kind, StructuredSpec::Kind::kNone);
}

}  // namespace
}  // namespace dh::server
