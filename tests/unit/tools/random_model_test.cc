// Random checkpoints (shapes, value statistics, sharding, loadability) and the offline model
// benchmark on tiny presets.
#include "tools/random_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "base/stats.h"
#include "model/sequence_runner.h"
#include "tools/bench_model.h"

namespace dh::tools {
namespace {

namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("dh_random_model_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

// A random f32 checkpoint of `preset` written to dir and loaded on backend (the bench tests').
Result<std::unique_ptr<Model>> RandomF32Model(const std::string& preset, const fs::path& dir,
                                              Backend& backend) {
  RandomModelOptions o;
  o.preset = preset;
  o.dtype = DType::kF32;
  DH_RETURN_IF_ERROR(WriteRandomModel(o, dir.string()).status());
  return LoadModel(dir.string(), backend, LoadOptions{});
}

int64_t Params(const std::string& preset, int layers = 0) {
  RandomModelOptions o;
  o.preset = preset;
  o.layers = layers;
  auto config = RandomModelConfig(o);
  EXPECT_TRUE(config.ok()) << config.status().message();
  auto specs = RandomModelTensors(*config, DType::kBF16);
  EXPECT_TRUE(specs.ok()) << specs.status().message();
  int64_t n = 0;
  for (const auto& s : *specs) {
    int64_t e = 1;
    for (int64_t d : s.shape) e *= d;
    n += e;
  }
  return n;
}

TEST(RandomModel, PresetsHaveTheRealModelsParameterCounts) {
  // Qwen2-1.5B: 1.54 B parameters (tied embeddings); DeepSeek-V2-Lite: 15.7 B.
  EXPECT_NEAR(Params("qwen2-1.5b") / 1e9, 1.54, 0.01);
  EXPECT_NEAR(Params("v2-lite") / 1e9, 15.7, 0.1);
  EXPECT_LT(Params("v2-lite", 4), Params("v2-lite", 5));
  EXPECT_LT(Params("tiny-llama"), 1'000'000);
  EXPECT_LT(Params("tiny-v3"), 2'000'000);
}

TEST(RandomModel, RejectsUnknownPresetAndDtype) {
  RandomModelOptions o;
  o.preset = "gpt-5";
  EXPECT_FALSE(RandomModelConfig(o).ok());
  o.preset = "tiny-llama";
  o.dtype = DType::kF16;
  EXPECT_FALSE(RandomModelConfig(o).ok());
}

TEST(RandomModel, SetReplacesIntegerConfigFields) {
  RandomModelOptions o;
  o.preset = "tiny-v3";
  o.overrides = {{"hidden_size", 96}, {"n_routed_experts", 8}, {"first_k_dense_replace", 0}};
  auto c = RandomModelConfig(o);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ((*c)["hidden_size"].get<int64_t>(), 96);
  EXPECT_EQ((*c)["n_routed_experts"].get<int64_t>(), 8);
  auto specs = RandomModelTensors(*c, DType::kBF16);
  ASSERT_TRUE(specs.ok()) << specs.status().message();
  bool saw_embed = false, saw_expert8 = false;
  for (const RandomTensorSpec& s : *specs) {
    if (s.name == "model.embed_tokens.weight") {
      saw_embed = true;
      EXPECT_EQ(s.shape[1], 96);
    }
    saw_expert8 = saw_expert8 || s.name.find("experts.8.") != std::string::npos;
  }
  EXPECT_TRUE(saw_embed);
  EXPECT_FALSE(saw_expert8);  // experts 0..7 only
  // Unknown, non-integer and dedicated-option fields, and out-of-range values, are refused.
  for (const auto& bad : std::vector<std::pair<std::string, int64_t>>{
           {"no_such_field", 1}, {"rms_norm_eps", 1}, {"vocab_size", 100},
           {"num_hidden_layers", 2}, {"hidden_size", -1}, {"hidden_size", int64_t{1} << 30}}) {
    RandomModelOptions b;
    b.preset = "tiny-v3";
    b.overrides = {bad};
    auto r = RandomModelConfig(b);
    EXPECT_FALSE(r.ok()) << bad.first << "=" << bad.second;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(bad.first), std::string::npos) << r.status().message();
    }
  }
  // Within range per field, but the tensors would pass 1 TiB: refused before any file is made.
  RandomModelOptions huge;
  huge.preset = "tiny-v3";
  huge.overrides = {{"hidden_size", int64_t{1} << 24}, {"intermediate_size", int64_t{1} << 24}};
  const fs::path dir = TempDir("huge");
  auto w = WriteRandomModel(huge, dir.string());
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("1 TiB"), std::string::npos) << w.status().message();
  EXPECT_FALSE(fs::exists(dir));
}

