// `deepharness eval` end to end: the four tasks from the tiny datasets of tests/unit/tools/data
// against the real server (--url), then in-process (--model-path), then --compare of the two
// reports; plus bad input (exit 2, one line naming the file).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

namespace fs = std::filesystem;

// Runs `deepharness eval <args>` (RunCli).
CliRun RunEval(const std::string& args) { return RunCli("eval " + args); }

Json ReadJson(const std::string& path) { return Json::parse(std::ifstream(path), nullptr, false); }

const std::string kData = std::string(DH_SOURCE_DIR) + "/tests/unit/tools/data/eval";
// One item per subject, one shot, short generations: a few seconds on the tiny model.
const std::string kArgs =
    "--tasks mmlu,cmmlu,ceval,gsm8k --data " + kData +
    " --limit 1 --num-fewshot 1 --max-gen-toks 16 --concurrency 2 --no-progress";

TEST(EvalE2E, ServerThenInProcessThenCompare) {
  ServerProcess server;
  ASSERT_TRUE(server.Start()) << server.log();
  const fs::path dir = fs::temp_directory_path();
  const std::string a = (dir / ("dh_eval_a_" + std::to_string(::getpid()) + ".json")).string();
  const std::string b = (dir / ("dh_eval_b_" + std::to_string(::getpid()) + ".json")).string();

  CliRun via_url = RunEval(kArgs + " --url " + server.base_url() + " --output " + a);
  ASSERT_EQ(via_url.exit_code, 0) << via_url.err;
  EXPECT_NE(via_url.out.find("mmlu     acc "), std::string::npos) << via_url.out;
  EXPECT_NE(via_url.out.find("exact_match strict-match"), std::string::npos) << via_url.out;
  const Json ra = ReadJson(a);
  ASSERT_FALSE(ra.is_discarded());
  EXPECT_TRUE(ra["complete"].get<bool>());
  // 2 MMLU subjects + 1 CMMLU + 1 C-Eval, one item each, and 1 GSM8K problem.
  EXPECT_EQ(ra["items"].size(), 5u);
  EXPECT_EQ(ra["results"]["mmlu"]["n"], 2);
  EXPECT_EQ(ra["results"]["gsm8k"]["n"], 1);
  EXPECT_EQ(ra["config"]["model"], ServedModel(server));
  for (const Json& item : ra["items"]) {
    if (item["task"] == "gsm8k") continue;
    ASSERT_EQ(item["logprobs"].size(), 4u);
    for (const Json& lp : item["logprobs"]) {
      EXPECT_LT(lp.get<double>(), 0.0);
      EXPECT_GT(lp.get<double>(), -100.0);
    }
    // The tiny model's 256-token context: every 1-shot prompt is left-truncated.
    EXPECT_EQ(ra["config"]["max_length"], 255);
  }
  server.Stop();

  CliRun in_process = RunEval(kArgs + " --model-path " + TestModelDir() + " --output " + b);
  ASSERT_EQ(in_process.exit_code, 0) << in_process.err;
  const Json rb = ReadJson(b);
  ASSERT_FALSE(rb.is_discarded());
  ASSERT_EQ(rb["items"].size(), 5u);
  EXPECT_TRUE(rb["config"]["extra"]["in_process"].get<bool>());
  // Same model, same client, greedy: the same answers.
  for (size_t i = 0; i < 5; ++i) {
    const Json& x = ra["items"][i];
    const Json& y = rb["items"][i];
    ASSERT_EQ(x["key"], y["key"]);
    if (x["task"] == "gsm8k") {
      EXPECT_EQ(x["response"], y["response"]);
    } else {
      EXPECT_EQ(x["pred"], y["pred"]);
      for (size_t k = 0; k < 4; ++k)
        EXPECT_NEAR(x["logprobs"][k].get<double>(), y["logprobs"][k].get<double>(), 1e-3);
    }
  }

  CliRun compare = RunEval("--compare " + a + " " + b);
  ASSERT_EQ(compare.exit_code, 0) << compare.err;
  EXPECT_NE(compare.out.find("p (McN.)"), std::string::npos) << compare.out;
  EXPECT_NE(compare.out.find("exact_match,flexible-extract"), std::string::npos) << compare.out;
  fs::remove(a);
  fs::remove(b);
}

TEST(EvalE2E, BadInputIsOneLineAndExit2) {
  CliRun missing =
      RunEval("--tasks gsm8k --data " + kData + "/mmlu --model-path " + TestModelDir());
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.err, "error: " + kData +
                             "/mmlu/test.jsonl: cannot open file (expected the gsm8k layout: "
                             "test.jsonl)\n");
  CliRun task = RunEval("--tasks mmlu,hellaswag --data " + kData);
  EXPECT_EQ(task.exit_code, 2);
  EXPECT_EQ(task.err, "error: --tasks: 'hellaswag': expected mmlu, cmmlu, ceval or gsm8k\n");
  const std::string bad =
      (fs::temp_directory_path() / ("dh_eval_bad_" + std::to_string(::getpid()) + ".json"))
          .string();
  std::ofstream(bad) << "{not json";
  CliRun cmp = RunEval("--compare " + bad + " " + bad);
  EXPECT_EQ(cmp.exit_code, 2);
  EXPECT_EQ(cmp.err, "error: " + bad +
                         ": expected a deepharness eval report (JSON with config and items)\n");
  fs::remove(bad);
}

}  // namespace
}  // namespace dh::e2e
