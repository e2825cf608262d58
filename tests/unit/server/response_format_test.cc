// Response/SSE formatting, error bodies, metrics text and UTF-8 safety of the JSON writer.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/json_util.h"
#include "server/metrics.h"
#include "server/openai_response.h"

namespace dh::server {
namespace {

const ResponseMeta kMeta{"chatcmpl-1", 1700000000, "tiny"};

Json ParseEvent(const std::string& event) {
  EXPECT_EQ(event.rfind("data: ", 0), 0u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  return Json::parse(event.substr(6, event.size() - 8));
}

TEST(ErrorBody, HasOpenAiShape) {
  Json body = Json::parse(ErrorBody(BadRequest("temperature", "'temperature' must be a number")));
  ASSERT_TRUE(body.contains("error"));
  const Json& e = body["error"];
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["param"], "temperature");
  EXPECT_TRUE(e["code"].is_null());
  EXPECT_TRUE(e["message"].is_string());
  Json unauthorized = Json::parse(ErrorBody(Unauthorized()))["error"];
  EXPECT_EQ(unauthorized["code"], "invalid_api_key");
  EXPECT_TRUE(unauthorized["param"].is_null());
  EXPECT_EQ(ModelNotFound("tiny").status, 404);
  EXPECT_EQ(Overloaded().status, 503);
  EXPECT_EQ(PayloadTooLarge(10).status, 413);
}

TEST(ErrorBody, StatusCodesMapToOpenAiErrors) {
  // A request aborted because the engine stopped (shutdown) is a 503 the client may retry
  // elsewhere, not a 500.
  const ApiError stopped = FromStatus(Status(StatusCode::kCancelled, "engine stopped"));
  EXPECT_EQ(stopped.status, 503);
  EXPECT_EQ(stopped.code, "server_shutting_down");
  EXPECT_EQ(FromStatus(ResourceExhausted("queue full")).status, 503);
  EXPECT_EQ(FromStatus(InvalidArgument("bad")).status, 400);
  EXPECT_EQ(FromStatus(Internal("boom")).status, 500);
  EXPECT_EQ(FromEngineError(Status(StatusCode::kCancelled, "engine stopped")).code,
            "server_shutting_down");
  EXPECT_EQ(FromEngineError(Internal("kernel failed")).status, 500);
  // A failed tensor-parallel job: still a 503 shutdown, with the reason that names the rank.
  const ApiError rank = FromEngineError(Status(
      StatusCode::kCancelled, "tensor-parallel step 7: a rank exited; rank 1 (pid 42) has exited"));
  EXPECT_EQ(rank.status, 503);
  EXPECT_EQ(rank.code, "server_shutting_down");
  EXPECT_EQ(rank.message,
            "The server is shutting down: tensor-parallel step 7: a rank exited; rank 1 (pid 42) "
            "has exited");
  EXPECT_EQ(FromEngineError(Status(StatusCode::kCancelled, "engine stopped")).message,
            "The server is shutting down");
}

TEST(SafeDump, InvalidUtf8NeverThrows) {
  std::string bad = "ok\xC3\x28\xED\xA0\x80\xF4\x90\x80\x80\xE6\xAD";
  Json j = {{"text", bad}};
  std::string out;
  ASSERT_NO_THROW(out = SafeDump(j));
  Json back = Json::parse(out);
  EXPECT_EQ(back["text"].get<std::string>().substr(0, 2), "ok");
  std::string err;
  ASSERT_NO_THROW(err = ErrorBody(InternalError(bad)));
  EXPECT_NO_THROW(Json::parse(err));
}

TEST(Utf8, ValidateAndSanitize) {
  EXPECT_TRUE(IsValidUtf8("h\xC3\xA9llo \xE4\xBD\xA0\xF0\x9F\x98\x80"));
  for (std::string bad : {std::string("\xC0\x80"), std::string("\xE0\x80\xAF"),
                          std::string("\xED\xA0\x80"), std::string("\xF4\x90\x80\x80"),
                          std::string("\xE6\xAD"), std::string("\x80")}) {
    EXPECT_FALSE(IsValidUtf8(bad));
    std::string fixed = SanitizeUtf8(bad);
    EXPECT_TRUE(IsValidUtf8(fixed));
    EXPECT_NE(fixed.find("\xEF\xBF\xBD"), std::string::npos);
  }
  EXPECT_EQ(SanitizeUtf8("a\xE6\xAD" "b"), "a\xEF\xBF\xBD\xEF\xBF\xBD" "b");
}

TEST(Sse, ChatChunkSequence) {
  ChatDelta first;
  first.role = true;
  first.content = "";
  Json c0 = ParseEvent(SseEvent(ChatChunkJson(kMeta, 0, first, std::nullopt, nullptr)));
  EXPECT_EQ(c0["object"], "chat.completion.chunk");
  EXPECT_EQ(c0["id"], "chatcmpl-1");
  EXPECT_EQ(c0["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(c0["choices"][0]["delta"]["content"], "");
  EXPECT_TRUE(c0["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(c0["usage"].is_null());

  ChatDelta reasoning;
  reasoning.reasoning_content = "think";
  Json c1 = ParseEvent(SseEvent(ChatChunkJson(kMeta, 0, reasoning, std::nullopt, nullptr)));
  EXPECT_EQ(c1["choices"][0]["delta"]["reasoning_content"], "think");
  EXPECT_FALSE(c1["choices"][0]["delta"].contains("content"));
  EXPECT_FALSE(c1["choices"][0]["delta"].contains("role"));

  Json fin = ParseEvent(SseEvent(ChatChunkJson(kMeta, 1, ChatDelta{}, std::string("stop"), nullptr)));
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(fin["choices"][0]["index"], 1);
  EXPECT_TRUE(fin["choices"][0]["delta"].empty());

  Usage usage{10, 5, 4, 2};
  Json u = ParseEvent(SseEvent(UsageChunkJson(kMeta, "chat.completion.chunk", usage)));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 15);
  EXPECT_EQ(u["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(u["usage"]["completion_tokens_details"]["reasoning_tokens"], 2);
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
}

TEST(Sse, CompletionChunkAndInvalidUtf8) {
  Json c = ParseEvent(SseEvent(CompletionChunkJson(kMeta, 0, "ab\xE6", std::nullopt, nullptr)));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_TRUE(IsValidUtf8(c["choices"][0]["text"].get<std::string>()));
}

TEST(Responses, ChatAndCompletionBodies) {
  ChatChoice choice;
  choice.content = "hello";
  choice.reasoning_content = "because";
  choice.finish_reason = "length";
  choice.has_logprobs = true;
  choice.logprobs.push_back({"he", -0.5f, {{"he", -0.5f}, {"ha", -1.5f}}});
  Json chat = ChatCompletionJson(kMeta, {choice}, Usage{3, 1, 0, 0});
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["reasoning_content"], "because");
  EXPECT_EQ(chat["choices"][0]["finish_reason"], "length");
  const Json& lp = chat["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "he");
  EXPECT_EQ(lp["bytes"], Json({104, 101}));
  EXPECT_EQ(lp["top_logprobs"].size(), 2u);

  CompletionChoice cc;
  cc.text = "xy";
  cc.finish_reason = "stop";
  cc.has_logprobs = true;
  CompletionLogprob first;
  first.token = "x";
  first.has_top = false;
  cc.logprobs.push_back(first);
  cc.logprobs.push_back({"y", -0.25f, {{"y", -0.25f}}, true, 1});
  Json comp = CompletionJson(kMeta, {cc}, Usage{1, 1, 0, 0});
  const Json& clp = comp["choices"][0]["logprobs"];
  EXPECT_TRUE(clp["token_logprobs"][0].is_null());
  EXPECT_TRUE(clp["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(clp["token_logprobs"][1].get<float>(), -0.25f);
  EXPECT_EQ(clp["text_offset"], Json({0, 1}));
}

TEST(Metrics, RendersVllmNamesUnderPrefix) {
  ServerMetrics metrics("vllm:", "tiny\"model", 2048);
  RequestRecord r;
  r.finished_reason = "stop";
  r.prompt_tokens = 12;
  r.generation_tokens = 3;
  r.ttft = 0.05;
  r.itls = {0.01, 0.02};
  r.e2e = 0.08;
  metrics.RecordRequest(r);
  metrics.RecordRejected("queue_full");
  EngineSnapshot s;
  s.kv_blocks_total = 100;
  s.kv_blocks_free = 90;
  s.kv_blocks_used = 10;
  s.kv_block_size = 16;
  s.kv_capacity_tokens = 1600;
  s.kv_bytes_per_token = 168;
  s.kv_cache_dtype = "fp8";
  s.prompt_tokens = 12;
  s.generation_tokens = 3;
  std::string text = metrics.Render(s);
  auto has = [&](const std::string& needle) { return text.find(needle) != std::string::npos; };
  const std::string labels = "model_name=\"tiny\\\"model\",engine=\"0\"";
  EXPECT_TRUE(has("# TYPE vllm:num_requests_running gauge"));
  EXPECT_TRUE(has("# TYPE vllm:prompt_tokens counter"));
  EXPECT_TRUE(has("vllm:prompt_tokens_total{" + labels + "} 12\n"));
  EXPECT_TRUE(has("vllm:generation_tokens_total{" + labels + "} 3\n"));
  EXPECT_TRUE(has("vllm:request_success_total{" + labels + ",finished_reason=\"stop\"} 1\n"));
  EXPECT_TRUE(has("vllm:request_success_total{" + labels + ",finished_reason=\"length\"} 0\n"));
  EXPECT_TRUE(has("vllm:kv_cache_usage_perc{" + labels + "} 0.1\n"));
  EXPECT_TRUE(has("vllm:time_to_first_token_seconds_bucket{" + labels + ",le=\"0.04\"} 0\n"));
  EXPECT_TRUE(has("vllm:time_to_first_token_seconds_bucket{" + labels + ",le=\"0.06\"} 1\n"));
  EXPECT_TRUE(has("vllm:inter_token_latency_seconds_count{" + labels + "} 2\n"));
  EXPECT_TRUE(has("vllm:kv_cache_blocks_free{" + labels + "} 90\n"));
  EXPECT_TRUE(has("vllm:kv_cache_blocks_total{" + labels + "} 100\n"));
  EXPECT_TRUE(has("vllm:kv_cache_capacity_tokens{" + labels + "} 1600\n"));
  EXPECT_TRUE(has("vllm:kv_cache_bytes_per_token{" + labels + "} 168\n"));
  EXPECT_TRUE(has("vllm:cache_config_info{block_size=\"16\",cache_dtype=\"fp8\","
                  "num_gpu_blocks=\"100\"," + labels + "} 1\n"));
  EXPECT_TRUE(has("vllm:request_rejected_total{" + labels + ",reason=\"queue_full\"} 1\n"));
  EXPECT_TRUE(has("# TYPE vllm:e2e_request_latency_seconds histogram"));
  EXPECT_FALSE(has("deepharness:"));
  // Every sample line is "name{labels} value".
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    ASSERT_NE(end, std::string::npos);
    std::string line = text.substr(start, end - start);
    if (line[0] != '#') {
      EXPECT_EQ(line.rfind("vllm:", 0), 0u) << line;
      EXPECT_NE(line.find("} "), std::string::npos) << line;
    }
    start = end + 1;
  }
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({1, 2});
  h.Observe(0.5);
  h.Observe(1.5);
  h.Observe(5);
  std::string out;
  h.Render("x", "a=\"b\"", &out);
  EXPECT_EQ(out,
            "x_bucket{a=\"b\",le=\"1\"} 1\nx_bucket{a=\"b\",le=\"2\"} 2\n"
            "x_bucket{a=\"b\",le=\"+Inf\"} 3\nx_sum{a=\"b\"} 7\nx_count{a=\"b\"} 3\n");
}

}  // namespace
}  // namespace dh::server
