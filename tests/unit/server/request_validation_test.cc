// OpenAI request validation: types, ranges, counts and error bodies (reliability.md §3.3 rows
// 1-14, 20, 21 as far as they concern parsing).
#include <gtest/gtest.h>

#include "server/openai_request.h"
#include "server/request_body.h"

namespace dh::server {
namespace {

const RequestLimits kLimits;
const ModelLimits kModel{/*vocab_size=*/1000, /*max_model_len=*/256};

Json Chat(Json extra = Json::object()) {
  Json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// Returns the error param of a chat body, or "OK".
std::string ChatParam(const Json& body) {
  auto r = ParseChatCompletionRequest(body, kLimits, kModel);
  if (auto* e = std::get_if<ApiError>(&r)) {
    EXPECT_EQ(e->status, 400) << e->message;
    return e->param.value_or("<null>");
  }
  return "OK";
}

std::string CompletionParam(Json body) {
  body["model"] = "m";
  auto r = ParseCompletionRequest(body, kLimits, kModel);
  if (auto* e = std::get_if<ApiError>(&r)) {
    EXPECT_EQ(e->status, 400) << e->message;
    return e->param.value_or("<null>");
  }
  return "OK";
}

TEST(ParseRequestBody, RejectsMalformedAndNonObjects) {
  for (std::string body : {"{\"model\":", "{\"a\":1,}", "{\"a\":NaN}", "\xEF\xBB\xBF{}", "[]",
                           "42", "\"x\"", "null", ""}) {
    auto r = ParseRequestBody(body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    EXPECT_EQ(std::get<ApiError>(r).status, 400);
    EXPECT_EQ(std::get<ApiError>(r).code.value_or(""), "invalid_json");
  }
  EXPECT_TRUE(std::holds_alternative<Json>(ParseRequestBody("{\"a\":[1,{\"b\":2}]}")));
}

TEST(ParseRequestBody, RejectsInvalidUtf8) {
  for (std::string bad : {std::string("\xC0\x80"), std::string("\xED\xA0\x80"),
                          std::string("\xF4\x90\x80\x80"), std::string("\\ud800"),
                          std::string("\xB2\xE2")}) {
    auto r = ParseRequestBody("{\"model\":\"" + bad + "\"}");
    EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << "bytes of size " << bad.size();
  }
}

TEST(ParseRequestBody, RejectsDeepNesting) {
  std::string deep = "{\"tools\":" + std::string(3000, '[') + std::string(3000, ']') + "}";
  auto r = ParseRequestBody(deep);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_NE(std::get<ApiError>(r).message.find("nesting depth"), std::string::npos);
  // Brackets inside strings do not count.
  std::string quoted = "{\"s\":\"" + std::string(3000, '[') + "\"}";
  EXPECT_TRUE(std::holds_alternative<Json>(ParseRequestBody(quoted)));
  EXPECT_EQ(JsonNestingDepth("[[[]]]", 64), 3);
  EXPECT_EQ(JsonNestingDepth("[[[]]]", 2), 3);
}

TEST(ChatValidation, AcceptsMinimalAndDefaults) {
  auto r = ParseChatCompletionRequest(Chat(), kLimits, kModel);
  ASSERT_TRUE(std::holds_alternative<ChatCompletionRequest>(r));
  const auto& c = std::get<ChatCompletionRequest>(r);
  EXPECT_EQ(c.model, "m");
  EXPECT_EQ(c.messages.size(), 1u);
  EXPECT_EQ(c.sampling.n, 1);
  EXPECT_DOUBLE_EQ(c.sampling.temperature, 1.0);
  EXPECT_FALSE(c.sampling.max_tokens.has_value());
  EXPECT_FALSE(c.stream.stream);
}

TEST(ChatValidation, WrongTypesNameTheField) {
  EXPECT_EQ(ChatParam(Chat({{"messages", "hi"}})), "messages");
  EXPECT_EQ(ChatParam(Chat({{"max_tokens", "10"}})), "max_tokens");
  EXPECT_EQ(ChatParam(Chat({{"max_tokens", 1.5}})), "max_tokens");
  EXPECT_EQ(ChatParam(Chat({{"max_tokens", 1e30}})), "max_tokens");
  EXPECT_EQ(ChatParam(Chat({{"temperature", "hot"}})), "temperature");
  EXPECT_EQ(ChatParam(Chat({{"stream", "yes"}})), "stream");
  EXPECT_EQ(ChatParam(Chat({{"stop", 5}})), "stop");
  EXPECT_EQ(ChatParam(Chat({{"seed", 1.5}})), "seed");
  EXPECT_EQ(ChatParam(Chat({{"model", 3}})), "model");
}

TEST(ChatValidation, MissingAndBadMessages) {
  // 'model' is optional (the server fills in its served model, as vLLM and llama.cpp do).
  Json no_model = Chat();
  no_model.erase("model");
  EXPECT_EQ(ChatParam(no_model), "OK");
  auto parsed = ParseChatCompletionRequest(no_model, kLimits, kModel);
  ASSERT_TRUE(std::holds_alternative<ChatCompletionRequest>(parsed));
  EXPECT_EQ(std::get<ChatCompletionRequest>(parsed).model, "");
  Json no_messages = Chat();
  no_messages.erase("messages");
  EXPECT_EQ(ChatParam(no_messages), "messages");
  EXPECT_EQ(ChatParam(Chat({{"messages", Json::array()}})), "messages");
  EXPECT_EQ(ChatParam(Chat({{"messages", {{{"content", "x"}}}}})), "messages[0].role");
  EXPECT_EQ(ChatParam(Chat({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}})),
            "messages[0].role");
  Json image = {{"role", "user"},
                {"content", {{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}}};
  EXPECT_EQ(ChatParam(Chat({{"messages", {image}}})), "messages[0].content");
  EXPECT_EQ(ChatParam(Chat({{"messages", {{{"role", "tool"}, {"content", "x"}}}}})),
            "messages[0].tool_call_id");
  EXPECT_EQ(ChatParam(Chat({{"messages", {{{"role", "user"}}}}})), "messages[0].content");
}

TEST(ChatValidation, ContentPartsAreJoinedAndDeveloperIsSystem) {
  Json parts = {{"role", "developer"},
                {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}};
  auto r = ParseChatCompletionRequest(Chat({{"messages", {parts}}}), kLimits, kModel);
  ASSERT_TRUE(std::holds_alternative<ChatCompletionRequest>(r));
  const auto& m = std::get<ChatCompletionRequest>(r).messages[0];
  EXPECT_EQ(m.role, "system");
  EXPECT_EQ(m.content.value_or(""), "a\nb");
}

TEST(ChatValidation, Ranges) {
  EXPECT_EQ(ChatParam(Chat({{"max_tokens", -1}})), "max_tokens");
  EXPECT_EQ(ChatParam(Chat({{"max_tokens", 0}})), "max_tokens");
  EXPECT_EQ(ChatParam(Chat({{"max_tokens", 2147483648LL}})), "max_tokens");
  EXPECT_EQ(ChatParam(Chat({{"n", 0}})), "n");
  EXPECT_EQ(ChatParam(Chat({{"n", -1}})), "n");
  EXPECT_EQ(ChatParam(Chat({{"n", kLimits.max_n + 1}})), "n");
  EXPECT_EQ(ChatParam(Chat({{"n", 1000000000}})), "n");
  EXPECT_EQ(ChatParam(Chat({{"n", 2}, {"best_of", 3}})), "best_of");
  EXPECT_EQ(ChatParam(Chat({{"temperature", -0.1}})), "temperature");
  EXPECT_EQ(ChatParam(Chat({{"temperature", 2.1}})), "temperature");
  EXPECT_EQ(ChatParam(Chat({{"top_p", 0}})), "top_p");
  EXPECT_EQ(ChatParam(Chat({{"top_p", 1.1}})), "top_p");
  EXPECT_EQ(ChatParam(Chat({{"top_k", -2}})), "top_k");
  EXPECT_EQ(ChatParam(Chat({{"presence_penalty", 2.5}})), "presence_penalty");
  EXPECT_EQ(ChatParam(Chat({{"frequency_penalty", -3}})), "frequency_penalty");
  EXPECT_EQ(ChatParam(Chat({{"repetition_penalty", 0}})), "repetition_penalty");
  EXPECT_EQ(ChatParam(Chat({{"min_p", 2}})), "min_p");
  EXPECT_EQ(ChatParam(Chat({{"max_tokens", 5}, {"min_tokens", 6}})), "min_tokens");
  EXPECT_EQ(ChatParam(Chat({{"temperature", 0}, {"top_p", 1}, {"top_k", 0}, {"n", 2},
                            {"seed", -5}, {"max_completion_tokens", 7}})),
            "OK");
}

TEST(ChatValidation, LogitBias) {
  EXPECT_EQ(ChatParam(Chat({{"logit_bias", {{"5", 1000}}}})), "logit_bias");
  EXPECT_EQ(ChatParam(Chat({{"logit_bias", {{"abc", 1}}}})), "logit_bias");
  EXPECT_EQ(ChatParam(Chat({{"logit_bias", {{"1000", 1}}}})), "logit_bias");
  EXPECT_EQ(ChatParam(Chat({{"logit_bias", {{"-1", 1}}}})), "logit_bias");
  EXPECT_EQ(ChatParam(Chat({{"logit_bias", "x"}})), "logit_bias");
  Json many = Json::object();
  for (int i = 0; i < kLimits.max_logit_bias + 1; ++i) many[std::to_string(i)] = 1;
  EXPECT_EQ(ChatParam(Chat({{"logit_bias", many}})), "logit_bias");
  auto r = ParseChatCompletionRequest(Chat({{"logit_bias", {{"7", -100}, {"9", 2.5}}}}), kLimits, kModel);
  ASSERT_TRUE(std::holds_alternative<ChatCompletionRequest>(r));
  EXPECT_EQ(std::get<ChatCompletionRequest>(r).sampling.logit_bias.size(), 2u);
}

TEST(ChatValidation, LogprobsAndStop) {
  EXPECT_EQ(ChatParam(Chat({{"logprobs", true}, {"top_logprobs", 21}})), "top_logprobs");
  EXPECT_EQ(ChatParam(Chat({{"top_logprobs", 3}})), "top_logprobs");
  EXPECT_EQ(ChatParam(Chat({{"logprobs", true}, {"top_logprobs", 20}})), "OK");
  EXPECT_EQ(ChatParam(Chat({{"stop", {"a", "b", "c", "d", "e"}}})), "stop");
  EXPECT_EQ(ChatParam(Chat({{"stop", std::string(100 * 1024, 'x')}})), "stop");
  auto r = ParseChatCompletionRequest(Chat({{"stop", {"", "end"}}}), kLimits, kModel);
  ASSERT_TRUE(std::holds_alternative<ChatCompletionRequest>(r));
  EXPECT_EQ(std::get<ChatCompletionRequest>(r).sampling.stop, std::vector<std::string>{"end"});
  EXPECT_EQ(ChatParam(Chat({{"stop_token_ids", {1, 2000}}})), "stop_token_ids");
}

TEST(ChatValidation, StreamOptionsAndTemplates) {
  EXPECT_EQ(ChatParam(Chat({{"stream_options", {{"include_usage", true}}}})), "stream_options");
  auto r = ParseChatCompletionRequest(
      Chat({{"stream", true}, {"stream_options", {{"include_usage", true}}}}), kLimits, kModel);
  ASSERT_TRUE(std::holds_alternative<ChatCompletionRequest>(r));
  EXPECT_TRUE(std::get<ChatCompletionRequest>(r).stream.include_usage);
  EXPECT_EQ(ChatParam(Chat({{"chat_template", "{{ 1 }}"}})), "chat_template");
  EXPECT_EQ(ChatParam(Chat({{"chat_template_kwargs", {{"chat_template", "x"}}}})),
            "chat_template_kwargs");
  EXPECT_EQ(ChatParam(Chat({{"chat_template_kwargs", {{"thinking", true}}}})), "OK");
  EXPECT_EQ(ChatParam(Chat({{"response_format", {{"type", "json_object"}}}})), "OK");
  EXPECT_EQ(ChatParam(Chat({{"response_format", {{"type", "xml"}}}})), "response_format");
  EXPECT_EQ(ChatParam(Chat({{"user", "u"}, {"unknown_field", 1}, {"metadata", {{"a", "b"}}}})), "OK");
}

TEST(CompletionValidation, PromptShapes) {
  EXPECT_EQ(CompletionParam({{"prompt", "hello"}}), "OK");
  EXPECT_EQ(CompletionParam({{"prompt", {"a", "b"}}}), "OK");
  EXPECT_EQ(CompletionParam({{"prompt", {1, 2, 3}}}), "OK");
  EXPECT_EQ(CompletionParam({{"prompt", {{1, 2}, {3}}}}), "OK");
  EXPECT_EQ(CompletionParam({{"prompt", ""}}), "prompt");
  EXPECT_EQ(CompletionParam({{"prompt", Json::array()}}), "prompt");
  EXPECT_EQ(CompletionParam({{"prompt", {Json::array()}}}), "prompt");
  EXPECT_EQ(CompletionParam({{"prompt", 5}}), "prompt");
  EXPECT_EQ(CompletionParam({{"prompt", {"a", 1}}}), "prompt");
  EXPECT_EQ(CompletionParam(Json::object()), "prompt");
  for (Json bad : {Json(-1), Json(1000), Json(2147483647), Json(4294967295ULL),
                   Json(18446744073709551615ULL)}) {
    EXPECT_EQ(CompletionParam({{"prompt", {1, bad}}}), "prompt") << bad.dump();
  }
}

TEST(CompletionValidation, LogprobsEchoAndDefaults) {
  EXPECT_EQ(CompletionParam({{"prompt", "x"}, {"logprobs", 6}}), "logprobs");
  EXPECT_EQ(CompletionParam({{"prompt", "x"}, {"logprobs", true}}), "logprobs");
  EXPECT_EQ(CompletionParam({{"prompt", "x"}, {"suffix", "s"}}), "suffix");
  EXPECT_EQ(CompletionParam({{"prompt", "x"}, {"echo", "y"}}), "echo");
  auto r = ParseCompletionRequest({{"model", "m"}, {"prompt", {5, 6}}, {"logprobs", 1},
                                   {"echo", true}, {"max_tokens", 1}},
                                  kLimits, kModel);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  const auto& c = std::get<CompletionRequest>(r);
  EXPECT_TRUE(c.echo);
  EXPECT_EQ(c.logprobs.value_or(-1), 1);
  ASSERT_EQ(c.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(c.prompts[0]), (std::vector<int32_t>{5, 6}));
  Json many = Json::array();
  for (int i = 0; i < kLimits.max_prompts + 1; ++i) many.push_back("p");
  EXPECT_EQ(CompletionParam({{"prompt", many}}), "prompt");
  EXPECT_EQ(CompletionParam({{"prompt", {"a", "b"}}, {"n", kLimits.max_n}}), "OK");
}

TEST(ContextLength, FillsDefaultsAndRejectsOverflow) {
  std::optional<int64_t> max_tokens;
  EXPECT_FALSE(CheckContextLength(10, 256, &max_tokens, 0));
  EXPECT_EQ(*max_tokens, 246);
  max_tokens.reset();
  EXPECT_FALSE(CheckContextLength(10, 256, &max_tokens, 16));
  EXPECT_EQ(*max_tokens, 16);
  max_tokens = 300;
  auto e = CheckContextLength(10, 256, &max_tokens, 16);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param.value_or(""), "max_tokens");
  EXPECT_NE(e->message.find("256"), std::string::npos);
  max_tokens.reset();
  e = CheckContextLength(256, 256, &max_tokens, 16);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code.value_or(""), "context_length_exceeded");
}

TEST(TokenizeValidation, Shapes) {
  auto t = ParseTokenizeRequest({{"prompt", "abc"}});
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t));
  EXPECT_TRUE(std::holds_alternative<ApiError>(ParseTokenizeRequest(Json::object())));
  auto d = ParseDetokenizeRequest({{"tokens", {1, 2}}}, kModel);
  ASSERT_TRUE(std::holds_alternative<DetokenizeRequest>(d));
  EXPECT_TRUE(std::holds_alternative<ApiError>(ParseDetokenizeRequest({{"tokens", {4294967295ULL}}}, kModel)));
}

}  // namespace
}  // namespace dh::server
