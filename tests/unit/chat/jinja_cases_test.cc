// Renders the small templates of jinja_cases.jsonl (expected output produced by Python Jinja2 with
// Hugging Face's settings, see gen_jinja_cases.py) and compares byte for byte.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"

namespace dh::chat {
namespace {

TEST(JinjaCases, MatchPythonJinja) {
  std::ifstream in(std::string(DH_SOURCE_DIR) + "/tests/unit/chat/jinja_cases.jsonl");
  ASSERT_TRUE(in.good()) << "missing tests/unit/chat/jinja_cases.jsonl";
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto c = nlohmann::ordered_json::parse(line);
    SCOPED_TRACE(c["name"].get<std::string>() + ": " + c["template"].get<std::string>());
    auto r = RenderChatTemplate(c["template"].get<std::string>(), c["context"]);
    if (c["error"].is_null()) {
      ASSERT_TRUE(r.ok()) << r.status().message();
      EXPECT_EQ(*r, c["rendered"].get<std::string>());
    } else {
      ASSERT_FALSE(r.ok()) << "expected an error like: " << c["error"].get<std::string>();
      // Python reports "TemplateError: <message>"; our message carries the same text.
      std::string expected = c["error"].get<std::string>();
      expected = expected.substr(expected.find(": ") + 2);
      EXPECT_NE(r.status().message().find(expected), std::string::npos) << r.status().message();
    }
    ++cases;
  }
  EXPECT_GE(cases, 50);
}

}  // namespace
}  // namespace dh::chat
