// Structured output through the real server and the embedded model: every schema of
// data/structured_schemas.json constrains a greedy chat completion whose output must parse as
// JSON and validate with ajv (validate_structured.mjs; that step skips, saying why, without
// npm); the other constraint fields (guided_choice/regex/grammar, json_object, llama.cpp's
// grammar) hold; unsupported keywords are 400s naming them; strict:false gives a Warning header.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

namespace fs = std::filesystem;

std::string RunShell(const std::string& cmd, int* status) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) {
    *status = -1;
    return "";
  }
  std::string out;
  char buf[1024];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  const int rc = pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

class StructuredOutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    ASSERT_TRUE(server_->Start()) << server_->log();
    model_ = ServedModel(*server_);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  Json Chat(Json extra, int max_tokens = 200) {
    Json body = {{"model", model_},
                 {"messages", {{{"role", "user"}, {"content", "Answer in JSON."}}}},
                 {"max_tokens", max_tokens},
                 {"temperature", 0}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    return body;
  }
  static ServerProcess* server_;
  static std::string model_;
};
ServerProcess* StructuredOutputTest::server_ = nullptr;
std::string StructuredOutputTest::model_;

TEST_F(StructuredOutputTest, SchemaSuiteValidatesWithAjv) {
  const fs::path dir = fs::path(DH_SOURCE_DIR) / "tests" / "e2e";
  std::ifstream in(dir / "data" / "structured_schemas.json");
  const Json suite = Json::parse(in);
  ASSERT_GE(suite.size(), 60u);
  Json results = Json::array();
  // A few requests at a time: the engine batches them.
  constexpr size_t kParallel = 4;
  std::vector<Json> outputs(suite.size());
  for (size_t start = 0; start < suite.size(); start += kParallel) {
    std::vector<std::thread> threads;
    for (size_t i = start; i < std::min(suite.size(), start + kParallel); ++i) {
      threads.emplace_back([&, i] {
        const Json& c = suite[i];
        Json rf = {{"type", "json_schema"},
                   {"json_schema", {{"name", c["name"]}, {"schema", c["schema"]}, {"strict", true}}}};
        outputs[i] = server_->PostJson("/v1/chat/completions", Chat({{"response_format", rf}})).json();
      });
    }
    for (auto& t : threads) t.join();
  }
  for (size_t i = 0; i < suite.size(); ++i) {
    const Json& c = suite[i];
    const Json& r = outputs[i];
    ASSERT_TRUE(r.contains("choices")) << c["name"] << ": " << r.dump();
    const Json& choice = r["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "stop") << c["name"] << ": " << r.dump();
    const std::string text = choice["message"]["content"].get<std::string>();
    EXPECT_FALSE(Json::parse(text, nullptr, false).is_discarded()) << c["name"] << ": " << text;
    results.push_back({{"name", c["name"]}, {"schema", c["schema"]}, {"output", text}});
  }

  int status = 0;
  RunShell("node --version && npm --version", &status);
  if (status != 0) GTEST_SKIP() << "node/npm not installed: outputs parsed as JSON but were not validated with ajv";
  if (!fs::exists(dir / "node_modules" / "ajv-formats" / "package.json") ||
      !fs::exists(dir / "node_modules" / "zod" / "package.json")) {
    std::string out = RunShell("cd '" + dir.string() + "' && timeout 300 npm ci --no-audit --no-fund", &status);
    if (status != 0) GTEST_SKIP() << "could not install ajv from npm (npm ci):\n" << out;
  }
  const fs::path file = fs::temp_directory_path() / ("dh_structured_" + std::to_string(getpid()) + ".json");
  std::ofstream(file) << results.dump();
  std::string out = RunShell("cd '" + dir.string() + "' && node validate_structured.mjs '" + file.string() + "'", &status);
  fs::remove(file);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find(std::to_string(suite.size()) + "/" + std::to_string(suite.size()) + " outputs valid"),
            std::string::npos)
      << out;
}

