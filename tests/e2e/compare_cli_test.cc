// `deepharness compare` end to end on the embedded model: cpu vs reference backend (passes),
// bf16 vs int4 (differences reported, not hidden), a random model of the same vocabulary
// (fails, and the report shows where), a URL target against `serve` on a free port, and bad
// input (exit 2, one line naming the file, field or value).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

namespace fs = std::filesystem;


std::string Temp(const std::string& name) {
  return (fs::temp_directory_path() / ("dh_cmp_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string Slurp(const std::string& path) {
  std::stringstream s;
  s << std::ifstream(path).rdbuf();
  return s.str();
}

// Three completion prompts and one chat prompt.
const std::string& PromptsFile() {
  static const std::string path = [] {
    const std::string p = Temp("prompts.jsonl");
    std::ofstream(p) << "{\"id\": \"romeo\", \"prompt\": \"ROMEO:\"}\n"
                        "{\"id\": \"juliet\", \"prompt\": \"JULIET:\\nO \"}\n"
                        "{\"prompt\": \"First Citizen:\\nWe are\"}\n"
                        "{\"id\": \"chat\", \"messages\": [{\"role\": \"user\", \"content\": "
                        "\"Speak of the king\"}]}\n";
    return p;
  }();
  return path;
}

const std::string kCommon = " --max-tokens 12 --samples 1 -q --prompts ";

TEST(CompareCliTest, CpuVsReferenceBackendPasses) {
  const std::string json = Temp("cpu_ref.json"), md = Temp("cpu_ref.md");
  const std::string m = TestModelDir();
  // The reference multiplies bf16 weights by exact x; so does the CPU side here (DH_BF16_DOT=off:
  // no bf16 rounding of x on a CPU with AVX512-BF16), so the two agree to float rounding.
  CliRun r = RunCli("compare --a model=" + m + " --b model=" + m + ",device=reference" + kCommon +
                    PromptsFile() + " --json-file " + json + " --markdown " + md,
                    "DH_BF16_DOT=off");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("result: PASS"), std::string::npos) << r.out;
  const Json j = Json::parse(Slurp(json), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_TRUE(j["pass"].get<bool>());
  EXPECT_EQ(j["b"]["device"], "reference");
  const Json& g = j["overall"]["greedy"];
  EXPECT_EQ(g["runs"], 4);
  EXPECT_EQ(j["overall"]["sampled"]["runs"], 4);
  EXPECT_DOUBLE_EQ(g["consistent_rate"].get<double>(), 1.0);
  // Same weights on two backends: the logprobs of the shared tokens agree to float rounding.
  ASSERT_TRUE(g["mean_logprob_diff"].is_number());
  EXPECT_LT(g["mean_logprob_diff"].get<double>(), 1e-3);
  EXPECT_GT(g["top1_agreement"].get<double>(), 0.99);
  for (const Json& p : j["prompts"]) {
    ASSERT_EQ(p["runs"].size(), 2u);
    EXPECT_TRUE(p["runs"][0]["logprobs_a"].is_array());
    EXPECT_FALSE(p["runs"][0]["text_a"].get<std::string>().empty());
  }
  const std::string report = Slurp(md);
  EXPECT_NE(report.find("**Result: PASS**"), std::string::npos) << report;
  EXPECT_NE(report.find("| romeo |"), std::string::npos) << report;
  fs::remove(json);
  fs::remove(md);
}

TEST(CompareCliTest, Bf16VsInt4DifferencesAreReported) {
  const std::string json = Temp("int4.json");
  const std::string m = TestModelDir();
  // A zero tolerance on the logprob difference: int4 weights move every logprob a little, so
  // the check must fail and show the measured difference.
  CliRun r = RunCli("compare --a model=" + m + " --b model=" + m + ",quant=int4" + kCommon +
                 PromptsFile() + " --json-file " + json + " --max-mean-logprob-diff 0");
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("check max-mean-logprob-diff"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("result: FAIL"), std::string::npos) << r.out;
  const Json j = Json::parse(Slurp(json), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["b"]["quant"], "int4");
  const Json& g = j["overall"]["greedy"];
  ASSERT_TRUE(g["mean_logprob_diff"].is_number()) << g.dump();
  EXPECT_GT(g["mean_logprob_diff"].get<double>(), 0.0);
  EXPECT_GE(g["max_logprob_diff"].get<double>(), g["mean_logprob_diff"].get<double>());
  bool found = false;
  for (const Json& c : j["checks"]) {
    if (c["name"] != "max-mean-logprob-diff") continue;
    found = true;
    EXPECT_FALSE(c["pass"].get<bool>());
    EXPECT_EQ(c["value"], g["mean_logprob_diff"]);
  }
  EXPECT_TRUE(found) << j["checks"].dump();
  fs::remove(json);
}

TEST(CompareCliTest, DifferentModelFailsAndShowsWhere) {
  // A random DeepSeek-V3-shaped model with the embedded model's vocabulary and tokenizer.
  const std::string other = Temp("random_model");
  CliRun made = RunCli("make-model --preset tiny-v3 --vocab-size 1024 --seed 7 -q --output " + other);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(fs::path(TestModelDir()) / f, fs::path(other) / f,
                  fs::copy_options::overwrite_existing);
  const std::string json = Temp("random.json"), md = Temp("random.md");
  CliRun r = RunCli("compare --a model=" + TestModelDir() + " --b model=" + other + kCommon +
                 PromptsFile() + " --json-file " + json + " --markdown " + md);
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("check min-consistent"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("greedy divergences:"), std::string::npos) << r.out;
  const Json j = Json::parse(Slurp(json), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_FALSE(j["pass"].get<bool>());
  EXPECT_LT(j["overall"]["greedy"]["consistent_rate"].get<double>(), 1.0);
  const std::string report = Slurp(md);
  EXPECT_NE(report.find("**Result: FAIL**"), std::string::npos) << report;
  EXPECT_NE(report.find("## Where the greedy answers diverge"), std::string::npos) << report;
  // Each diverging prompt names its first diverging token and both sides' tokens there.
  for (const Json& p : j["prompts"]) {
    const Json& g = p["runs"][0];
    if (g["exact"].get<bool>()) continue;
    ASSERT_TRUE(g["first_divergence"].is_number()) << g.dump();
    const std::string where = "token " + std::to_string(g["first_divergence"].get<int>()) + ":";
    EXPECT_NE(report.find("**" + p["id"].get<std::string>() + "** — " + where), std::string::npos)
        << report;
  }
  fs::remove_all(other);
  fs::remove(json);
  fs::remove(md);
}

TEST(CompareCliTest, UrlTargetAgainstServe) {
  ServerProcess server;
  ASSERT_TRUE(server.Start()) << server.log();
  const std::string json = Temp("url.json");
  CliRun r = RunCli("compare --a " + server.base_url() + " --b model=" + TestModelDir() + kCommon +
                 PromptsFile() + " --json-file " + json);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const Json j = Json::parse(Slurp(json), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["a"]["kind"], "url");
  EXPECT_EQ(j["a"]["served_model"], ServedModel(server));
  // The same model and kernels, one request at a time: the same greedy answers.
  EXPECT_EQ(j["overall"]["greedy"]["exact"], 4);
  // The chat prompt went through /v1/chat/completions with logprobs on both sides.
  EXPECT_TRUE(j["prompts"][3]["messages"].is_array());
  EXPECT_TRUE(j["prompts"][3]["runs"][0]["logprobs_a"].is_array());

  // A served name the server does not have: could not run.
  CliRun bad = RunCli("compare --a " + server.base_url() + ",name=nope --b " + server.base_url() +
                   kCommon + PromptsFile());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err, "error: --a " + server.base_url() +
                         ": name=nope: the server does not serve this model\n");
  server.Stop();
  fs::remove(json);
}

// tp=2: a child `serve --tp-size 2` (its own mpirun job) against the in-process tp=1 model. The
// all-reduce sums in another order, so logprobs agree to rounding and greedy text is the same.
TEST(CompareCliTest, LocalTensorParallelTargetMatchesOneProcess) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  const std::string json = Temp("tp2.json");
  const std::string m = TestModelDir();
  CliRun r = RunCli("compare --a model=" + m + ",threads=1 --b model=" + m + ",tp=2,threads=1" +
                    kCommon + PromptsFile() + " --json-file " + json);
  if (r.err.find("this build has no MPI") != std::string::npos) GTEST_SKIP() << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const Json j = Json::parse(Slurp(json), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_TRUE(j["pass"].get<bool>());
  const Json& g = j["overall"]["greedy"];
  EXPECT_DOUBLE_EQ(g["exact_match_rate"].get<double>(), 1.0);
  ASSERT_TRUE(g["mean_logprob_diff"].is_number());
  EXPECT_LT(g["mean_logprob_diff"].get<double>(), 1e-4);
  fs::remove(json);
}

TEST(CompareCliTest, BadInputIsOneLineAndExit2) {
  const std::string m = TestModelDir();
  const std::string prompts = " --prompts " + PromptsFile();
  struct Case {
    std::string args, err;
  };
  const std::string bad_file = Temp("bad.jsonl");
  const RefusedPort refused;
  ASSERT_NE(refused.port(), 0);
  std::ofstream(bad_file) << "{\"prompt\": \"a\"}\n{\"prompt\": \"\"}\n";
  const std::vector<Case> cases = {
      {"compare --a model=" + m + " --b model=" + m + " --prompts /nonexistent.jsonl",
       "error: /nonexistent.jsonl: cannot read the prompts file\n"},
      {"compare --a model=" + m + " --b model=" + m + " --prompts " + bad_file,
       "error: " + bad_file + ":2: \"prompt\": expected a non-empty string\n"},
      {"compare --a model=" + m + ",tp=0 --b model=" + m + prompts,
       "error: --a: tp=0: expected 1 to 64 ranks\n"},
      {"compare --a ftp://x --b model=" + m + prompts,
       "error: --a: 'ftp://x': expected an http:// URL or a spec with model=DIR\n"},
      {"compare --a model=" + m + " --b model=" + m + ",quant=int3" + prompts,
       "QUANT"},  // the loader's own message, prefixed with the target
      {"compare --a model=/nonexistent --b model=" + m + prompts, "/nonexistent"},
      {"compare --a model=" + m + " --b model=" + m + prompts + " --min-exact-match 1.5",
       "error: --min-exact-match: expected a rate in [0, 1], got 1.5\n"},
      {"compare --a model=" + m + " --b model=" + m + prompts + " --max-tokens 0",
       "error: --max-tokens: expected 1 to 1048576, got 0\n"},
      {"compare --a http://127.0.0.1:" + std::to_string(refused.port()) + " --b model=" + m +
           prompts,
       "is the server running?"},
  };
  for (const Case& c : cases) {
    CliRun r = RunCli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    const size_t newlines = std::count(r.err.begin(), r.err.end(), '\n');
    EXPECT_EQ(newlines, 1u) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    if (c.err == "QUANT") {
      EXPECT_NE(r.err.find("--b model="), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("int3"), std::string::npos) << r.err;
    } else if (c.err.back() == '\n') {
      EXPECT_EQ(r.err, c.err);
    } else {
      EXPECT_NE(r.err.find(c.err), std::string::npos) << r.err;
    }
  }
  fs::remove(bad_file);
}

}  // namespace
}  // namespace dh::e2e
