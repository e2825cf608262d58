// PCRE2 on long inputs (no stack overflow, JIT stack or interpreter fallback) and concurrent
// Encode calls sharing one tokenizer (per-thread match state, shared BPE cache).
#include <gtest/gtest.h>

#include <thread>

#include "tokenizer/regex.h"
#include "unit/tokenizer/real_tokenizers.h"

namespace dh {
namespace {

TEST(RegexTest, BacktrackingGroupOnMegabyteInput) {
  auto re = tok::Regex::Compile("(?:x|xy)+z?|\\s+(?!\\S)");
  ASSERT_TRUE(re.ok()) << re.status().message();
  std::string subject(1 << 20, 'x');
  subject += "   q";
  std::vector<std::pair<size_t, size_t>> matches;
  const Status st = (*re)->FindAll(subject, &matches);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(matches.size(), 2u);
  EXPECT_EQ(matches[0], (std::pair<size_t, size_t>{0, 1u << 20}));
  EXPECT_EQ(matches[1], (std::pair<size_t, size_t>{(1u << 20), (1u << 20) + 2}));
}

TEST(RegexTest, CompileErrorNamesPattern) {
  auto re = tok::Regex::Compile("[a-");
  ASSERT_FALSE(re.ok());
  EXPECT_NE(re.status().message().find("/[a-/"), std::string::npos) << re.status().message();
}

TEST(ConcurrencyTest, ParallelEncodesAgree) {
  const Tokenizer* t = testing_util::RealTokenizer("qwen3");
  if (t == nullptr) GTEST_SKIP() << "shared tokenizers absent under " << testing_util::SharedDir();
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) {
    texts.push_back("Thread " + std::to_string(i) + " says: 深度求索 naïve café 😀 " +
                    std::string(static_cast<size_t>(i % 7), ' ') + "x" + std::to_string(i * i));
  }
  std::vector<std::vector<int32_t>> expected;
  for (const auto& s : texts) expected.push_back(*t->Encode(s, false));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) {
        for (size_t i = 0; i < texts.size(); ++i) {
          auto ids = t->Encode(texts[i], false);
          if (!ids.ok() || *ids != expected[i]) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace dh
