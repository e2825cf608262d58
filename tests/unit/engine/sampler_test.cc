// Sampler (greedy, filters, penalties, bias, seeds, logprobs), StopMatcher and
// SamplingParams::Validate.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "engine/stop_matcher.h"

namespace dh {
namespace {

std::vector<float> Row() { return {1.0f, 3.0f, 2.0f, 0.5f, 2.9f}; }

int32_t SampleOnce(const SamplingParams& p, std::vector<float> row, uint64_t seed = 1,
                   std::vector<int32_t> prompt = {}) {
  SequenceSampler s(p, seed, prompt);
  return s.Sample(row, {});
}

TEST(SamplerTest, GreedyPicksArgmaxAndSuppressedIdsAreNeverPicked) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(SampleOnce(p, Row()), 1);
  SequenceSampler s(p, 1, {});
  auto row = Row();
  const int32_t suppressed[] = {1};
  EXPECT_EQ(s.Sample(row, suppressed), 4);
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  SamplingParams p;
  p.top_k = 1;
  for (uint64_t seed = 0; seed < 50; ++seed) EXPECT_EQ(SampleOnce(p, Row(), seed), 1);
  SamplingParams q;
  q.top_p = 0.01f;
  for (uint64_t seed = 0; seed < 50; ++seed) EXPECT_EQ(SampleOnce(q, Row(), seed), 1);
}

TEST(SamplerTest, TopKAndMinPRestrictTheCandidates) {
  SamplingParams p;
  p.top_k = 2;  // {1, 4}
  SamplingParams m;
  m.min_p = 0.5f;  // p >= 0.5 * p(1): ids 1 and 4 (e^-0.1), not 2 (e^-1)
  std::map<int32_t, int> seen_k, seen_m;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    ++seen_k[SampleOnce(p, Row(), seed)];
    ++seen_m[SampleOnce(m, Row(), seed)];
  }
  EXPECT_EQ(seen_k.size(), 2u);
  EXPECT_TRUE(seen_k.count(1) && seen_k.count(4));
  EXPECT_EQ(seen_m.size(), 2u);
  EXPECT_TRUE(seen_m.count(1) && seen_m.count(4));
}

TEST(SamplerTest, SamplingFollowsTheSoftmax) {
  SamplingParams p;
  std::vector<float> row = {0.0f, std::log(3.0f)};  // probabilities 1/4, 3/4
  int ones = 0;
  constexpr int kDraws = 20000;
  SequenceSampler s(p, 42, {});
  for (int i = 0; i < kDraws; ++i) {
    auto r = row;
    ones += s.Sample(r, {}) == 1;
  }
  EXPECT_NEAR(static_cast<double>(ones) / kDraws, 0.75, 0.02);
}

TEST(SamplerTest, SameSeedSameSequenceOtherSeedDiffers) {
  SamplingParams p;
  auto draw = [&](uint64_t seed) {
    SequenceSampler s(p, seed, {});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto r = Row();
      out.push_back(s.Sample(r, {}));
    }
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(SamplerTest, LogitBiasForcesAndBans) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{3, 100.0f}};
  EXPECT_EQ(SampleOnce(p, Row()), 3);
  p.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(SampleOnce(p, Row()), 4);
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesLowerGeneratedTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 0.2f;  // 3.0 - 0.2 < 2.9: id 4 wins after id 1 was generated once
  SequenceSampler s(p, 1, {});
  auto r = Row();
  EXPECT_EQ(s.Sample(r, {}), 1);
  s.Accept(1);
  r = Row();
  EXPECT_EQ(s.Sample(r, {}), 4);

  SamplingParams f;
  f.temperature = 0;
  f.frequency_penalty = 0.06f;  // one occurrence: 2.94 > 2.9; two: 2.88 < 2.9
  SequenceSampler g(f, 1, {});
  g.Accept(1);
  r = Row();
  EXPECT_EQ(g.Sample(r, {}), 1);
  g.Accept(1);
  r = Row();
  EXPECT_EQ(g.Sample(r, {}), 4);
}

