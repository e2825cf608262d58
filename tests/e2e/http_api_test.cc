// The HTTP API end to end: models, chat and completions (full and streamed), tokenize,
// metrics names, health, auth on every route, disconnect cancellation.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cctype>
#include <thread>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

using namespace std::chrono_literals;

class HttpApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    ASSERT_TRUE(server_->Start({"--max-num-seqs", "8"})) << server_->log();
    model_ = ServedModel(*server_);
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
  }
  void TearDown() override {
    std::string state;
    EXPECT_TRUE(server_->WaitPoolAtRest(5s, &state)) << state;
  }
  static ServerProcess* server_;
  static std::string model_;
};
ServerProcess* HttpApiTest::server_ = nullptr;
std::string HttpApiTest::model_;

Json ChatBody(const std::string& model, int max_tokens = 8) {
  return {{"model", model},
          {"messages", {{{"role", "user"}, {"content", "To be or not to be"}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

TEST_F(HttpApiTest, ModelsAndHealth) {
  EXPECT_EQ(server_->Get("/health").status, 200);
  Json models = server_->Get("/v1/models").json();
  ASSERT_FALSE(models.is_discarded());
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_GT(models["data"][0]["max_model_len"].get<int>(), 0);
}

TEST_F(HttpApiTest, ChatCompletion) {
  HttpResult r = server_->PostJson("/v1/chat/completions", ChatBody(model_));
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = r.json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], model_);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  const std::string reason = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(reason == "stop" || reason == "length") << reason;
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 8);
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(),
            j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"].contains("cached_tokens"));
}

TEST_F(HttpApiTest, ChatStreamMatchesFullResponse) {
  Json body = ChatBody(model_, 12);
  body["ignore_eos"] = true;
  Json full = server_->PostJson("/v1/chat/completions", body).json();
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  int status = 0;
  auto events = server_->StreamEvents("/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  Json first = Json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  Json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    Json e = Json::parse(events[i]);  // every event is valid JSON
    EXPECT_EQ(e["id"], first["id"]);
    if (e["choices"].empty()) {
      usage = e["usage"];
      EXPECT_EQ(i + 2, events.size()) << "usage chunk must come just before [DONE]";
      continue;
    }
    EXPECT_TRUE(e["usage"].is_null());
    const Json& delta = e["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, full["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(finish, "length");
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["completion_tokens"], 12);
}

TEST_F(HttpApiTest, CompletionsPromptShapes) {
  Json by_text = server_->PostJson("/v1/completions", {{"model", model_}, {"prompt", "Romeo"},
                                                       {"max_tokens", 5}, {"temperature", 0}}).json();
  ASSERT_TRUE(by_text.contains("choices")) << by_text.dump();
  EXPECT_EQ(by_text["object"], "text_completion");
  Json tokens = server_->PostJson("/tokenize", {{"model", model_}, {"prompt", "Romeo"}}).json();
  ASSERT_TRUE(tokens.contains("tokens")) << tokens.dump();
  EXPECT_EQ(tokens["count"], tokens["tokens"].size());
  Json by_ids = server_->PostJson("/v1/completions", {{"model", model_}, {"prompt", tokens["tokens"]},
                                                      {"max_tokens", 5}, {"temperature", 0}}).json();
  EXPECT_EQ(by_ids["choices"][0]["text"], by_text["choices"][0]["text"]);
  Json batch = server_->PostJson("/v1/completions",
                                 {{"model", model_}, {"prompt", {"Romeo", "Juliet"}}, {"max_tokens", 3},
                                  {"n", 2}, {"temperature", 0}}).json();
  ASSERT_EQ(batch["choices"].size(), 4u) << batch.dump();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(batch["choices"][i]["index"], i);
  Json detok = server_->PostJson("/detokenize", {{"model", model_}, {"tokens", tokens["tokens"]}}).json();
  const std::string detokenized = detok["prompt"];
  ASSERT_GE(detokenized.size(), 5u);
  EXPECT_EQ(detokenized.substr(detokenized.size() - 5), "Romeo");
}

TEST_F(HttpApiTest, CompletionsEchoWithPromptLogprobs) {
  Json tokens = server_->PostJson("/tokenize", {{"model", model_}, {"prompt", "Good night, good night"}}).json();
  const size_t n = tokens["tokens"].size();
  ASSERT_GT(n, 1u);
  HttpResult r = server_->PostJson("/v1/completions",
                                   {{"model", model_}, {"prompt", tokens["tokens"]}, {"max_tokens", 1},
                                    {"logprobs", 1}, {"echo", true}, {"temperature", 0}, {"seed", 1234}});
  ASSERT_EQ(r.status, 200) << r.body;
  Json lp = r.json()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), n + 1) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  for (size_t i = 1; i < n + 1; ++i) {
    ASSERT_TRUE(lp["token_logprobs"][i].is_number()) << i;
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
  }
  EXPECT_EQ(lp["text_offset"].size(), n + 1);
}

TEST_F(HttpApiTest, ChatLogprobs) {
  Json body = ChatBody(model_, 4);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  Json j = server_->PostJson("/v1/chat/completions", body).json();
  const Json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), j["usage"]["completion_tokens"].get<size_t>()) << j.dump();
  for (const Json& t : content) {
    EXPECT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_TRUE(t["bytes"].is_array());
  }
}