TEST_F(StructuredOutputTest, OtherConstraintFields) {
  Json a = server_->PostJson("/v1/chat/completions", Chat({{"guided_choice", {"yes", "no", "perhaps"}}})).json();
  const std::string choice = a["choices"][0]["message"]["content"];
  EXPECT_TRUE(choice == "yes" || choice == "no" || choice == "perhaps") << a.dump();

  Json b = server_->PostJson("/v1/chat/completions", Chat({{"guided_regex", "[A-Z][a-z]{2,5} [0-9]{3}"}})).json();
  const std::string re = b["choices"][0]["message"]["content"];
  ASSERT_EQ(re.size() >= 7 && re.size() <= 10, true) << re;
  EXPECT_TRUE(std::isupper(static_cast<unsigned char>(re[0]))) << re;
  EXPECT_EQ(re[re.size() - 4], ' ') << re;

  Json c = server_->PostJson("/v1/chat/completions",
                             Chat({{"grammar", "root ::= \"Hark\" (\", \" word){1,3} \"!\"\nword ::= [a-z]{1,6}"}})).json();
  const std::string g = c["choices"][0]["message"]["content"];
  EXPECT_EQ(g.rfind("Hark, ", 0), 0u) << g;
  EXPECT_EQ(g.back(), '!') << g;

  Json d = server_->PostJson("/v1/chat/completions", Chat({{"response_format", {{"type", "json_object"}}}})).json();
  const std::string obj = d["choices"][0]["message"]["content"];
  if (d["choices"][0]["finish_reason"] == "stop") {
    Json parsed = Json::parse(obj, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << obj;
  } else {
    EXPECT_EQ(obj.front(), '{') << obj;
  }

  Json e = server_->PostJson("/v1/completions", {{"model", model_}, {"prompt", "ROMEO:"}, {"max_tokens", 40},
                                                 {"temperature", 0}, {"guided_json", {{"type", "integer"}, {"minimum", 3}, {"maximum", 17}}}}).json();
  const int v = std::stoi(e["choices"][0]["text"].get<std::string>());
  EXPECT_GE(v, 3);
  EXPECT_LE(v, 17);

  // Streaming gives the same text as the full response.
  std::vector<std::string> events = server_->StreamEvents(
      "/v1/chat/completions", Chat({{"stream", true}, {"structured_outputs", {{"choice", {"alpha", "beta"}}}}}));
  std::string streamed;
  for (const std::string& ev : events) {
    Json j = Json::parse(ev, nullptr, false);
    if (j.is_object() && !j["choices"].empty() && j["choices"][0]["delta"].contains("content"))
      streamed += j["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_TRUE(streamed == "alpha" || streamed == "beta") << streamed;
}

TEST_F(StructuredOutputTest, UnsupportedKeywordsAre400sNamingThem) {
  const std::vector<std::pair<std::string, Json>> cases = {
      {"uniqueItems", {{"type", "array"}, {"uniqueItems", true}}},
      {"contains", {{"type", "array"}, {"contains", {{"type", "integer"}}}}},
      {"patternProperties", {{"type", "object"}, {"patternProperties", {{"^a", {{"type", "integer"}}}}}}},
      {"propertyNames", {{"type", "object"}, {"propertyNames", {{"maxLength", 3}}}}},
      {"minProperties", {{"type", "object"}, {"minProperties", 1}}},
      {"maxProperties", {{"type", "object"}, {"maxProperties", 1}}},
      {"multipleOf", {{"type", "integer"}, {"multipleOf", 3}}},
      {"not", {{"not", {{"type", "string"}}}}},
      {"if", {{"if", {{"type", "string"}}}, {"then", {{"maxLength", 2}}}}},
      {"dependentRequired", {{"type", "object"}, {"dependentRequired", {{"a", {"b"}}}}}},
      {"unevaluatedProperties", {{"type", "object"}, {"unevaluatedProperties", false}}},
      {"format", {{"type", "string"}, {"format", "ipv6"}}},
  };
  for (const auto& [keyword, schema] : cases) {
    Json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}};
    HttpResult r = server_->PostJson("/v1/chat/completions", Chat({{"response_format", rf}}));
    EXPECT_EQ(r.status, 400) << keyword << ": " << r.body;
    const std::string message = r.json()["error"]["message"].get<std::string>();
    EXPECT_NE(message.find("'" + keyword + "'"), std::string::npos) << message;
    EXPECT_EQ(r.json()["error"]["param"], "response_format.json_schema") << r.body;
  }
  // Lenient: answered, with a Warning header naming what was not enforced.
  Json rf = {{"type", "json_schema"},
             {"json_schema", {{"name", "x"}, {"strict", false}, {"schema", {{"type", "array"}, {"maxItems", 2}, {"uniqueItems", true}}}}}};
  HttpResult ok = server_->PostJson("/v1/chat/completions", Chat({{"response_format", rf}}));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_NE(ok.header("Warning").find("uniqueItems"), std::string::npos) << ok.header("Warning");
  // Malformed constraints are 400s too, and the server keeps serving.
  EXPECT_EQ(server_->PostJson("/v1/chat/completions", Chat({{"guided_regex", "(a"}})).status, 400);
  EXPECT_EQ(server_->PostJson("/v1/chat/completions", Chat({{"grammar", "root ::= missing"}})).status, 400);
  EXPECT_EQ(server_->PostJson("/v1/chat/completions", Chat({{"guided_choice", {"a"}}, {"guided_regex", "a"}})).status, 400);
  EXPECT_EQ(server_->Get("/health").status, 200);
}

}  // namespace
}  // namespace dh::e2e
