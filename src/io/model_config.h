// config.json -> ModelConfig (every field any supported architecture reads, validated for
// presence, type, range and divisibility) and generation_config.json -> GenerationConfig.
// Architecture-specific requirements are checked again by the architecture (src/model/arch).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dh {

// rope_scaling.rope_type (or .type), MoE scoring_func and topk_method: parsed once from
// config.json into these; an unknown name is refused there, with the field named.
enum class RopeType : uint8_t { kDefault, kLinear, kDynamic, kLlama3, kYarn };
enum class MoeScoringFunc : uint8_t { kSoftmax, kSigmoid };
enum class MoeTopkMethod : uint8_t { kGreedy, kGroupLimitedGreedy, kNoauxTc };
std::string_view RopeTypeName(RopeType t);              // default | linear | ... (config names)
std::string_view MoeScoringFuncName(MoeScoringFunc f);  // softmax | sigmoid
std::string_view MoeTopkMethodName(MoeTopkMethod m);    // greedy | group_limited_greedy | noaux_tc

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // yarn, llama3, dynamic (0: use max_position)
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3
  double beta_fast = 32.0;                       // yarn
  double beta_slow = 1.0;                        // yarn
  double mscale = 1.0;                           // yarn (DeepSeek)
  double mscale_all_dim = 0.0;                   // yarn (DeepSeek)
  std::optional<double> attention_factor;        // yarn (HF)
};

struct QuantizationConfig {
  std::string method;  // "" (none) | fp8 | awq | gptq
  int block_rows = 0;  // fp8 weight_block_size
  int block_cols = 0;
  int bits = 0;        // awq | gptq: only 4 is accepted
  int group_size = 0;  // -1: one group per row (the whole input dimension)
  bool desc_act = false;   // gptq: act-order (g_idx is a permuted group assignment)
  bool zero_point = true;  // awq: only true (asymmetric, qzeros stored) is accepted
  bool sym = true;         // gptq: informational (symmetric GPTQ still stores qzeros)
  std::string version = "gemm";              // awq: only the GEMM packing is accepted
  std::string checkpoint_format = "gptq";    // gptq: gptq (zeros stored minus 1) | gptq_v2
};

struct ModelConfig {
  std::string architecture;  // architectures[0]
  std::string model_type;
  std::string torch_dtype;
  std::string hidden_act = "silu";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // Llama's q/k/v/o biases; Qwen2 always has q/k/v biases
  bool mlp_bias = false;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  // DeepSeek V2/V3 (MLA + MoE) and DeepSeek-MoE.
  std::optional<int64_t> q_lora_rank;  // null: direct q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;  // 0: dense model
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  // Read only for MoE models (n_routed_experts > 0); a dense model's values are ignored.
  MoeScoringFunc scoring_func = MoeScoringFunc::kSoftmax;
  MoeTopkMethod topk_method = MoeTopkMethod::kGreedy;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int64_t num_nextn_predict_layers = 0;

  QuantizationConfig quantization;
};

// Reads DIR/config.json. Errors name the file and the field.
Result<ModelConfig> LoadModelConfig(const std::string& dir);
// Parses config.json text; `source` names it in errors.
Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);

struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> repetition_penalty;
};

// Reads DIR/generation_config.json; a missing file gives defaults.
Result<GenerationConfig> LoadGenerationConfig(const std::string& dir);

}  // namespace dh
