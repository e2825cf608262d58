// config.json / generation_config.json: real-world shapes parse, and every kind of bad value is
// refused with "<file>: field '<name>': expected ..., got ...".
#include "io/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "unit/io/io_test_util.h"

namespace dh {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;

// DeepSeek-R1-Distill-Qwen-1.5B's config.json, shortened.
json QwenConfig() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "bfloat16",
    "hidden_act": "silu", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
    "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "rope_scaling": null, "tie_word_embeddings": false, "bos_token_id": 151643,
    "eos_token_id": 151643, "sliding_window": 4096, "use_sliding_window": false})");
}

Result<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump(), "config.json"); }

std::string ParseError(const json& j) {
  auto r = Parse(j);
  EXPECT_FALSE(r.ok()) << j.dump() << " was accepted";
  return r.ok() ? std::string() : r.status().message();
}

TEST(ModelConfigTest, ParsesQwen2) {
  auto r = Parse(QwenConfig());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(RopeTypeName(c.rope_scaling.type), "default");
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151643});
  EXPECT_EQ(c.quantization.method, "");
}

TEST(ModelConfigTest, ParsesLlama3RopeAndEosList) {
  json j = QwenConfig();
  j["architectures"] = {"LlamaForCausalLM"};
  j["vocab_size"] = 128256;
  j["hidden_size"] = 4096;
  j["num_attention_heads"] = 32;
  j["num_key_value_heads"] = 8;
  j["bos_token_id"] = 128000;
  j["eos_token_id"] = {128001, 128008, 128009};
  j["rope_scaling"] = json::parse(R"({"factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"})");
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(RopeTypeName(r->rope_scaling.type), "llama3");
  EXPECT_DOUBLE_EQ(r->rope_scaling.factor, 8.0);
  EXPECT_EQ(r->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(r->head_dim, 128);
}

TEST(ModelConfigTest, DefaultsKvHeadsAndHonoursExplicitHeadDim) {
  json j = QwenConfig();
  j.erase("num_key_value_heads");
  j["hidden_size"] = 1000;  // not divisible by 12, fine with an explicit head_dim
  j["head_dim"] = 64;
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->num_key_value_heads, 12);
  EXPECT_EQ(r->head_dim, 64);
}

// DeepSeek-V3's config.json, shortened.
json DeepSeekV3Config() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "tie_word_embeddings": false,
    "attention_bias": false, "bos_token_id": 0, "eos_token_id": 1,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
      "quant_method": "fp8", "weight_block_size": [128, 128]}})");
}

TEST(ModelConfigTest, ParsesDeepSeekV3) {
  auto r = Parse(DeepSeekV3Config());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(MoeScoringFuncName(c.scoring_func), "sigmoid");
  EXPECT_EQ(MoeTopkMethodName(c.topk_method), "noaux_tc");
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(RopeTypeName(c.rope_scaling.type), "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 40.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.quantization.method, "fp8");
  EXPECT_EQ(c.quantization.block_rows, 128);
  EXPECT_EQ(c.quantization.block_cols, 128);
}

TEST(ModelConfigTest, ParsesMoeWithoutIntermediateSizeAndNullQLora) {
  json j = DeepSeekV3Config();
  j.erase("intermediate_size");
  j["q_lora_rank"] = nullptr;
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->q_lora_rank.has_value());
}

TEST(ModelConfigTest, ParsesAwqAndGptq) {
  json j = QwenConfig();
  j["quantization_config"] = json::parse(
      R"({"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm",
          "zero_point": true})");
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->quantization.method, "awq");
  EXPECT_EQ(r->quantization.bits, 4);
  EXPECT_EQ(r->quantization.group_size, 128);
  EXPECT_EQ(r->quantization.version, "gemm");
  j["quantization_config"] = json::parse(
      R"({"bits": 4, "group_size": -1, "quant_method": "gptq", "desc_act": true, "sym": true})");
  r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->quantization.method, "gptq");
  EXPECT_EQ(r->quantization.group_size, -1);
  EXPECT_TRUE(r->quantization.desc_act);
  EXPECT_TRUE(r->quantization.sym);
  EXPECT_EQ(r->quantization.checkpoint_format, "gptq");
  j["quantization_config"] = json::parse(
      R"({"bits": 4, "group_size": 128, "quant_method": "gptq", "desc_act": false, "sym": false,
          "checkpoint_format": "gptq_v2", "dynamic": {}})");
  r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->quantization.checkpoint_format, "gptq_v2");
  EXPECT_FALSE(r->quantization.sym);
  j["quantization_config"] = json::parse(
      R"({"bits": 4, "group_size": 64, "quant_method": "awq", "version": "GEMM"})");
  r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->quantization.version, "gemm");
}

