// Bad requests against the real server (reliability.md §3.3 rows about the HTTP API: 1-15, 18,
// 20, 21, 26, 35, 37). Every answer must be the OpenAI error body with the right status, and
// the server must stay healthy with its KV pool at rest afterwards.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

using namespace std::chrono_literals;

class HttpErrorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    ASSERT_TRUE(server_->Start({"--max-body-bytes", "1048576"})) << server_->log();
    model_ = ServedModel(*server_);
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
  }
  void TearDown() override {
    EXPECT_EQ(server_->Get("/health").status, 200);
    std::string state;
    EXPECT_TRUE(server_->WaitPoolAtRest(5s, &state)) << state;
  }

  // Checks status and the error body; returns error.param ("<null>" when null).
  static std::string Expect(const HttpResult& r, int status, const std::string& what) {
    EXPECT_EQ(r.status, status) << what << ": " << r.body;
    Json j = r.json();
    EXPECT_FALSE(j.is_discarded()) << what << ": body is not JSON: " << r.body;
    if (j.is_discarded() || !j.contains("error")) {
      ADD_FAILURE() << what << ": no error object: " << r.body;
      return "";
    }
    const Json& e = j["error"];
    for (const char* key : {"message", "type", "param", "code"})
      EXPECT_TRUE(e.contains(key)) << what << ": missing error." << key;
    EXPECT_TRUE(e["message"].is_string());
    return e["param"].is_null() ? "<null>" : e["param"].get<std::string>();
  }

  Json Chat(Json extra = Json::object()) const {
    Json body = {{"model", model_}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    return body;
  }
  Json Completion(Json extra = Json::object()) const {
    Json body = {{"model", model_}, {"prompt", "hi"}, {"max_tokens", 4}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    return body;
  }

  static ServerProcess* server_;
  static std::string model_;
};
ServerProcess* HttpErrorsTest::server_ = nullptr;
std::string HttpErrorsTest::model_;

TEST_F(HttpErrorsTest, Row01MalformedJson) {
  for (std::string body : {"{\"model\":", "{\"model\":\"m\",}", "{\"temperature\":NaN}", "\xEF\xBB\xBF{}"}) {
    HttpResult r = server_->Post("/v1/chat/completions", body);
    EXPECT_EQ(Expect(r, 400, body), "<null>");
    EXPECT_EQ(r.json()["error"]["code"], "invalid_json");
  }
}

TEST_F(HttpErrorsTest, Row02NonObjectBodies) {
  for (std::string body : {"[]", "42", "\"x\"", "null", ""}) {
    Expect(server_->Post("/v1/chat/completions", body), 400, "body '" + body + "'");
    Expect(server_->Post("/v1/completions", body), 400, "body '" + body + "'");
  }
}

TEST_F(HttpErrorsTest, Row03WrongTypes) {
  const std::vector<std::pair<std::string, Json>> cases = {
      {"messages", "hi"}, {"max_tokens", "10"}, {"max_tokens", 1.5}, {"temperature", "hot"},
      {"stream", "yes"}, {"stop", 5}};
  for (const auto& [field, value] : cases) {
    EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{field, value}})), 400, field), field);
  }
}

TEST_F(HttpErrorsTest, Row04MissingAndBadMessages) {
  // 'model' is optional since issue 20 (the served model is used): a wrong type is still 400.
  Json bad_model = Chat({{"model", 3}});
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", bad_model), 400, "model 3"), "model");
  Json no_messages = Chat();
  no_messages.erase("messages");
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", no_messages), 400, "no messages"), "messages");
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{"messages", Json::array()}})), 400, "[]"),
            "messages");
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{"messages", {{{"content", "x"}}}}})), 400,
                   "no role"),
            "messages[0].role");
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions",
                                     Chat({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}})),
                   400, "bad role"),
            "messages[0].role");
  Json image = {{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", {{"url", "http://x"}}}}}}};
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{"messages", {image}}})), 400, "image"),
            "messages[0].content");
  Json no_prompt = Completion();
  no_prompt.erase("prompt");
  EXPECT_EQ(Expect(server_->PostJson("/v1/completions", no_prompt), 400, "no prompt"), "prompt");
}