TEST_F(HttpApiTest, StopStringIsNotInOutput) {
  Json base = ChatBody(model_, 16);
  base["ignore_eos"] = true;
  std::string full = server_->PostJson("/v1/chat/completions", base).json()["choices"][0]["message"]["content"];
  // Stop at the first ASCII letter after the first character (the output may hold any bytes).
  size_t at = std::string::npos;
  for (size_t i = 1; i < full.size() && at == std::string::npos; ++i)
    if (std::isalpha(static_cast<unsigned char>(full[i]))) at = i;
  if (at == std::string::npos) GTEST_SKIP() << "no ASCII letter in the greedy output to stop at";
  const std::string stop(1, full[at]);
  base["stop"] = {stop};
  Json j = server_->PostJson("/v1/chat/completions", base).json();
  const std::string text = j["choices"][0]["message"]["content"];
  EXPECT_EQ(text, full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(HttpApiTest, MetricsUseVllmNames) {
  ASSERT_EQ(server_->PostJson("/v1/chat/completions", ChatBody(model_)).status, 200);
  auto m = server_->Metrics();
  for (const char* name : {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                           "prefix_cache_queries_total", "prefix_cache_hits_total",
                           "num_preemptions_total", "prompt_tokens_total", "generation_tokens_total",
                           "request_success_total", "time_to_first_token_seconds_count",
                           "inter_token_latency_seconds_count", "e2e_request_latency_seconds_count",
                           "request_queue_time_seconds_count", "request_prefill_time_seconds_count",
                           "request_decode_time_seconds_count", "request_prompt_tokens_count",
                           "request_generation_tokens_count", "kv_cache_blocks_total",
                           "kv_cache_blocks_free", "kv_cache_blocks_used", "kv_cache_blocks_cached",
                           "kv_cache_fragmentation_ratio", "model_load_time_seconds",
                           "resident_memory_bytes"}) {
    EXPECT_GE(MetricValue(m, name), 0) << name;
  }
  EXPECT_GT(MetricValue(m, "resident_memory_bytes"), 0);
  EXPECT_GT(MetricValue(m, "prompt_tokens_total"), 0);
}

TEST_F(HttpApiTest, DisconnectMidStreamFreesBlocksWithinOneSecond) {
  Json body = ChatBody(model_, 200);
  body["ignore_eos"] = true;
  body["stream"] = true;
  std::string payload = body.dump();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string request = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        "Content-Type: application/json\r\nContent-Length: " +
                        std::to_string(payload.size()) + "\r\n\r\n" + payload;
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos || got.find("\n\n", got.find("data: ")) == std::string::npos) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  // The request is running now; drop the connection.
  close(fd);
  const auto start = std::chrono::steady_clock::now();
  std::string state;
  ASSERT_TRUE(server_->WaitPoolAtRest(1s, &state)) << state;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  auto m = server_->Metrics();
  EXPECT_GE(MetricValue(m, "request_success_total{model_name=\"" + model_ + "\",engine=\"0\",finished_reason=\"abort\"}"), 1);
}

TEST(HttpAuthTest, EveryRouteButHealthNeedsTheKey) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--api-key", "sekret"})) << server.log();
  const std::vector<std::pair<std::string, std::string>> routes = {
      {"GET", "/v1/models"}, {"GET", "/metrics"}, {"POST", "/v1/chat/completions"},
      {"POST", "/v1/completions"}, {"POST", "/tokenize"}, {"POST", "/detokenize"},
      {"GET", "/nonexistent"}};
  for (const auto& [method, path] : routes) {
    for (const httplib::Headers& h : {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer wrong"}},
                                      httplib::Headers{{"Authorization", "sekret"}}}) {
      HttpResult r = method == "GET" ? server.Get(path, h) : server.Post(path, "{}", h);
      EXPECT_EQ(r.status, 401) << method << " " << path;
      EXPECT_EQ(r.json()["error"]["code"], "invalid_api_key") << r.body;
    }
  }
  EXPECT_EQ(server.Get("/health").status, 200);
  server.set_api_key("sekret");
  EXPECT_EQ(server.Get("/v1/models").status, 200);
  EXPECT_EQ(server.Stop(), 0);
}