TEST(RandomModel, CutVocabularyKeepsSpecialIdsInside) {
  // --vocab-size below a preset's BOS/EOS ids (Qwen2's 151643, Llama's 128000, DeepSeek's 100000)
  // moves them to 0 / 1; ids already inside the cut stay as the preset has them.
  for (const char* preset : {"tiny-llama", "qwen2-1.5b", "llama-8b", "v2-lite", "tiny-v3"}) {
    RandomModelOptions full;
    full.preset = preset;
    auto preset_config = RandomModelConfig(full);
    ASSERT_TRUE(preset_config.ok()) << preset_config.status().message();
    for (int64_t vocab : {int64_t{1}, int64_t{2}, int64_t{1024}, int64_t{200000}}) {
      RandomModelOptions o;
      o.preset = preset;
      o.vocab_size = vocab;
      auto c = RandomModelConfig(o);
      ASSERT_TRUE(c.ok()) << c.status().message();
      for (const char* key : {"bos_token_id", "eos_token_id"}) {
        const int64_t id = (*c)[key].get<int64_t>();
        const int64_t was = (*preset_config)[key].get<int64_t>();
        EXPECT_GE(id, 0) << preset << " " << key << " vocab " << vocab;
        EXPECT_LT(id, vocab) << preset << " " << key << " vocab " << vocab;
        if (was < vocab) {
          EXPECT_EQ(id, was) << preset << " " << key << " vocab " << vocab;
        }
      }
      if (vocab == 1024 && (*preset_config)["bos_token_id"].get<int64_t>() >= 1024) {
        EXPECT_EQ((*c)["bos_token_id"].get<int64_t>(), 0) << preset;
        EXPECT_EQ((*c)["eos_token_id"].get<int64_t>(), 1) << preset;
      }
    }
  }
  // The files written carry the same ids (config.json and generation_config.json): tiny-llama
  // (BOS 1, EOS 2) cut to 2 ids keeps BOS 1 and moves EOS to 1.
  const fs::path dir = TempDir("cut_vocab");
  RandomModelOptions o;
  o.preset = "tiny-llama";
  o.layers = 1;
  o.vocab_size = 2;
  o.dtype = DType::kF32;
  auto written = WriteRandomModel(o, dir.string());
  ASSERT_TRUE(written.ok()) << written.status().message();
  for (const char* file : {"config.json", "generation_config.json"}) {
    std::ifstream in(dir / file);
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["bos_token_id"].get<int64_t>(), 1) << file;
    EXPECT_EQ(j["eos_token_id"].get<int64_t>(), 1) << file;
  }
  fs::remove_all(dir);
}

TEST(RandomModel, ValuesAreRoughlyNormalWithTheGivenStddev) {
  const int64_t n = 200000;
  std::vector<float> v(n);
  FillRandomNormal(7, 0.02, n, DType::kF32, v.data());
  double sum = 0, sq = 0, fourth = 0;
  for (float x : v) sum += x;
  const double mean = sum / n;
  for (float x : v) {
    sq += (x - mean) * (x - mean);
    fourth += std::pow(x - mean, 4);
  }
  const double var = sq / n;
  EXPECT_NEAR(mean, 0.0, 0.0005);
  EXPECT_NEAR(std::sqrt(var), 0.02, 0.0005);
  // Kurtosis of Irwin-Hall(4) is 2.7 (normal: 3); a uniform would give 1.8.
  EXPECT_NEAR(fourth / n / (var * var), 2.7, 0.1);
  std::vector<float> w(n);
  FillRandomNormal(8, 0.02, n, DType::kF32, w.data());
  EXPECT_NE(v, w);
}

std::vector<float> LastLogits(const fs::path& dir, const std::vector<int32_t>& ids) {
  CpuBackend backend(BackendOptions{.num_threads = 1});
  auto model = LoadModel(dir.string(), backend, LoadOptions{});
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (!model.ok()) return {};
  auto runner = SequenceRunner::Create(**model, backend, 64);
  EXPECT_TRUE(runner.ok());
  auto logits = (*runner)->Feed(ids, /*all_logits=*/false);
  EXPECT_TRUE(logits.ok()) << logits.status().message();
  return logits.ok() ? *logits : std::vector<float>{};
}