TEST_F(HttpErrorsTest, Row05EmptyPrompts) {
  for (Json prompt : {Json(""), Json::array(), Json::array({Json::array()})}) {
    EXPECT_EQ(Expect(server_->PostJson("/v1/completions", Completion({{"prompt", prompt}})), 400, prompt.dump()),
              "prompt");
  }
}

TEST_F(HttpErrorsTest, Row06And07UnknownModelNames) {
  const std::vector<std::string> names = {"no-such-model", "../../etc/passwd", "/etc/passwd", "%2e%2e%2f",
                                          std::string("a\0b", 3), std::string(10000, 'm'),
                                          "x\r\nInjected: 1"};
  for (const std::string& name : names) {
    HttpResult r = server_->PostJson("/v1/chat/completions", Chat({{"model", name}}));
    Expect(r, 404, "model name of size " + std::to_string(name.size()));
    EXPECT_EQ(r.json()["error"]["code"], "model_not_found");
    EXPECT_EQ(r.body.find("etc/passwd"), std::string::npos) << "error echoes the request";
  }
}

TEST_F(HttpErrorsTest, Row08MaxTokens) {
  for (Json v : {Json(-1), Json(0), Json(2147483648LL), Json(1e30)}) {
    EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{"max_tokens", v}})), 400, v.dump()),
              "max_tokens");
  }
  const int max_len = server_->Get("/v1/models").json()["data"][0]["max_model_len"];
  HttpResult r = server_->PostJson("/v1/completions", Completion({{"max_tokens", max_len}}));
  Expect(r, 400, "prompt + max_tokens > context");
  EXPECT_EQ(r.json()["error"]["code"], "context_length_exceeded");
  EXPECT_NE(r.body.find(std::to_string(max_len)), std::string::npos) << r.body;
}

TEST_F(HttpErrorsTest, Row09N) {
  for (Json v : {Json(0), Json(-1), Json(9), Json(1000000000)}) {
    EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{"n", v}})), 400, v.dump()), "n");
  }
  EXPECT_EQ(Expect(server_->PostJson("/v1/completions", Completion({{"best_of", 1000000000}})), 400, "best_of"),
            "best_of");
}

TEST_F(HttpErrorsTest, Row10SamplingRanges) {
  const std::vector<std::pair<std::string, Json>> cases = {
      {"temperature", -0.5}, {"temperature", 2.5}, {"top_p", 0}, {"top_p", 1.5}, {"top_k", -2},
      {"presence_penalty", 3}, {"frequency_penalty", -2.5}, {"seed", "abc"}, {"seed", 1.5}};
  for (const auto& [field, value] : cases) {
    EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{field, value}})), 400,
                     field + "=" + value.dump()),
              field);
  }
}

TEST_F(HttpErrorsTest, Row11LogitBias) {
  Json many = Json::object();
  for (int i = 0; i < 5000; ++i) many[std::to_string(i)] = 1;  // > the 1024-entry cap
  for (Json bias : {Json({{"5", 1000}}), Json({{"5", -1000}}), Json({{"abc", 1}}), Json({{"1000000", 1}}), many}) {
    EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{"logit_bias", bias}})), 400, "logit_bias"),
              "logit_bias");
  }
}

TEST_F(HttpErrorsTest, Row12LogprobCaps) {
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{"logprobs", true}, {"top_logprobs", 21}})),
                   400, "top_logprobs 21"),
            "top_logprobs");
  EXPECT_EQ(Expect(server_->PostJson("/v1/completions", Completion({{"logprobs", 6}})), 400, "logprobs 6"),
            "logprobs");
  HttpResult ok = server_->PostJson("/v1/completions", Completion({{"logprobs", 5}, {"echo", true}, {"max_tokens", 1}}));
  ASSERT_EQ(ok.status, 200) << ok.body;
  Json lp = ok.json()["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
  EXPECT_EQ(lp["tokens"].size(), lp["top_logprobs"].size());
  ok = server_->PostJson("/v1/chat/completions", Chat({{"logprobs", true}, {"top_logprobs", 20}}));
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(HttpErrorsTest, Row13StopStrings) {
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{"stop", {"a", "b", "c", "d", "e"}}})), 400,
                   "5 stops"),
            "stop");
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{"stop", std::string(100 * 1024, 'x')}})), 400,
                   "100 KB stop"),
            "stop");
  // An empty stop string is ignored (documented in docs/server.md).
  EXPECT_EQ(server_->PostJson("/v1/chat/completions", Chat({{"stop", {""}}})).status, 200);
}

