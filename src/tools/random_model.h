// Random checkpoints of known shapes (tiny-llama, qwen2-1.5b, v2-lite, tiny-v3) for demos, tests
// and benchmarks: config.json + safetensors filled with N(0, 0.02)-like values (norms 1), written
// shard by shard so a multi-GB model never sits in memory whole.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"

namespace dh::tools {

struct RandomModelOptions {
  std::string preset;
  int layers = 0;              // 0: the preset's layer count
  int64_t vocab_size = 0;      // 0: the preset's vocabulary (else: to match a tokenizer)
  DType dtype = DType::kBF16;  // kBF16 or kF32
  uint64_t seed = 0;
  double stddev = 0.02;
  // DeepSeek presets: multi-token-prediction layers (num_nextn_predict_layers; docs/mtp.md),
  // stored after the main layers like DeepSeek-V3's release.
  int mtp_layers = 0;
  // Integer fields of the preset's config.json replaced before the tensors are derived from it
  // (`make-model --set hidden_size=1024`): a shape the presets do not have, e.g. a V3 layout wide
  // enough that decode is bound by reading weights. Layer count and vocabulary have their own
  // options.
  std::vector<std::pair<std::string, int64_t>> overrides;
  uint64_t shard_bytes = 1ull << 30;  // tensor bytes per shard before starting a new file
};

std::vector<std::string> RandomModelPresets();

// The config.json object of the preset with the options applied.
Result<nlohmann::json> RandomModelConfig(const RandomModelOptions& options);

// One tensor the checkpoint holds. Kinds: normal (random), ones (norm weights), zeros (biases of
// the router's score correction).
struct RandomTensorSpec {
  enum class Fill { kNormal, kOnes, kZeros };
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kBF16;
  Fill fill = Fill::kNormal;
  uint64_t nbytes() const;
};

// The tensors an HF checkpoint with this config.json carries (Llama/Qwen2/Mistral and DeepSeek
// V2/V3 layouts).
Result<std::vector<RandomTensorSpec>> RandomModelTensors(const nlohmann::json& config, DType dtype);

struct RandomModelSummary {
  int64_t num_tensors = 0;
  int64_t num_parameters = 0;
  uint64_t bytes = 0;
  int num_files = 0;
};

// Creates DIR if needed and writes config.json, generation_config.json and the weights
// (model.safetensors, or model-XXXXX-of-YYYYY.safetensors + model.safetensors.index.json when the
// tensors exceed one shard).
Result<RandomModelSummary> WriteRandomModel(const RandomModelOptions& options,
                                            const std::string& dir);

// Fills `n` values with approximately N(0, stddev) (Irwin-Hall of four 16-bit uniforms from a
// splitmix64 stream) — cheap enough for billions of values.
void FillRandomNormal(uint64_t seed, double stddev, int64_t n, DType dtype, void* out);

}  // namespace dh::tools