struct BadConfig {
  const char* name;
  std::function<void(json&)> edit;
  std::vector<std::string> expected;
};

TEST(ModelConfigTest, RefusesBadValues) {
  const std::vector<BadConfig> cases = {
      {"zero_heads",
       [](json& j) { j["num_attention_heads"] = 0; },
       {"field 'num_attention_heads': expected a positive integer, got 0"}},
      {"negative_layers",
       [](json& j) { j["num_hidden_layers"] = -1; },
       {"field 'num_hidden_layers'", "got -1"}},
      {"huge_layers",
       [](json& j) { j["num_hidden_layers"] = 1000000000; },
       {"field 'num_hidden_layers'", "at most 4096"}},
      {"huge_positions",
       [](json& j) { j["max_position_embeddings"] = int64_t{1} << 40; },
       {"field 'max_position_embeddings'"}},
      {"uint64_vocab", [](json& j) { j["vocab_size"] = UINT64_MAX; }, {"field 'vocab_size'"}},
      {"non_divisible_heads",
       [](json& j) {
         j["num_attention_heads"] = 7;
         j["num_key_value_heads"] = 7;
       },
       {"field 'num_attention_heads'", "divisor of hidden_size = 1536", "got 7"}},
      {"non_divisible_kv_heads",
       [](json& j) { j["num_key_value_heads"] = 5; },
       {"field 'num_key_value_heads'", "divisor of num_attention_heads = 12", "got 5"}},
      {"string_for_int",
       [](json& j) { j["hidden_size"] = "1536"; },
       {"field 'hidden_size'", "expected a positive integer", "got \"1536\""}},
      {"float_for_int",
       [](json& j) { j["intermediate_size"] = 8960.5; },
       {"field 'intermediate_size'"}},
      {"missing_hidden",
       [](json& j) { j.erase("hidden_size"); },
       {"field 'hidden_size'", "missing"}},
      {"missing_intermediate",
       [](json& j) { j.erase("intermediate_size"); },
       {"field 'intermediate_size'", "missing"}},
      {"missing_architectures",
       [](json& j) { j.erase("architectures"); },
       {"field 'architectures'"}},
      {"empty_architectures",
       [](json& j) { j["architectures"] = json::array(); },
       {"field 'architectures'", "non-empty list of strings"}},
      {"zero_eps", [](json& j) { j["rms_norm_eps"] = 0; }, {"field 'rms_norm_eps'"}},
      {"negative_theta", [](json& j) { j["rope_theta"] = -1.0; }, {"field 'rope_theta'"}},
      {"bool_as_string",
       [](json& j) { j["tie_word_embeddings"] = "false"; },
       {"field 'tie_word_embeddings'", "true or false"}},
      {"eos_out_of_vocab",
       [](json& j) {
         j["eos_token_id"] = {1, 999999};
       },
       {"field 'eos_token_id'"}},
      {"odd_head_dim", [](json& j) { j["head_dim"] = 63; }, {"field 'head_dim'", "even"}},
      {"rope_scaling_unknown",
       [](json& j) {
         j["rope_scaling"] = {{"type", "longrope"}, {"factor", 2.0}};
       },
       {"field 'rope_scaling.type'", "longrope"}},
      {"rope_scaling_not_object", [](json& j) { j["rope_scaling"] = 3; }, {"field 'rope_scaling'"}},
      {"rope_scaling_no_factor",
       [](json& j) {
         j["rope_scaling"] = {{"type", "linear"}};
       },
       {"field 'rope_scaling.factor'", "missing"}},
      {"llama3_bad_freqs",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"low_freq_factor", 4.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192}};
       },
       {"field 'rope_scaling.high_freq_factor'"}},
      {"quant_unknown",
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "bnb"}};
       },
       {"field 'quantization_config.quant_method'", "bnb"}},
      {"fp8_bad_block",
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128}}};
       },
       {"field 'quantization_config.weight_block_size'"}},
      {"awq_zero_group",
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 0}};
       },
       {"field 'quantization_config.group_size'"}},
      {"gptq_bits_8",
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 8}, {"group_size", 128}};
       },
       {"field 'quantization_config.bits'", "8-bit gptq", "expected 4"}},
      {"awq_bits_3",
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 3}, {"group_size", 128}};
       },
       {"field 'quantization_config.bits'", "3-bit awq"}},
      {"awq_gemv",
       [](json& j) {
         j["quantization_config"] = {
             {"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"version", "gemv"}};
       },
       {"field 'quantization_config.version'", "gemv", "expected gemm"}},
      {"awq_no_zero_point",
       [](json& j) {
         j["quantization_config"] = {
             {"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"zero_point", false}};
       },
       {"field 'quantization_config.zero_point'"}},
      {"gptq_marlin_format",
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128},
                                     {"checkpoint_format", "marlin"}};
       },
       {"field 'quantization_config.checkpoint_format'", "marlin", "gptq_v2"}},
      {"gptq_dynamic",
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128},
                                     {"dynamic", {{"-:.*mlp.*", json::object()}}}};
       },
       {"field 'quantization_config.dynamic'"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    json j = QwenConfig();
    c.edit(j);
    const std::string msg = ParseError(j);
    EXPECT_THAT(msg, HasSubstr("config.json: "));
    for (const auto& e : c.expected) EXPECT_THAT(msg, HasSubstr(e));
  }
}

