// End-to-end check of `deepharness chat-template`: JSON lines in, {"rendered"} / {"error"} out,
// against the shared Hugging Face fixtures. Skips when the binary or ../shared is missing.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string RunCommand(const std::string& cmd, int* exit_code) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = pclose(p);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(ChatTemplateCommand, RendersFixtureConversations) {
  fs::path shared = fs::path(DH_SOURCE_DIR) / ".." / "shared";
  if (!fs::exists(DH_BINARY)) GTEST_SKIP() << "deepharness binary not built: " << DH_BINARY;
  for (const char* model : {"deepseek-v3", "qwen3", "llama3.1"}) {
    fs::path dir = shared / "data" / "tokenizers" / model;
    fs::path fixture = shared / "fixtures" / "chat_template" / (std::string(model) + ".jsonl");
    if (!fs::exists(dir) || !fs::exists(fixture)) GTEST_SKIP() << "shared data not found: " << dir;
    std::string cmd = std::string(DH_BINARY) + " chat-template --model-path '" + dir.string() +
                      "' < '" + fixture.string() + "' 2>&1";
    int code = -1;
    std::stringstream out(RunCommand(cmd, &code));
    EXPECT_EQ(code, 0) << model;
    std::ifstream in(fixture);
    std::string want_line, got_line;
    int n = 0;
    while (std::getline(in, want_line)) {
      ASSERT_TRUE(std::getline(out, got_line)) << model << ": output ended after " << n << " lines";
      ojson want = ojson::parse(want_line), got = ojson::parse(got_line);
      SCOPED_TRACE(std::string(model) + "/" + want["name"].get<std::string>());
      if (want["error"].is_null()) {
        ASSERT_TRUE(got.contains("rendered")) << got_line;
        EXPECT_EQ(got["rendered"], want["rendered"]);
      } else {
        ASSERT_TRUE(got.contains("error")) << got_line;
        std::string msg = want["error"].get<std::string>().substr(7);  // drop "Error: "
        EXPECT_NE(got["error"].get<std::string>().find(msg), std::string::npos) << got_line;
      }
      ++n;
    }
  }
}

TEST(ChatTemplateCommand, BadInputLinesAndFlags) {
  if (!fs::exists(DH_BINARY)) GTEST_SKIP() << "deepharness binary not built: " << DH_BINARY;
  fs::path dir = fs::temp_directory_path() / "dh_chat_template_cmd_test";
  fs::create_directories(dir);
  {
    std::ofstream cfg(dir / "tokenizer_config.json");
    cfg << R"({"bos_token": {"content": "<s>"}, "chat_template": [{"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ extra }}"}]})";
  }
  std::string base = std::string(DH_BINARY) + " chat-template --model-path '" + dir.string() + "'";
  int code = -1;
  std::string out = RunCommand(
      "printf '%s\\n' '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"extra\": "
      "\"!\"}' "
      "'not json' '{\"nomessages\": 1}' | " +
          base + " 2>&1",
      &code);
  EXPECT_EQ(code, 2);
  std::stringstream lines(out);
  std::string l1, l2, l3;
  std::getline(lines, l1);
  std::getline(lines, l2);
  std::getline(lines, l3);
  EXPECT_EQ(l1, R"({"rendered":"<s>user:hi;!"})");
  EXPECT_NE(l2.find("\"error\""), std::string::npos);
  EXPECT_NE(l3.find("\"error\""), std::string::npos);

  {
    std::ofstream bad(dir / "bad.jinja");
    bad << "{% if %}";
  }
  out = RunCommand(
      base + " --chat-template '" + (dir / "bad.jinja").string() + "' < /dev/null 2>&1", &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("bad.jinja"), std::string::npos) << out;
  out = RunCommand(
      std::string(DH_BINARY) + " chat-template --model-path /nonexistent < /dev/null 2>&1", &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("tokenizer_config.json"), std::string::npos) << out;
  fs::remove_all(dir);
}

}  // namespace