TEST(RandomModel, ShardedAndSingleFileCheckpointsLoadToTheSameModel) {
  const fs::path one = TempDir("one"), many = TempDir("many");
  RandomModelOptions o;
  o.preset = "tiny-llama";
  o.seed = 3;
  auto a = WriteRandomModel(o, one.string());
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->num_files, 1);
  EXPECT_TRUE(fs::exists(one / "model.safetensors"));
  o.shard_bytes = 64 << 10;
  auto b = WriteRandomModel(o, many.string());
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_GT(b->num_files, 3);
  EXPECT_TRUE(fs::exists(many / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(many / "model.safetensors"));
  EXPECT_EQ(a->bytes, b->bytes);

  const std::vector<int32_t> ids = {1, 5, 300, 7};
  const std::vector<float> la = LastLogits(one, ids), lb = LastLogits(many, ids);
  ASSERT_EQ(la.size(), 512u);
  EXPECT_EQ(la, lb);
  float max_abs = 0;
  for (float x : la) {
    ASSERT_TRUE(std::isfinite(x));
    max_abs = std::max(max_abs, std::abs(x));
  }
  EXPECT_GT(max_abs, 0.0f);
  fs::remove_all(one);
  fs::remove_all(many);
}

TEST(ModelBench, RunsPrefillAndDecodeAtSeveralBatchSizes) {
  for (const char* preset : {"tiny-llama", "tiny-v3"}) {
    SCOPED_TRACE(preset);
    const fs::path dir = TempDir(preset);
    CpuBackend backend(BackendOptions{.num_threads = 1});
    auto model = RandomF32Model(preset, dir, backend);
    ASSERT_TRUE(model.ok()) << model.status().message();
    ModelBenchOptions bo;
    bo.prompt = 20;  // more than one KV block per sequence
    bo.gen = 18;
    bo.batches = {1, 3};
    bo.repeat = 2;
    bo.bandwidth_gbs = 10.0;
    bo.bandwidth_median_gbs = 7.5;
    bo.peak_gflops = 50.0;
    bo.bf16_peak_gflops = 100.0;
    auto r = RunModelBench(**model, backend, bo);
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(r->rows.size(), 4u);
    EXPECT_EQ(r->rows[0].test, "pp20");
    EXPECT_EQ(r->rows[1].test, "tg18");
    EXPECT_EQ(r->rows[3].batch, 3);
    for (const auto& row : r->rows) {
      EXPECT_EQ(row.tokens_per_s.samples.size(), 2u);
      EXPECT_GT(row.tokens_per_s.mean, 0.0);
    }
    // pp rows carry GFLOP/s (PromptFlops / time) and a peak fraction; tg rows do not.
    EXPECT_GT(PromptFlops(**model, 20), 20 * 2.0 * 1000);
    EXPECT_NEAR(r->rows[0].gflops,
                PromptFlops(**model, 20) * r->rows[0].tokens_per_s.mean / 20 / 1e9, 1e-9);
    EXPECT_NEAR(r->rows[0].peak_fraction, r->rows[0].gflops / 50.0, 1e-12);
    EXPECT_LT(r->rows[1].gflops, 0.0);
    EXPECT_LT(r->rows[1].peak_fraction, 0.0);
    EXPECT_NEAR(r->rows[0].bf16_peak_fraction, r->rows[0].gflops / 100.0, 1e-12);
    EXPECT_LT(r->rows[0].bandwidth_fraction, 0.0);
    // tg rows: weight bytes per step (one step serves the whole batch) / the bandwidth.
    EXPECT_NEAR(r->rows[3].bandwidth_fraction,
                r->active_weight_bytes_per_token * r->rows[3].tokens_per_s.mean / 3 / 1e9 / 10.0,
                1e-12);
    EXPECT_NEAR(r->rows[1].bandwidth_fraction, r->tg_bandwidth_fraction, 1e-12);
    EXPECT_GT(r->active_weight_bytes_per_token, 0u);
    EXPECT_GT(r->tg_bandwidth_fraction, 0.0);
    const std::string table = FormatModelBench(*r, **model, preset, 1);
    EXPECT_NE(table.find("| tg18 | 3 |"), std::string::npos) << table;
    EXPECT_NE(table.find("10.00 GB/s (best run; median run 7.50 GB/s)"), std::string::npos)
        << table;
    EXPECT_NE(table.find(fmt::format("of the measured bandwidth ({:.1f}% of the median run)",
                                     100.0 * r->tg_weight_gbs / 7.5)),
              std::string::npos)
        << table;
    const nlohmann::json j = ModelBenchJson(*r, **model, preset, 1);
    EXPECT_EQ(j["results"].size(), 4u);
    EXPECT_DOUBLE_EQ(j["read_bandwidth_median_gbs"].get<double>(), 7.5);
    fs::remove_all(dir);
  }
}

