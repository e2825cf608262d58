// <think> splitting on stream deltas: tags split across deltas, no start tag, no end tag.
#include <gtest/gtest.h>

#include "server/reasoning_stream.h"

namespace dh::server {
namespace {

// Feeds `pieces` and returns (reasoning, content).
std::pair<std::string, std::string> Split(const std::vector<std::string>& pieces) {
  ReasoningSplitter s;
  std::string r, c;
  for (const std::string& p : pieces) {
    SplitDelta d = s.Push(p);
    r += d.reasoning;
    c += d.content;
  }
  SplitDelta d = s.Finish();
  return {r + d.reasoning, c + d.content};
}

TEST(ReasoningSplitter, SplitsAtEndTag) {
  EXPECT_EQ(Split({"<think>hmm</think>answer"}), std::make_pair(std::string("hmm"), std::string("answer")));
  EXPECT_EQ(Split({"hmm</think>\n\nanswer"}), std::make_pair(std::string("hmm"), std::string("\n\nanswer")));
}

TEST(ReasoningSplitter, TagsSplitAcrossDeltas) {
  EXPECT_EQ(Split({"<th", "ink>a", "b</th", "ink>c", "d"}),
            std::make_pair(std::string("ab"), std::string("cd")));
  EXPECT_EQ(Split({"a<", "/", "t", "hink", ">", "b"}), std::make_pair(std::string("a"), std::string("b")));
}

TEST(ReasoningSplitter, NoEndTagIsAllReasoning) {
  EXPECT_EQ(Split({"still thinking </thi"}),
            std::make_pair(std::string("still thinking </thi"), std::string()));
}

TEST(ReasoningSplitter, HoldsBackOnlyPossibleTagPrefixes) {
  ReasoningSplitter s;
  EXPECT_EQ(s.Push("x").reasoning, "x");
  EXPECT_EQ(s.Push("ab<").reasoning, "ab");
  EXPECT_EQ(s.Push("b").reasoning, "<b");
  EXPECT_TRUE(s.in_reasoning());
  s.Push("</think>");
  EXPECT_FALSE(s.in_reasoning());
  EXPECT_EQ(s.Push("<think>").content, "<think>");  // only a leading start tag is dropped
}

}  // namespace
}  // namespace dh::server