TEST(SamplerTest, RepetitionPenaltyCoversThePrompt) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 1.2f;  // 3.0 / 1.2 = 2.5 < 2.9
  EXPECT_EQ(SampleOnce(p, Row(), 1, {1}), 4);
  EXPECT_EQ(SampleOnce(p, Row(), 1, {0}), 1);
  // Negative logits are multiplied, i.e. pushed further down.
  std::vector<float> neg = {-1.0f, -1.1f};
  EXPECT_EQ(SampleOnce(p, neg, 1, {0}), 1);
}

TEST(SamplerTest, LogprobsAreNormalizedRankedAndSorted) {
  const auto row = Row();
  TokenLogprob lp = ComputeLogprob(row, 2, 3);
  double z = 0;
  for (float l : row) z += std::exp(l);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(z), 1e-5);
  EXPECT_EQ(lp.rank, 3);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token_id, 1);
  EXPECT_EQ(lp.top[1].token_id, 4);
  EXPECT_EQ(lp.top[2].token_id, 2);
  EXPECT_NEAR(lp.top[0].logprob, 3.0 - std::log(z), 1e-5);
  EXPECT_TRUE(ComputeLogprob(row, 0, 0).top.empty());
}

TEST(StopMatcherTest, MatchesAcrossPiecesAndHoldsBackPossiblePrefixes) {
  StopMatcher m({"cde"}, false);
  auto s1 = m.Push("abc");
  EXPECT_EQ(s1.text, "ab");  // "c" may start "cde"
  EXPECT_FALSE(s1.stop_index);
  auto s2 = m.Push("d");
  EXPECT_EQ(s2.text, "");
  auto s3 = m.Push("ef");
  EXPECT_EQ(s3.text, "");
  ASSERT_TRUE(s3.stop_index);
  EXPECT_EQ(*s3.stop_index, 0u);
  EXPECT_EQ(m.Push("zzz").text, "");
}

TEST(StopMatcherTest, ReleasesHeldTextWhenThePrefixBreaks) {
  StopMatcher m({"cde", "xy"}, false);
  EXPECT_EQ(m.Push("abcd").text, "ab");
  EXPECT_EQ(m.Push("x").text, "cd");
  EXPECT_EQ(m.Push("q").text, "xq");
  EXPECT_EQ(m.Push("c").text, "");
  EXPECT_EQ(m.Flush(), "c");
}

TEST(StopMatcherTest, EarliestMatchWinsAndIncludeKeepsTheStopText) {
  StopMatcher m({"world", "lo w"}, true);
  auto s = m.Push("hello world");
  ASSERT_TRUE(s.stop_index);
  EXPECT_EQ(*s.stop_index, 1u);
  EXPECT_EQ(s.text, "hello w");
}

TEST(SamplingParamsTest, ValidateNamesTheField) {
  SamplingParams p;
  EXPECT_TRUE(p.Validate(100, true).ok());
  auto msg = [](SamplingParams q, bool tok = true) { return q.Validate(100, tok).message(); };
  p.top_p = 0;
  EXPECT_NE(msg(p).find("top_p"), std::string::npos);
  p = SamplingParams();
  p.logprobs = 21;
  EXPECT_NE(msg(p).find("logprobs"), std::string::npos);
  p = SamplingParams();
  p.logit_bias = {{100, 1.0f}};
  EXPECT_NE(msg(p).find("logit_bias"), std::string::npos);
  p = SamplingParams();
  p.stop_token_ids = {-1};
  EXPECT_NE(msg(p).find("stop_token_ids"), std::string::npos);
  p = SamplingParams();
  p.stop = {"x"};
  EXPECT_NE(msg(p, false).find("stop"), std::string::npos);
  p = SamplingParams();
  p.min_tokens = 20;
  EXPECT_NE(msg(p).find("min_tokens"), std::string::npos);
  p = SamplingParams();
  p.temperature = -1;
  EXPECT_NE(msg(p).find("temperature"), std::string::npos);
  p = SamplingParams();
  p.frequency_penalty = 3;
  EXPECT_NE(msg(p).find("frequency_penalty"), std::string::npos);
}

}  // namespace
}  // namespace dh