// --interleave: the same rows, in the same order, each test's runs taken round by round over
// the batch sizes, and each larger batch's tokens/s over the smallest batch's paired by round.
TEST(ModelBench, InterleavedRunsPairTheBatchSizesByRound) {
  const fs::path dir = TempDir("interleave");
  CpuBackend backend(BackendOptions{.num_threads = 1});
  auto model = RandomF32Model("tiny-llama", dir, backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  ModelBenchOptions bo;
  bo.prompt = 20;
  bo.gen = 6;
  bo.depth = 3;
  bo.batches = {4, 1, 2};  // the base is the smallest size, wherever it stands
  bo.repeat = 3;
  bo.interleave = true;
  int timed_starts = 0;
  bo.before_timed = [&] { ++timed_starts; };
  auto r = RunModelBench(**model, backend, bo);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(timed_starts, 2);  // once per test, before its first timed round
  ASSERT_EQ(r->rows.size(), 6u);
  const int batches[] = {4, 1, 2};
  for (size_t i = 0; i < r->rows.size(); ++i) {
    EXPECT_EQ(r->rows[i].batch, batches[i / 2]);
    EXPECT_EQ(r->rows[i].test, i % 2 == 0 ? "pp20 @ d3" : "tg6 @ d3");
    EXPECT_EQ(r->rows[i].tokens_per_s.samples.size(), 3u);
  }
  ASSERT_EQ(r->ratios.size(), 4u);  // pp and tg, batches 4 and 2 over batch 1
  const ModelBenchRow& pp1 = r->rows[2];
  const ModelBenchRow& tg1 = r->rows[3];
  for (const BatchRatio& q : r->ratios) {
    SCOPED_TRACE(q.test + " batch " + std::to_string(q.batch));
    EXPECT_EQ(q.base, 1);
    const bool pp = q.test[0] == 'p';
    const ModelBenchRow& row = r->rows[(q.batch == 4 ? 0 : 4) + (pp ? 0 : 1)];
    const ModelBenchRow& base = pp ? pp1 : tg1;
    ASSERT_EQ(q.rounds.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_DOUBLE_EQ(q.rounds[k],
                       row.tokens_per_s.samples[k] / base.tokens_per_s.samples[k]);
    }
    EXPECT_DOUBLE_EQ(q.median, Median(q.rounds));
  }
  EXPECT_EQ(r->ratios[0].test, "pp20 @ d3");
  EXPECT_EQ(r->ratios[0].batch, 4);
  EXPECT_EQ(r->ratios[1].batch, 2);
  const std::string text = FormatModelBench(*r, **model, "m", 1);
  EXPECT_NE(text.find(fmt::format("tg6 @ d3: batch 2 / batch 1 = {:.2f}x tokens/s (median of 3 "
                                  "interleaved rounds: {:.2f} ",
                                  r->ratios[3].median, r->ratios[3].rounds[0])),
            std::string::npos)
      << text;
  const nlohmann::json j = ModelBenchJson(*r, **model, "m", 1);
  ASSERT_EQ(j["batch_ratios"].size(), 4u);
  EXPECT_EQ(j["batch_ratios"][2]["base_batch"], 1);
  EXPECT_DOUBLE_EQ(j["batch_ratios"][2]["median"].get<double>(), r->ratios[2].median);
  // Without --interleave: no ratios (the batches' runs are minutes apart on a long test).
  bo.interleave = false;
  bo.repeat = 1;
  auto plain = RunModelBench(**model, backend, bo);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->rows.size(), 6u);
  EXPECT_TRUE(plain->ratios.empty());
  fs::remove_all(dir);
}

TEST(ModelBench, RejectsContextBeyondTheModel) {
  const fs::path dir = TempDir("ctx");
  RandomModelOptions o;
  o.preset = "tiny-llama";
  ASSERT_TRUE(WriteRandomModel(o, dir.string()).ok());
  CpuBackend backend(BackendOptions{.num_threads = 1});
  auto model = LoadModel(dir.string(), backend, LoadOptions{});
  ASSERT_TRUE(model.ok());
  ModelBenchOptions bo;
  bo.prompt = 4096;
  EXPECT_FALSE(RunModelBench(**model, backend, bo).ok());
  fs::remove_all(dir);
}

TEST(BenchStat, MeanAndSampleStddev) {
  BenchStat s = Summarize({2.0, 4.0, 6.0});
  EXPECT_DOUBLE_EQ(s.mean, 4.0);
  EXPECT_DOUBLE_EQ(s.stddev, 2.0);
  EXPECT_DOUBLE_EQ(Summarize({5.0}).stddev, 0.0);
}

}  // namespace
}  // namespace dh::tools
