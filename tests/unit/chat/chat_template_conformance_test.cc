// Conformance with Hugging Face: renders the conversations of
// ../shared/fixtures/chat_template/<model>.jsonl with the real tokenizer_config.json templates of
// ../shared/data/tokenizers/<model> and expects the exact recorded text (or the recorded error).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "chat/chat_template.h"

namespace dh::chat {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

fs::path SharedDir() { return fs::path(DH_SOURCE_DIR) / ".." / "shared"; }

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ChatTemplateConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateConformance, MatchesHuggingFaceRenderings) {
  const std::string model = GetParam();
  fs::path config_path = SharedDir() / "data" / "tokenizers" / model / "tokenizer_config.json";
  fs::path fixture_path = SharedDir() / "fixtures" / "chat_template" / (model + ".jsonl");
  if (!fs::exists(config_path) || !fs::exists(fixture_path)) {
    GTEST_SKIP() << "shared data not found (" << config_path << ", " << fixture_path
                 << "): conformance not checked";
  }
  auto config = ChatTemplateFromTokenizerConfig(ojson::parse(ReadFile(config_path)));
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto tmpl = ChatTemplate::Parse(config->chat_template);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();

  std::ifstream in(fixture_path);
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ojson c = ojson::parse(line);
    SCOPED_TRACE(model + "/" + c["name"].get<std::string>());
    ojson ctx = {{"messages", c["messages"]},
                 {"tools", c["tools"]},
                 {"add_generation_prompt", c["add_generation_prompt"]},
                 {"bos_token", config->bos_token},
                 {"eos_token", config->eos_token}};
    auto r = tmpl->Render(ctx);
    if (c["error"].is_null()) {
      ASSERT_TRUE(r.ok()) << r.status().message();
      EXPECT_EQ(*r, c["rendered"].get<std::string>());
    } else {
      ASSERT_FALSE(r.ok()) << "expected error " << c["error"] << ", rendered: " << *r;
      // Fixtures record "Error: <message>"; our message carries <message> plus its position.
      std::string expected = c["error"].get<std::string>();
      if (expected.rfind("Error: ", 0) == 0) expected = expected.substr(7);
      EXPECT_NE(r.status().message().find(expected), std::string::npos) << r.status().message();
    }
    ++cases;
  }
  EXPECT_GT(cases, 0);
}

INSTANTIATE_TEST_SUITE_P(RealTemplates, ChatTemplateConformance,
                         ::testing::Values("deepseek-v3", "qwen3", "llama3.1"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace dh::chat
