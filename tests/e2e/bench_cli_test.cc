// `deepharness bench --interleave` through the real binary on a small checkpoint
// (tests/golden/fixtures/ds_v3): the JSON result carries one paired ratio per larger batch size
// and test, each round's ratio the two rows' samples of that round, and bad values of the
// options around it stay one-line errors (exit 2).
#include <gtest/gtest.h>

#include <string>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

const std::string kModel = std::string(DH_SOURCE_DIR) + "/tests/golden/fixtures/ds_v3";

TEST(BenchCli, InterleavedBatchRatiosInJson) {
  const CliRun r = RunCli("bench -q --threads 1 --model-path " + kModel +
                          " -p 8 -n 4 -b 2,1 -r 3 --warmup 0 --interleave --no-peak "
                          "--membw-mib 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  const Json& rows = j["results"];
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0]["batch"], 2);  // rows in --batch order, pp then tg
  EXPECT_EQ(rows[2]["batch"], 1);
  const Json& ratios = j["batch_ratios"];
  ASSERT_EQ(ratios.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(ratios[i]["test"], rows[i]["test"]);
    EXPECT_EQ(ratios[i]["batch"], 2);
    EXPECT_EQ(ratios[i]["base_batch"], 1);
    ASSERT_EQ(ratios[i]["rounds"].size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_DOUBLE_EQ(ratios[i]["rounds"][k].get<double>(),
                       rows[i]["tokens_per_s_samples"][k].get<double>() /
                           rows[i + 2]["tokens_per_s_samples"][k].get<double>());
    }
  }
  // Without --interleave: the same rows, no ratios.
  const CliRun plain = RunCli("bench -q --threads 1 --model-path " + kModel +
                              " -p 8 -n 4 -b 2,1 -r 1 --warmup 0 --no-peak --membw-mib 0 --json");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const Json p = Json::parse(plain.out);
  EXPECT_EQ(p["results"].size(), 4u);
  EXPECT_TRUE(p["batch_ratios"].empty());
}

TEST(BenchCli, BadRepeatIsOneLineError) {
  const CliRun r = RunCli("bench --model-path " + kModel + " -r 0 --interleave -b 1,2");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--repeat: expected >= 1"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
}

}  // namespace
}  // namespace dh::e2e
