// `--speculative mtp --num-speculative-tokens K` through the real binary (docs/mtp.md):
// - `generate` on tests/golden/fixtures/ds_v3_mtp prints the same greedy ids with K = 1 and 3 as
//   without drafts, and its summary line on stderr counts the drafts;
// - bad flags and a checkpoint without an MTP layer give one line on stderr and exit 2.
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

}  // namespace
}  // namespace dh::e2e
