// `--speculative mtp --num-speculative-tokens K` through the real binary (docs/mtp.md):
// - `generate` on tests/golden/fixtures/ds_v3_mtp prints the same greedy ids with K = 1 and 3 as
//   without drafts, and its summary line on stderr counts the drafts;
// - bad flags and a checkpoint without an MTP layer give one line on stderr and exit 2;
// - `serve --speculative mtp` on the embedded model (trained with an MTP layer) answers greedy
//   chat and completion requests, streamed or not, exactly as a server without it, and its
//   /metrics count the drafts, the accepted tokens and the acceptance per position.
#include <gtest/gtest.h>

#include <string>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

const std::string kMtp = std::string(DH_SOURCE_DIR) + "/tests/golden/fixtures/ds_v3_mtp";
const std::string kNoMtp = std::string(DH_SOURCE_DIR) + "/tests/golden/fixtures/ds_v3";
const std::string kIds = "--token-ids 177,233,25,236,225,100,221,183,82,163,32,102";

void ExpectOneLineError(const CliRun& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "expected one line, got:\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST(SpeculativeCli, GenerateGreedyIdsUnchanged) {
  const std::string base = "generate -q --threads 2 --model-path " + kMtp + " " + kIds +
                           " --max-tokens 24 --ignore-eos";
  const CliRun plain = RunCli(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_FALSE(plain.out.empty());
  for (const char* k : {"1", "3"}) {
    const CliRun spec = RunCli("generate --threads 2 --model-path " + kMtp + " " + kIds +
                               " --max-tokens 24 --ignore-eos --speculative mtp "
                               "--num-speculative-tokens " + std::string(k));
    ASSERT_EQ(spec.exit_code, 0) << spec.err;
    EXPECT_EQ(spec.out, plain.out) << "K " << k;
    EXPECT_NE(spec.err.find("speculative decoding (mtp, K " + std::string(k) + ")"),
              std::string::npos)
        << spec.err;
  }
}

TEST(SpeculativeCli, BadFlagsAreOneLineErrors) {
  const std::string gen = "generate --threads 2 " + kIds + " --model-path ";
  ExpectOneLineError(RunCli(gen + kMtp + " --speculative eagle"), "--speculative: expected mtp");
  ExpectOneLineError(RunCli(gen + kMtp + " --speculative mtp --num-speculative-tokens 0"),
                     "--num-speculative-tokens: expected 1..8, got 0");
  ExpectOneLineError(RunCli(gen + kMtp + " --speculative mtp --num-speculative-tokens 9"),
                     "--num-speculative-tokens: expected 1..8, got 9");
  ExpectOneLineError(RunCli(gen + kNoMtp + " --speculative mtp"), "has no MTP layer");
}

TEST(SpeculativeServe, SameGreedyTextAndDraftMetrics) {
  const Json completion = {{"prompt", "ROMEO:"}, {"max_tokens", 40}, {"temperature", 0},
                           {"ignore_eos", true}};
  const Json chat = {{"messages", {{{"role", "user"}, {"content", "Speak"}}}},
                     {"max_tokens", 40}, {"temperature", 0}};
  std::string plain_text, plain_chat;
  {
    ServerProcess plain;
    ASSERT_TRUE(plain.Start({"--threads", "2"})) << plain.log();
    const HttpResult c = plain.PostJson("/v1/completions", completion);
    ASSERT_EQ(c.status, 200) << c.body;
    plain_text = Json::parse(c.body)["choices"][0]["text"];
    const HttpResult m = plain.PostJson("/v1/chat/completions", chat);
    ASSERT_EQ(m.status, 200) << m.body;
    plain_chat = Json::parse(m.body)["choices"][0]["message"]["content"];
  }
  ServerProcess spec;
  ASSERT_TRUE(spec.Start({"--threads", "2", "--speculative", "mtp", "--num-speculative-tokens",
                          "3"}))
      << spec.log();
  const HttpResult c = spec.PostJson("/v1/completions", completion);
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(Json::parse(c.body)["choices"][0]["text"], plain_text);
  const HttpResult m = spec.PostJson("/v1/chat/completions", chat);
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_EQ(Json::parse(m.body)["choices"][0]["message"]["content"], plain_chat);
  Json streamed = completion;
  streamed["stream"] = true;
  std::string text;
  for (const std::string& e : spec.StreamEvents("/v1/completions", streamed)) {
    if (e == "[DONE]") break;
    const Json j = Json::parse(e);
    if (!j["choices"].empty()) text += j["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, plain_text);
  const auto metrics = spec.Metrics();
  const double drafted = MetricValue(metrics, "spec_decode_num_draft_tokens_total");
  const double accepted = MetricValue(metrics, "spec_decode_num_accepted_tokens_total");
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0) << "the embedded model's MTP layer is trained: some drafts agree";
  EXPECT_LE(accepted, drafted);
  EXPECT_GE(MetricValue(metrics, "spec_decode_num_accepted_tokens_per_pos_total"), 0);
  std::string why;
  EXPECT_TRUE(spec.WaitPoolAtRest(std::chrono::seconds(10), &why)) << why;
}

}  // namespace
}  // namespace dh::e2e
