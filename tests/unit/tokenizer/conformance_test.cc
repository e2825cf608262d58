// Conformance against Hugging Face: ../shared/fixtures/tokenizer/<name>.jsonl hold the ids and
// decodes `tokenizers` produces for the real DeepSeek-V3, Qwen3 and Llama-3.1 tokenizer files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/tokenizer.h"
#include "unit/tokenizer/real_tokenizers.h"

namespace dh {
namespace {

const std::filesystem::path kShared = testing_util::SharedDir();

class ConformanceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceTest, MatchesHuggingFace) {
  const auto dir = kShared / "data" / "tokenizers" / GetParam();
  const auto fixture = kShared / "fixtures" / "tokenizer" / (GetParam() + ".jsonl");
  if (!std::filesystem::exists(dir / "tokenizer.json") || !std::filesystem::exists(fixture)) {
    GTEST_SKIP() << "shared tokenizer data absent (" << dir << ", " << fixture << ")";
  }
  const Tokenizer* tokenizer = testing_util::RealTokenizer(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  std::ifstream in(fixture);
  std::string line;
  int cases = 0, failures = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto c = nlohmann::json::parse(line);
    const std::string text = c.at("text");
    ++cases;
    auto ids = tokenizer->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    const auto expected = c.at("ids").get<std::vector<int32_t>>();
    if (*ids != expected) {
      ++failures;
      ADD_FAILURE() << "encode " << nlohmann::json(text).dump() << "\n  got  "
                    << nlohmann::json(*ids).dump() << "\n  want "
                    << nlohmann::json(expected).dump();
    }
    if (c.contains("ids_with_special")) {
      auto with = tokenizer->Encode(text, /*add_special_tokens=*/true);
      ASSERT_TRUE(with.ok()) << with.status().message();
      EXPECT_EQ(*with, c.at("ids_with_special").get<std::vector<int32_t>>())
          << "encode with special tokens " << nlohmann::json(text).dump();
    }
    if (c.contains("decoded")) {
      auto decoded = tokenizer->Decode(expected, /*skip_special_tokens=*/false);
      ASSERT_TRUE(decoded.ok()) << decoded.status().message();
      EXPECT_EQ(*decoded, c.at("decoded").get<std::string>())
          << "decode " << nlohmann::json(expected).dump();
    }
  }
  EXPECT_EQ(failures, 0) << "of " << cases << " cases";
  EXPECT_GT(cases, 100);
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, ConformanceTest,
                         ::testing::Values("deepseek-v3", "qwen3", "llama3.1"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-' || ch == '.') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace dh