TEST(HttpAuthTest, ApiKeyFromEnvironment) {
  setenv("DEEPHARNESS_API_KEY", "from-env", 1);
  ServerProcess server;
  const bool started = server.Start();
  unsetenv("DEEPHARNESS_API_KEY");
  ASSERT_TRUE(started) << server.log();
  EXPECT_EQ(server.Get("/v1/models").status, 401);
  server.set_api_key("from-env");
  EXPECT_EQ(server.Get("/v1/models").status, 200);
  EXPECT_EQ(server.Stop(), 0);
}

TEST(HttpLifecycleTest, SigtermDrainsStreamsAndExitsZero) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--shutdown-timeout", "30"})) << server.log();
  const std::string model = ServedModel(server);
  Json body = ChatBody(model, 40);
  body["ignore_eos"] = true;
  body["stream"] = true;
  std::vector<std::vector<std::string>> results(4);
  std::vector<int> statuses(4, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] { results[i] = server.StreamEvents("/v1/chat/completions", body, &statuses[i]); });
  }
  // Wait until the streams are running, then ask the server to stop.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (MetricValue(server.Metrics(), "num_requests_running") < 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  kill(server.pid(), SIGTERM);
  std::this_thread::sleep_for(100ms);
  HttpResult health = server.Get("/health");
  HttpResult late = server.PostJson("/v1/chat/completions", ChatBody(model));
  for (auto& t : clients) t.join();
  const int code = server.Stop(/*sig=*/0, 60s);  // wait for the exit started by the SIGTERM above
  EXPECT_EQ(code, 0) << server.log();
  // While draining: not healthy, and new work is refused (or the listener is already gone).
  EXPECT_TRUE(health.status == 503 || health.status == 0) << health.status;
  EXPECT_TRUE(late.status == 503 || late.status == 0) << late.status;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(statuses[i], 200);
    ASSERT_FALSE(results[i].empty());
    EXPECT_EQ(results[i].back(), "[DONE]") << "stream " << i << " was cut";
  }
}

TEST(HttpCliTest, UnknownDeviceAndTensorParallelAreClearErrors) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--device", "npu"}, std::vector<std::string>{"--tp-size", "0"},
        std::vector<std::string>{"--tensor-parallel-size", "-1"}}) {
    std::string cmd = std::string(DH_BINARY) + " serve --model-path " + TestModelDir();
    for (const std::string& e : extra) cmd += " " + e;
    cmd += " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[512];
    while (fgets(buf, sizeof(buf), p)) out += buf;
    const int status = pclose(p);
    EXPECT_EQ(WEXITSTATUS(status), 2) << out;
    EXPECT_NE(out.find("error:"), std::string::npos) << out;
    if (extra[0] == "--device") {
      EXPECT_NE(out.find("cpu"), std::string::npos) << out;
    }
  }
}

}  // namespace
}  // namespace dh::e2e
