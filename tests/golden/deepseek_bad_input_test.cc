// DeepSeek bad input (issue 4): a golden checkpoint copied and broken one way at a time must be
// refused with one error naming the tensor or config field, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "backend/reference/reference_backend.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/model.h"

namespace dh {
namespace {

namespace fs = std::filesystem;

const fs::path kFixture = fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures/ds_v3";

// Copies the fixture to a temp dir, applying `edit_config` to config.json and `edit_tensors` to
// the tensor list, and returns the load error message ("" if it loaded).
std::string LoadBroken(const std::string& name, const std::function<void(nlohmann::json&)>& edit_config,
                       const std::function<void(std::vector<std::pair<std::string, Tensor>>&,
                                                std::vector<std::vector<uint8_t>>&)>& edit_tensors) {
  const fs::path dir = fs::temp_directory_path() / ("dh_ds_bad_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(kFixture / "config.json"));
  if (edit_config) edit_config(config);
  std::ofstream(dir / "config.json") << config.dump();
  auto file = SafetensorsFile::Open((kFixture / "model.safetensors").string());
  EXPECT_TRUE(file.ok());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& t : (*file)->tensors()) tensors.emplace_back(t.name, t.View());
  std::vector<std::vector<uint8_t>> storage;
  if (edit_tensors) edit_tensors(tensors, storage);
  EXPECT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), tensors).ok());
  ReferenceBackend backend{BackendOptions{}};
  auto model = LoadModel(dir.string(), backend, LoadOptions{});
  fs::remove_all(dir);
  return model.ok() ? "" : model.status().message();
}

void Drop(std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& name) {
  std::erase_if(tensors, [&](const auto& t) { return t.first == name; });
}

TEST(DeepseekBadInput, FixtureLoadsUnchanged) { EXPECT_EQ(LoadBroken("ok", nullptr, nullptr), ""); }

TEST(DeepseekBadInput, MissingExpertTensor) {
  const std::string name = "model.layers.1.mlp.experts.3.up_proj.weight";
  std::string err = LoadBroken("missing_expert", nullptr, [&](auto& t, auto&) { Drop(t, name); });
  EXPECT_NE(err.find(name), std::string::npos) << err;
}

TEST(DeepseekBadInput, MissingRouterBias) {
  const std::string name = "model.layers.1.mlp.gate.e_score_correction_bias";
  std::string err = LoadBroken("missing_bias", nullptr, [&](auto& t, auto&) { Drop(t, name); });
  EXPECT_NE(err.find(name), std::string::npos) << err;
}

TEST(DeepseekBadInput, UnknownTopkMethod) {
  std::string err = LoadBroken("topk", [](auto& c) { c["topk_method"] = "best_guess"; }, nullptr);
  EXPECT_NE(err.find("topk_method"), std::string::npos) << err;
  EXPECT_NE(err.find("best_guess"), std::string::npos) << err;
}

TEST(DeepseekBadInput, UnknownScoringFunc) {
  std::string err = LoadBroken("scoring", [](auto& c) { c["scoring_func"] = "relu"; }, nullptr);
  EXPECT_NE(err.find("scoring_func"), std::string::npos) << err;
}

TEST(DeepseekBadInput, InconsistentHeadDims) {
  // kv_b_proj no longer matches heads * (qk_nope_head_dim + v_head_dim).
  std::string err = LoadBroken("head_dims", [](auto& c) { c["v_head_dim"] = 12; }, nullptr);
  EXPECT_NE(err.find("kv_b_proj"), std::string::npos) << err;
  err = LoadBroken("rope_odd", [](auto& c) { c["qk_rope_head_dim"] = 7; }, nullptr);
  EXPECT_NE(err.find("qk_rope_head_dim"), std::string::npos) << err;
}

TEST(DeepseekBadInput, GroupsThatDoNotDivideExperts) {
  std::string err = LoadBroken("groups", [](auto& c) { c["n_group"] = 3; }, nullptr);
  EXPECT_NE(err.find("n_group"), std::string::npos) << err;
}

TEST(DeepseekBadInput, ScaleTensorOfTheWrongShape) {
  const fs::path fp8 = fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures/ds_v3_fp8";
  const fs::path dir = fs::temp_directory_path() / "dh_ds_bad_scale";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fp8 / "config.json", dir / "config.json");
  auto file = SafetensorsFile::Open((fp8 / "model.safetensors").string());
  ASSERT_TRUE(file.ok());
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<float> bigger;
  std::string broken;
  for (const auto& t : (*file)->tensors()) {
    Tensor v = t.View();
    if (broken.empty() && t.name.ends_with("weight_scale_inv")) {
      broken = t.name;
      bigger.assign(static_cast<size_t>(v.numel() + v.dim(1)), 1.0f);
      v = Tensor(bigger.data(), DType::kF32, {v.dim(0) + 1, v.dim(1)});
    }
    tensors.emplace_back(t.name, v);
  }
  ASSERT_FALSE(broken.empty());
  ASSERT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), tensors).ok());
  ReferenceBackend backend{BackendOptions{}};
  auto model = LoadModel(dir.string(), backend, LoadOptions{});
  fs::remove_all(dir);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find(broken), std::string::npos) << model.status().message();
}

TEST(DeepseekBadInput, UnknownArchitectureListsSupportedOnes) {
  std::string err = LoadBroken("arch", [](auto& c) { c["architectures"] = {"GPT2LMHeadModel"}; },
                               nullptr);
  EXPECT_NE(err.find("GPT2LMHeadModel"), std::string::npos) << err;
  EXPECT_NE(err.find("DeepseekV3ForCausalLM"), std::string::npos) << err;
  EXPECT_NE(err.find("LlamaForCausalLM"), std::string::npos) << err;
}

}  // namespace
}  // namespace dh
