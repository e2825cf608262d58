// The embedded model (models/shakespeare-v3) through the real binary (issue 5):
//  - perplexity parity: the engine's validation loss equals the trainer's recorded value
//    (eval.json, written by pytorch/train_tiny from the PyTorch reference) within 1 % relative;
//  - greedy ids match the trainer's greedy samples up to the first step whose top-2 logit gap
//    is below 1e-3 (bf16 weights, f32 compute: our logits differ from PyTorch's by ~1e-5);
//  - greedy output equals the committed engine output (tests/e2e/data/shakespeare_greedy.json);
//  - seeded sampling at temperature 0.8 is reproducible, and the default model is found next to
//    the binary when --model-path is not given.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "server_fixture.h"

namespace {

namespace fs = std::filesystem;
using dh::e2e::RunShell;

const fs::path kModel = fs::path(DH_SOURCE_DIR) / "models/shakespeare-v3";

nlohmann::json EvalJson() {
  std::ifstream in(kModel / "eval.json");
  return nlohmann::json::parse(in);
}

std::string Join(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

TEST(EmbeddedModel, ValidationLossMatchesTrainer) {
  const fs::path corpus = fs::path(DH_SOURCE_DIR) / "../shared/data/corpus/tinyshakespeare.txt";
  if (!fs::exists(corpus)) GTEST_SKIP() << "no " << corpus << ": perplexity parity not checked";
  const auto eval = EvalJson();
  const size_t offset = eval["validation_char_offset"].get<size_t>();
  std::ifstream in(corpus, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string val = ss.str().substr(offset);
  const fs::path val_file = fs::temp_directory_path() / "dh_shakespeare_val.txt";
  std::ofstream(val_file, std::ios::binary) << val;
  int code = 0;
  const std::string out =
      RunShell(std::string(DH_BINARY) + " perplexity -q --json --add-special-tokens --model-path " +
              kModel.string() + " --file " + val_file.string() + " --context 256 --stride 256",
          &code);
  ASSERT_EQ(code, 0) << out;
  const auto j = nlohmann::json::parse(out);
  const double expected = eval["val_loss_bf16_nats_per_token"].get<double>();
  EXPECT_EQ(j["tokens"].get<int64_t>(), eval["num_tokens_with_bos"].get<int64_t>());
  EXPECT_EQ(j["scored_tokens"].get<int64_t>(), eval["predicted_tokens"].get<int64_t>());
  EXPECT_NEAR(j["mean_nll"].get<double>(), expected, 0.01 * expected);
}

TEST(EmbeddedModel, GreedyMatchesTrainerUntilACloseCall) {
  // The json kept in a variable: a range-for over EvalJson()["greedy_samples"] would iterate a
  // member of a destroyed temporary (C++20 extends only the outermost temporary's lifetime).
  const auto eval = EvalJson();
  ASSERT_GE(eval["greedy_samples"].size(), 1u);
  for (const auto& s : eval["greedy_samples"]) {
    const auto prompt = s["prompt_ids"].get<std::vector<int>>();
    const auto want = s["new_ids"].get<std::vector<int>>();
    const auto margins = s["top2_logit_margins"].get<std::vector<double>>();
    int code = 0;
    const std::string out = RunShell(std::string(DH_BINARY) + " generate -q --json --ignore-eos " +
                                    "--temperature 0 --max-tokens 64 --model-path " +
                                    kModel.string() + " --token-ids " + Join(prompt),
                                &code);
    ASSERT_EQ(code, 0) << out;
    const auto got = nlohmann::json::parse(out)["ids"].get<std::vector<int>>();
    size_t checked = 0;
    for (size_t i = 0; i < want.size() && margins[i] >= 1e-3; ++i, ++checked) {
      ASSERT_EQ(got.at(i), want[i]) << "step " << i << " of prompt " << s["prompt"];
    }
    EXPECT_GE(checked, 4u) << s["prompt"];
  }
}

TEST(EmbeddedModel, GreedyTextIsTheCommittedSample) {
  const fs::path expected_file = fs::path(DH_SOURCE_DIR) / "tests/e2e/data/shakespeare_greedy.json";
  std::ifstream in(expected_file);
  const auto expected = nlohmann::json::parse(in);
  int code = 0;
  const std::string out =
      RunShell(std::string(DH_BINARY) + " run -q --raw --temperature 0 --max-tokens 48 --prompt '" +
              expected["prompt"].get<std::string>() + "' --model-path " + kModel.string(),
          &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(out, expected["output"].get<std::string>());
}

TEST(EmbeddedModel, SeededSamplingIsReproducible) {
  const std::string cmd = std::string(DH_BINARY) +
                          " run -q --raw --temperature 0.8 --max-tokens 40 --prompt 'ROMEO:' ";
  int code = 0;
  const std::string a = RunShell(cmd + "--seed 7", &code);
  ASSERT_EQ(code, 0);
  EXPECT_EQ(RunShell(cmd + "--seed 7"), a);
  EXPECT_NE(RunShell(cmd + "--seed 8"), a);
  EXPECT_GT(a.size(), 20u);
}

}  // namespace
