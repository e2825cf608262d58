// The quantized KV cache (--kv-cache-dtype, docs/kv-cache.md) through the real binary on the
// embedded model (models/shakespeare-v3: MLA, kv_lora_rank 32 + rope 16, 3 layers):
// - perplexity on the validation text (the text and windows of quant_perplexity_test.cc) with
//   an fp8 or int8 cache is within +1 % of a bf16 cache (the bound), and every dtype
//   moves the perplexity away from the exact f32 cache (> 1e-7 relative), so the test cannot
//   pass on an unquantized cache;
// - `info --json` and `info --plan` report the bytes per token and the tokens a fixed
//   --kv-cache-memory holds, from the layout in the model's config.json;
// - `serve` answers over a bf16 and an fp8 cache and /metrics reports the tokens its pool holds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "server_fixture.h"

namespace {

namespace fs = std::filesystem;
using dh::e2e::RunShell;

const fs::path kModel = fs::path(DH_SOURCE_DIR) / "models/shakespeare-v3";

TEST(KvCacheDtype, PerplexityWithinOnePercentOfBf16) {
  const fs::path corpus = fs::path(DH_SOURCE_DIR) / "../shared/data/corpus/tinyshakespeare.txt";
  if (!fs::exists(corpus)) GTEST_SKIP() << "no " << corpus << ": perplexity not checked";
  std::ifstream eval_in(kModel / "eval.json");
  const auto eval = nlohmann::json::parse(eval_in);
  std::ifstream in(corpus, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const fs::path val_file = fs::temp_directory_path() / "dh_kv_dtype_shakespeare_val.txt";
  std::ofstream(val_file, std::ios::binary)
      << ss.str().substr(eval["validation_char_offset"].get<size_t>());
  auto perplexity = [&](const std::string& dtype) {
    int code = 0;
    const std::string out =
        RunShell(std::string(DH_BINARY) +
                     " perplexity -q --json --add-special-tokens --model-path " + kModel.string() +
                     " --file " + val_file.string() + " --context 256 --stride 256" +
                     " --kv-cache-dtype " + dtype,
                 &code);
    EXPECT_EQ(code, 0) << dtype << ": " << out;
    return code == 0 ? nlohmann::json::parse(out)["perplexity"].get<double>() : NAN;
  };
  std::map<std::string, double> ppl;
  for (const char* dtype : {"auto", "bf16", "fp8", "int8"}) ppl[dtype] = perplexity(dtype);
  ASSERT_TRUE(std::isfinite(ppl["auto"]) && std::isfinite(ppl["bf16"]));
  EXPECT_NEAR(ppl["auto"], eval["val_perplexity_bf16"].get<double>(), 0.01 * ppl["auto"]);
  for (const char* dtype : {"bf16", "fp8", "int8"}) {
    const double vs_f32 = (ppl[dtype] - ppl["auto"]) / ppl["auto"];
    const double vs_bf16 = (ppl[dtype] - ppl["bf16"]) / ppl["bf16"];
    std::printf("--kv-cache-dtype %s: perplexity %.4f (%+.4f %% vs f32 %.4f, %+.4f %% vs bf16)\n",
                dtype, ppl[dtype], 100 * vs_f32, ppl["auto"], 100 * vs_bf16);
    EXPECT_GT(std::fabs(vs_f32), 1e-7) << dtype << ": perplexity unchanged, cache not converted";
    EXPECT_LE(vs_bf16, 0.01) << dtype;
  }
}

TEST(KvCacheDtype, InfoAndPlanReportBytesAndTokens) {
  std::ifstream config_in(kModel / "config.json");
  const auto config = nlohmann::json::parse(config_in);
  const int64_t layers = config["num_hidden_layers"].get<int64_t>();
  const int64_t row = config["kv_lora_rank"].get<int64_t>() + config["qk_rope_head_dim"].get<int64_t>();
  // One latent row per token and layer; fp8/int8 add an f32 scale for the latent and one for
  // the rope key.
  const std::map<std::string, int64_t> want = {{"auto", layers * row * 4},
                                               {"bf16", layers * row * 2},
                                               {"fp8", layers * (row + 8)},
                                               {"int8", layers * (row + 8)}};
  for (const auto& [dtype, bytes] : want) {
    SCOPED_TRACE(dtype);
    int code = 0;
    const std::string info = RunShell(std::string(DH_BINARY) + " info -q --json --model-path " +
                                          kModel.string() + " --kv-cache-dtype " + dtype,
                                      &code);
    ASSERT_EQ(code, 0) << info;
    const auto j = nlohmann::json::parse(info);
    EXPECT_EQ(j["kv_bytes_per_token"].get<int64_t>(), bytes);
    EXPECT_EQ(j["kv_cache_dtype"].get<std::string>(), dtype);
    const std::string plan = RunShell(std::string(DH_BINARY) + " info --plan --model-path " +
                                          kModel.string() + " --kv-cache-memory 1MiB" +
                                          " --kv-cache-dtype " + dtype,
                                      &code);
    ASSERT_EQ(code, 0) << plan;
    const int64_t tokens = (1 << 20) / (bytes * 16) * 16;  // whole blocks of 16 tokens
    EXPECT_NE(plan.find("(" + std::to_string(tokens) + " tokens of"), std::string::npos)
        << plan;
  }
}

// The fixture serves with --kv-cache-memory 128MiB; the pool holds whole blocks of 16 tokens.
TEST(KvCacheDtype, ServeReportsCapacityInTokens) {
  std::map<std::string, double> capacity;
  for (const char* dtype : {"bf16", "fp8"}) {
    SCOPED_TRACE(dtype);
    dh::e2e::ServerProcess server;
    ASSERT_TRUE(server.Start({"--kv-cache-dtype", dtype})) << server.log();
    const nlohmann::json body = {
        {"model", dh::e2e::ServedModel(server)},
        {"messages", {{{"role", "user"}, {"content", "ROMEO:"}}}},
        {"max_tokens", 8},
        {"temperature", 0}};
    const auto r = server.PostJson("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_FALSE(r.json()["choices"][0]["message"]["content"].get<std::string>().empty());
    const auto m = server.Metrics();
    const double bytes = dh::e2e::MetricValue(m, "kv_cache_bytes_per_token");
    capacity[dtype] = dh::e2e::MetricValue(m, "kv_cache_capacity_tokens");
    ASSERT_GT(bytes, 0);
    EXPECT_EQ(capacity[dtype], std::floor(128.0 * (1 << 20) / (bytes * 16)) * 16);
    EXPECT_EQ(capacity[dtype], 16 * dh::e2e::MetricValue(m, "kv_cache_blocks_total"));
    EXPECT_EQ(server.Stop(), 0) << server.log();
  }
  std::printf("128 MiB holds %.0f tokens in bf16, %.0f in fp8 (%.2fx)\n", capacity["bf16"],
              capacity["fp8"], capacity["fp8"] / capacity["bf16"]);
  EXPECT_GT(capacity["fp8"], 1.7 * capacity["bf16"]);
}

}  // namespace
