// AWQ / GPTQ checkpoints through LoadModel: the golden fixtures copied and broken one way at a time
// are refused with one error line naming the file, tensor or config field and the value; a clean
// fixture loads with its projections as int4 (ModelInfo counts them under "int4", nothing is
// reported unused), and --dtype / --quant leave them as stored.
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

using Tensors = std::vector<std::pair<std::string, Tensor>>;
using Storage = std::vector<std::vector<uint8_t>>;

fs::path Fixture(const std::string& name) {
  return fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures" / name;
}

// Copies fixture `name` to a temp dir with the edits applied; returns the load error ("" if ok).
std::string LoadEdited(const std::string& fixture, const std::string& tag,
                       const std::function<void(nlohmann::json&)>& edit_config,
                       const std::function<void(Tensors&, Storage&)>& edit_tensors,
                       const LoadOptions& options = {}, ModelInfo* info = nullptr) {
  const fs::path dir = fs::temp_directory_path() / ("dh_packed_bad_" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(Fixture(fixture) / "config.json"));
  if (edit_config) edit_config(config);
  std::ofstream(dir / "config.json") << config.dump();
  auto file = SafetensorsFile::Open((Fixture(fixture) / "model.safetensors").string());
  EXPECT_TRUE(file.ok());
  Tensors tensors;
  for (const auto& t : (*file)->tensors()) tensors.emplace_back(t.name, t.View());
  Storage storage;
  if (edit_tensors) edit_tensors(tensors, storage);
  EXPECT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), tensors).ok());
  ReferenceBackend backend{BackendOptions{}};
  auto model = LoadModel(dir.string(), backend, options);
  std::string err = model.ok() ? "" : model.status().message();
  if (model.ok() && info != nullptr) *info = (*model)->info();
  fs::remove_all(dir);
  return err;
}