TEST(ModelConfigTest, RefusesBadMoeValues) {
  const std::vector<BadConfig> cases = {
      {"experts_per_tok",
       [](json& j) { j["num_experts_per_tok"] = 300; },
       {"field 'num_experts_per_tok'"}},
      {"n_group", [](json& j) { j["n_group"] = 7; }, {"field 'n_group'"}},
      {"topk_group", [](json& j) { j["topk_group"] = 9; }, {"field 'topk_group'"}},
      {"moe_intermediate",
       [](json& j) { j["moe_intermediate_size"] = 0; },
       {"field 'moe_intermediate_size'"}},
      {"rope_dim", [](json& j) { j["qk_rope_head_dim"] = 0; }, {"field 'qk_rope_head_dim'"}},
      {"scoring", [](json& j) { j["scoring_func"] = "relu"; }, {"field 'scoring_func'"}},
      {"q_lora_zero", [](json& j) { j["q_lora_rank"] = 0; }, {"field 'q_lora_rank'"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    json j = DeepSeekV3Config();
    c.edit(j);
    for (const auto& e : c.expected) EXPECT_THAT(ParseError(j), HasSubstr(e));
  }
}

TEST(ModelConfigTest, RefusesInvalidJson) {
  for (const char* text : {"{\"vocab_size\": ", "[1, 2]", "{\"a\": 1, \"a\": 2}", "", "nan"}) {
    SCOPED_TRACE(text);
    auto r = ParseModelConfig(text, "dir/config.json");
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("dir/config.json"));
  }
}

TEST(ModelConfigTest, LoadsFromDirectory) {
  testing::TempDir dir;
  auto missing = LoadModelConfig(dir.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("config.json"));
  testing::WriteFile(dir.File("config.json"), QwenConfig().dump());
  auto r = LoadModelConfig(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->hidden_size, 1536);
}

TEST(GenerationConfigTest, MissingFileGivesDefaults) {
  testing::TempDir dir;
  auto r = LoadGenerationConfig(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->eos_token_ids.empty());
  EXPECT_FALSE(r->temperature.has_value());
}

TEST(GenerationConfigTest, ParsesFields) {
  testing::TempDir dir;
  testing::WriteFile(dir.File("generation_config.json"),
                     R"({"bos_token_id": 151646, "eos_token_id": [151643, 151645],
                         "do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
                         "repetition_penalty": 1.05, "transformers_version": "4.39.3"})");
  auto r = LoadGenerationConfig(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->bos_token_id, 151646);
  EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{151643, 151645}));
  EXPECT_DOUBLE_EQ(*r->temperature, 0.6);
  EXPECT_DOUBLE_EQ(*r->top_p, 0.95);
  EXPECT_EQ(*r->top_k, 20);
  EXPECT_DOUBLE_EQ(*r->repetition_penalty, 1.05);

  testing::WriteFile(dir.File("generation_config.json"), R"({"eos_token_id": 7})");
  r = LoadGenerationConfig(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->eos_token_ids, std::vector<int64_t>{7});
}

TEST(GenerationConfigTest, RefusesBadValues) {
  testing::TempDir dir;
  for (const char* text : {R"({"top_p": 1.5})", R"({"temperature": "hot"})",
                           R"({"eos_token_id": "x"})", R"({"top_k": -1})", "{"}) {
    SCOPED_TRACE(text);
    testing::WriteFile(dir.File("generation_config.json"), text);
    auto r = LoadGenerationConfig(dir.path());
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("generation_config.json"));
  }
}

}  // namespace
}  // namespace dh