TEST_F(HttpErrorsTest, Row14DeepNesting) {
  std::string body = "{\"tools\":" + std::string(3000, '[') + std::string(3000, ']') + "}";
  HttpResult r = server_->Post("/v1/chat/completions", body);
  Expect(r, 400, "3000 deep");
  EXPECT_NE(r.body.find("nesting depth"), std::string::npos);
}

TEST_F(HttpErrorsTest, Row15BodyTooLarge) {
  std::string big = "{\"model\":\"" + std::string(2 << 20, 'a') + "\"}";
  Expect(server_->Post("/v1/chat/completions", big), 413, "2 MiB body");
  // A declared length far beyond the limit is refused before any body byte is read.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: 10000000000\r\n\r\n";
  send(fd, head.data(), head.size(), 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[2048];
  ssize_t n = recv(fd, buf, sizeof(buf), 0);
  close(fd);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 413", 0), 0u);
}

TEST_F(HttpErrorsTest, Row18PromptLongerThanContext) {
  const int max_len = server_->Get("/v1/models").json()["data"][0]["max_model_len"];
  std::vector<int> ids(static_cast<size_t>(max_len) + 10, 5);
  HttpResult r = server_->PostJson("/v1/completions", Completion({{"prompt", ids}}));
  Expect(r, 400, "long prompt");
  EXPECT_EQ(r.json()["error"]["code"], "context_length_exceeded");
  std::string text;
  for (int i = 0; i < max_len; ++i) text += "word ";
  r = server_->PostJson("/v1/chat/completions", Chat({{"messages", {{{"role", "user"}, {"content", text}}}}}));
  Expect(r, 400, "long chat");
}

TEST_F(HttpErrorsTest, Row20InvalidUtf8) {
  for (std::string bad : {std::string("\xC0\x80"), std::string("\xED\xA0\x80"), std::string("\xF4\x90\x80\x80"),
                          std::string("\\ud800"), std::string("\xC4\xE3\xBA\xC3")}) {
    std::string body = "{\"model\":\"" + model_ + "\",\"messages\":[{\"role\":\"user\",\"content\":\"" + bad +
                       "\"}]}";
    Expect(server_->Post("/v1/chat/completions", body), 400, "invalid UTF-8");
  }
}

TEST_F(HttpErrorsTest, Row21TokenIdsOutOfVocabulary) {
  for (Json id : {Json(-1), Json(1 << 30), Json(2147483647), Json(4294967295ULL)}) {
    HttpResult r = server_->PostJson("/v1/completions", Completion({{"prompt", {1, id}}}));
    EXPECT_EQ(Expect(r, 400, id.dump()), "prompt");
    EXPECT_NE(r.body.find("vocabulary"), std::string::npos);
  }
  Expect(server_->PostJson("/detokenize", {{"tokens", {4294967295ULL}}}), 400, "detokenize");
}

TEST_F(HttpErrorsTest, Row26RequestChatTemplateRefused) {
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions", Chat({{"chat_template", "{{ 7*7 }}"}})), 400,
                   "chat_template"),
            "chat_template");
  EXPECT_EQ(Expect(server_->PostJson("/v1/chat/completions",
                                     Chat({{"chat_template_kwargs", {{"chat_template", "{{ 7*7 }}"}}}})),
                   400, "kwargs"),
            "chat_template_kwargs");
}

TEST_F(HttpErrorsTest, Row35UnknownRouteAndWrongMethod) {
  HttpResult r = server_->Get("/v2/nothing");
  Expect(r, 404, "unknown route");
  Expect(server_->Get("/v1/chat/completions"), 405, "GET on a POST route");
  Expect(server_->Post("/v1/models", "{}"), 405, "POST on a GET route");
}

TEST_F(HttpErrorsTest, Row37ForeignHostHeader) {
  for (std::string host : {"evil.example", "evil.example:8000", ":8000"}) {
    Expect(server_->Get("/v1/models", {{"Host", host}}), 403, "Host " + host);
  }
  EXPECT_EQ(server_->Get("/v1/models", {{"Host", "localhost:" + std::to_string(server_->port())}}).status, 200);
}

}  // namespace
}  // namespace dh::e2e