Tensor* Get(Tensors& t, const std::string& name) {
  for (auto& [n, v] : t) {
    if (n == name) return &v;
  }
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

// Replaces tensor `name` with a copy of `shape` and `dtype` (bytes zero-filled or truncated).
void Replace(Tensors& t, Storage& s, const std::string& name, DType dtype,
             std::initializer_list<int64_t> shape) {
  Tensor* old = Get(t, name);
  Tensor n(nullptr, dtype, shape);
  s.emplace_back(n.nbytes(), 0);
  std::memcpy(s.back().data(), old->data, std::min(n.nbytes(), old->nbytes()));
  n.data = s.back().data();
  *old = n;
}

const std::string kQ = "model.layers.0.self_attn.q_proj";
const std::string kDown = "model.layers.1.mlp.down_proj";

TEST(PackedInt4Load, FixturesLoadAsInt4) {
  for (const char* f : {"llama_awq", "qwen2_gptq", "qwen2_gptq_actorder", "ds_v2_lite_awq"}) {
    SCOPED_TRACE(f);
    ModelInfo info;
    EXPECT_EQ(LoadEdited(f, "ok", nullptr, nullptr, LoadOptions{}, &info), "");
    EXPECT_GT(info.bytes_by_dtype["int4"], 0);
    EXPECT_EQ(info.bytes_by_dtype.count("i32"), 0u) << "packed tensors counted as I32";
  }
  // --dtype and --quant do not apply to the prequantized projections.
  LoadOptions o;
  o.plan = *ParseWeightPlan({.dtype = "bfloat16", .quant = "int8"});
  ModelInfo info;
  EXPECT_EQ(LoadEdited("llama_awq", "opts", nullptr, nullptr, o, &info), "");
  EXPECT_GT(info.bytes_by_dtype["int4"], 0);
}

TEST(PackedInt4Load, ConfigErrors) {
  std::string err = LoadEdited("llama_awq", "bits8",
                               [](auto& c) { c["quantization_config"]["bits"] = 8; }, nullptr);
  EXPECT_NE(err.find("field 'quantization_config.bits': 8-bit awq"), std::string::npos) << err;
  err = LoadEdited("qwen2_gptq", "format",
                   [](auto& c) { c["quantization_config"]["checkpoint_format"] = "marlin"; },
                   nullptr);
  EXPECT_NE(err.find("checkpoint_format': unsupported 'marlin'"), std::string::npos) << err;
  err = LoadEdited("llama_awq", "gemv",
                   [](auto& c) { c["quantization_config"]["version"] = "gemv"; }, nullptr);
  EXPECT_NE(err.find("'quantization_config.version': unsupported AWQ packing 'gemv'"),
            std::string::npos)
      << err;
  // Packed tensors without an AWQ / GPTQ quantization_config.
  err = LoadEdited("llama_awq", "noconfig", [](auto& c) { c.erase("quantization_config"); },
                   nullptr);
  EXPECT_NE(err.find(kQ + ".qweight' is a packed int4 weight but config.json"), std::string::npos)
      << err;
  // Group size that does not divide in_features.
  err = LoadEdited("llama_awq", "group",
                   [](auto& c) { c["quantization_config"]["group_size"] = 96; }, nullptr);
  EXPECT_NE(err.find("not divisible by quantization_config.group_size 96"), std::string::npos)
      << err;
}

TEST(PackedInt4Load, TensorErrors) {
  // Wrong qweight shape (AWQ [in, out/8] = [128, 16]).
  std::string err = LoadEdited("llama_awq", "qweight", nullptr, [](Tensors& t, Storage& s) {
    Replace(t, s, kQ + ".qweight", DType::kI32, {16, 128});
  });
  EXPECT_NE(err.find("model.safetensors: tensor '" + kQ + ".qweight' has shape [16, 128], "
                     "expected [128, 16]"),
            std::string::npos)
      << err;
  err = LoadEdited("llama_awq", "qzeros_dtype", nullptr, [](Tensors& t, Storage& s) {
    Replace(t, s, kQ + ".qzeros", DType::kF16, {1, 16});
  });
  EXPECT_NE(err.find("tensor '" + kQ + ".qzeros' has dtype F16, expected I32"), std::string::npos)
      << err;
  err = LoadEdited("llama_awq", "scales_shape", nullptr, [](Tensors& t, Storage& s) {
    Replace(t, s, kDown + ".scales", DType::kF16, {1, 128});  // down_proj has 2 groups
  });
  EXPECT_NE(err.find("tensor '" + kDown + ".scales' has shape [1, 128], expected [2, 128]"),
            std::string::npos)
      << err;
  err = LoadEdited("llama_awq", "scales_dtype", nullptr, [](Tensors& t, Storage& s) {
    Replace(t, s, kQ + ".scales", DType::kF32, {1, 128});
  });
  EXPECT_NE(err.find("tensor '" + kQ + ".scales' has dtype F32, expected F16 or BF16"),
            std::string::npos)
      << err;
  err = LoadEdited("llama_awq", "missing_qzeros", nullptr, [](Tensors& t, Storage&) {
    std::erase_if(t, [](const auto& x) { return x.first == kQ + ".qzeros"; });
  });
  EXPECT_NE(err.find("missing tensor '" + kQ + ".qzeros'"), std::string::npos) << err;
  // g_idx out of range, and a g_idx that puts 129 columns in group 0.
  const std::string up = "model.layers.0.mlp.up_proj";  // hidden 256: 2 groups
  err = LoadEdited("qwen2_gptq_actorder", "g_idx_range", nullptr, [&](Tensors& t, Storage& s) {
    Replace(t, s, up + ".g_idx", DType::kI32, {256});
    reinterpret_cast<int32_t*>(s.back().data())[5] = 7;
  });
  EXPECT_NE(err.find("tensor '" + up + ".g_idx': g_idx[5] = 7 is outside [0, 2)"),
            std::string::npos)
      << err;
  err = LoadEdited("qwen2_gptq_actorder", "g_idx_groups", nullptr, [&](Tensors& t, Storage& s) {
    Replace(t, s, up + ".g_idx", DType::kI32, {256});
    int32_t* g = reinterpret_cast<int32_t*>(s.back().data());
    for (int i = 0; i < 256; ++i) g[i] = i < 129 ? 0 : 1;
  });
  EXPECT_NE(err.find("group 0 has 129 input columns in g_idx, expected 128"), std::string::npos)
      << err;
  for (const std::string& e : {err}) EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

}  // namespace
}  // namespace dh
