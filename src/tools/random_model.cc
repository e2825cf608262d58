// Random checkpoint generator: preset configs, the HF tensor layout of each architecture family,
// a cheap normal-ish RNG and a shard-at-a-time writer.
#include "tools/random_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "base/checked_math.h"
#include "io/safetensors_writer.h"
#include "tensor/tensor.h"

namespace dh::tools {

using nlohmann::json;

namespace {

json TinyLlama() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 512},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 2048},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", false},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false}};
}

// Llama-3.1-8B's shapes (GQA 32/8 heads, 128k vocabulary).
json Llama8B() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 128256},
          {"hidden_size", 4096},
          {"intermediate_size", 14336},
          {"num_hidden_layers", 32},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 8},
          {"max_position_embeddings", 131072},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"tie_word_embeddings", false},
          {"bos_token_id", 128000},
          {"eos_token_id", 128001},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false}};
}

json Qwen2_1_5B() {
  return {{"architectures", {"Qwen2ForCausalLM"}},
          {"model_type", "qwen2"},
          {"vocab_size", 151936},
          {"hidden_size", 1536},
          {"intermediate_size", 8960},
          {"num_hidden_layers", 28},
          {"num_attention_heads", 12},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 32768},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"tie_word_embeddings", true},
          {"bos_token_id", 151643},
          {"eos_token_id", 151643},
          {"hidden_act", "silu"},
          {"use_sliding_window", false},
          {"sliding_window", nullptr}};
}

json DeepSeekV2Lite() {
  return {{"architectures", {"DeepseekV2ForCausalLM"}},
          {"model_type", "deepseek_v2"},
          {"vocab_size", 102400},
          {"hidden_size", 2048},
          {"intermediate_size", 10944},
          {"moe_intermediate_size", 1408},
          {"num_hidden_layers", 27},
          {"num_attention_heads", 16},
          {"num_key_value_heads", 16},
          {"n_shared_experts", 2},
          {"n_routed_experts", 64},
          {"num_experts_per_tok", 6},
          {"routed_scaling_factor", 1.0},
          {"first_k_dense_replace", 1},
          {"moe_layer_freq", 1},
          {"norm_topk_prob", false},
          {"scoring_func", "softmax"},
          {"topk_method", "greedy"},
          {"n_group", 1},
          {"topk_group", 1},
          {"q_lora_rank", nullptr},
          {"kv_lora_rank", 512},
          {"qk_nope_head_dim", 128},
          {"qk_rope_head_dim", 64},
          {"v_head_dim", 128},
          {"max_position_embeddings", 163840},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"rope_scaling",
           {{"type", "yarn"},
            {"factor", 40.0},
            {"original_max_position_embeddings", 4096},
            {"beta_fast", 32},
            {"beta_slow", 1},
            {"mscale", 0.707},
            {"mscale_all_dim", 0.707}}},
          {"tie_word_embeddings", false},
          {"attention_bias", false},
          {"bos_token_id", 100000},
          {"eos_token_id", 100001},
          {"hidden_act", "silu"}};
}

json TinyV3() {
  return {{"architectures", {"DeepseekV3ForCausalLM"}},
          {"model_type", "deepseek_v3"},
          {"vocab_size", 512},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"moe_intermediate_size", 32},
          {"num_hidden_layers", 3},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 4},
          {"n_shared_experts", 1},
          {"n_routed_experts", 16},
          {"num_experts_per_tok", 4},
          {"routed_scaling_factor", 2.5},
          {"first_k_dense_replace", 1},
          {"moe_layer_freq", 1},
          {"norm_topk_prob", true},
          {"scoring_func", "sigmoid"},
          {"topk_method", "noaux_tc"},
          {"n_group", 4},
          {"topk_group", 2},
          {"q_lora_rank", 32},
          {"kv_lora_rank", 32},
          {"qk_nope_head_dim", 16},
          {"qk_rope_head_dim", 8},
          {"v_head_dim", 16},
          {"num_nextn_predict_layers", 0},
          {"max_position_embeddings", 2048},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"rope_scaling",
           {{"type", "yarn"},
            {"factor", 4.0},
            {"original_max_position_embeddings", 512},
            {"beta_fast", 32},
            {"beta_slow", 1},
            {"mscale", 1.0},
            {"mscale_all_dim", 1.0}}},
          {"tie_word_embeddings", false},
          {"attention_bias", false},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"hidden_act", "silu"}};
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A required positive integer field of a preset config.
Result<int64_t> Int(const json& c, const char* key) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) {
    return InvalidArgument("random model config: field '{}': expected a positive integer", key);
  }
  return it->get<int64_t>();
}

int64_t IntOr(const json& c, const char* key, int64_t fallback) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer()) return fallback;
  return it->get<int64_t>();
}

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return IoError("{}: cannot open for writing", path);
  f << text;
  f.close();
  if (!f) return IoError("{}: write failed", path);
  return Status();
}

}  // namespace

std::vector<std::string> RandomModelPresets() {
  return {"tiny-llama", "qwen2-1.5b", "llama-8b", "v2-lite", "tiny-v3"};
}

// Largest value `--set` takes: every dim of a tensor stays far from overflowing, and
// WriteRandomModel checks the products.
constexpr int64_t kMaxOverride = int64_t{1} << 24;

Result<json> RandomModelConfig(const RandomModelOptions& options) {
  json c;
  if (options.preset == "tiny-llama") {
    c = TinyLlama();
  } else if (options.preset == "qwen2-1.5b") {
    c = Qwen2_1_5B();
  } else if (options.preset == "llama-8b") {
    c = Llama8B();
  } else if (options.preset == "v2-lite") {
    c = DeepSeekV2Lite();
  } else if (options.preset == "tiny-v3") {
    c = TinyV3();
  } else {
    return InvalidArgument(
        "--preset: unknown preset '{}' (expected tiny-llama, qwen2-1.5b, "
        "llama-8b, v2-lite or tiny-v3)",
        options.preset);
  }
  for (const auto& [key, value] : options.overrides) {
    if (key == "num_hidden_layers" || key == "vocab_size" || key == "num_nextn_predict_layers") {
      return InvalidArgument("--set {}: use --layers, --vocab-size or --mtp-layers", key);
    }
    if (!c.contains(key) || !c[key].is_number_integer()) {
      return InvalidArgument("--set {}: not an integer field of preset {}'s config.json", key,
                             options.preset);
    }
    if (value < 0 || value > kMaxOverride) {
      return InvalidArgument("--set {}={}: expected 0 to {}", key, value, kMaxOverride);
    }
    c[key] = value;
  }
  if (options.layers < 0) {
    return InvalidArgument("--layers: expected >= 1, got {}", options.layers);
  }
  if (options.layers > 0) {
    c["num_hidden_layers"] = options.layers;
    if (c.contains("max_window_layers")) c["max_window_layers"] = options.layers;
  }
  if (options.mtp_layers < 0 || options.mtp_layers > 1) {
    return InvalidArgument("--mtp-layers: expected 0 or 1, got {}", options.mtp_layers);
  }
  if (options.mtp_layers > 0) {
    const std::string arch = c["architectures"][0].get<std::string>();
    if (arch != "DeepseekV3ForCausalLM") {
      return InvalidArgument("--mtp-layers: only DeepSeek-V3 presets (tiny-v3) have MTP layers, "
                             "not {}", arch);
    }
    c["num_nextn_predict_layers"] = options.mtp_layers;
  }
  if (options.vocab_size < 0 || options.vocab_size > (int64_t{1} << 24)) {
    return InvalidArgument("--vocab-size: expected 1 to 16777216, got {}", options.vocab_size);
  }
  if (options.vocab_size > 0) {
    c["vocab_size"] = options.vocab_size;
    // A cut vocabulary keeps its special ids inside it: an id the preset puts beyond the cut
    // becomes DeepSeek's layout (BOS 0, EOS 1: the embedded tokenizer's, the usual one copied in).
    const int64_t v = options.vocab_size;
    if (c["bos_token_id"].get<int64_t>() >= v) c["bos_token_id"] = 0;
    if (c["eos_token_id"].get<int64_t>() >= v) c["eos_token_id"] = v > 1 ? 1 : 0;
  }
  if (options.dtype == DType::kBF16) {
    c["torch_dtype"] = "bfloat16";
  } else if (options.dtype == DType::kF32) {
    c["torch_dtype"] = "float32";
  } else {
    return InvalidArgument("--dtype: expected bf16 or f32, got {}", DTypeName(options.dtype));
  }
  c["initializer_range"] = options.stddev;
  return c;
}

uint64_t RandomTensorSpec::nbytes() const {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Result<std::vector<RandomTensorSpec>> RandomModelTensors(const json& c, DType dtype) {
  using Fill = RandomTensorSpec::Fill;
  std::vector<RandomTensorSpec> t;
  auto add = [&](std::string name, std::vector<int64_t> shape, Fill fill = Fill::kNormal,
                 DType dt = DType::kF32) {
    t.push_back({std::move(name), std::move(shape), fill == Fill::kZeros ? dt : dtype, fill});
  };
  if (!c.contains("architectures") || !c["architectures"].is_array() ||
      c["architectures"].empty() || !c["architectures"][0].is_string()) {
    return InvalidArgument("random model config: field 'architectures': expected [name]");
  }
  const std::string arch = c["architectures"][0].get<std::string>();
  DH_ASSIGN_OR_RETURN(const int64_t vocab, Int(c, "vocab_size"));
  DH_ASSIGN_OR_RETURN(const int64_t hidden, Int(c, "hidden_size"));
  DH_ASSIGN_OR_RETURN(const int64_t inter, Int(c, "intermediate_size"));
  DH_ASSIGN_OR_RETURN(const int64_t layers, Int(c, "num_hidden_layers"));
  DH_ASSIGN_OR_RETURN(const int64_t heads, Int(c, "num_attention_heads"));
  const bool tied = c.value("tie_word_embeddings", false);

  add("model.embed_tokens.weight", {vocab, hidden});
  const bool deepseek = arch == "DeepseekV2ForCausalLM" || arch == "DeepseekV3ForCausalLM";
  const bool llama_like =
      arch == "LlamaForCausalLM" || arch == "Qwen2ForCausalLM" || arch == "MistralForCausalLM";
  if (!deepseek && !llama_like) {
    return Unsupported("random model: architecture '{}' has no tensor layout here", arch);
  }
  auto mlp = [&](const std::string& p, int64_t width) {
    add(p + "gate_proj.weight", {width, hidden});
    add(p + "up_proj.weight", {width, hidden});
    add(p + "down_proj.weight", {hidden, width});
  };
  // DeepSeek-V3's MTP layers follow the main ones: a decoder layer plus its own embedding,
  // enorm, hnorm, eh_proj and shared head (docs/mtp.md).
  const int64_t mtp_layers = deepseek ? IntOr(c, "num_nextn_predict_layers", 0) : 0;
  for (int64_t l = 0; l < layers + mtp_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (l >= layers) {
      add(p + "embed_tokens.weight", {vocab, hidden});
      add(p + "enorm.weight", {hidden}, Fill::kOnes);
      add(p + "hnorm.weight", {hidden}, Fill::kOnes);
      add(p + "eh_proj.weight", {hidden, 2 * hidden});
      add(p + "shared_head.norm.weight", {hidden}, Fill::kOnes);
      add(p + "shared_head.head.weight", {vocab, hidden});
    }
    add(p + "input_layernorm.weight", {hidden}, Fill::kOnes);
    add(p + "post_attention_layernorm.weight", {hidden}, Fill::kOnes);
    if (llama_like) {
      const int64_t kv_heads = IntOr(c, "num_key_value_heads", heads);
      const int64_t head_dim = IntOr(c, "head_dim", hidden / heads);
      const bool bias = arch == "Qwen2ForCausalLM" || c.value("attention_bias", false);
      const std::string a = p + "self_attn.";
      add(a + "q_proj.weight", {heads * head_dim, hidden});
      add(a + "k_proj.weight", {kv_heads * head_dim, hidden});
      add(a + "v_proj.weight", {kv_heads * head_dim, hidden});
      add(a + "o_proj.weight", {hidden, heads * head_dim});
      if (bias) {
        add(a + "q_proj.bias", {heads * head_dim});
        add(a + "k_proj.bias", {kv_heads * head_dim});
        add(a + "v_proj.bias", {kv_heads * head_dim});
      }
      mlp(p + "mlp.", inter);
      continue;
    }
    DH_ASSIGN_OR_RETURN(const int64_t kv_lora, Int(c, "kv_lora_rank"));
    DH_ASSIGN_OR_RETURN(const int64_t nope, Int(c, "qk_nope_head_dim"));
    DH_ASSIGN_OR_RETURN(const int64_t rope, Int(c, "qk_rope_head_dim"));
    DH_ASSIGN_OR_RETURN(const int64_t v_dim, Int(c, "v_head_dim"));
    const std::string a = p + "self_attn.";
    const int64_t q_lora = IntOr(c, "q_lora_rank", 0);
    if (q_lora > 0) {
      add(a + "q_a_proj.weight", {q_lora, hidden});
      add(a + "q_a_layernorm.weight", {q_lora}, Fill::kOnes);
      add(a + "q_b_proj.weight", {heads * (nope + rope), q_lora});
    } else {
      add(a + "q_proj.weight", {heads * (nope + rope), hidden});
    }
    add(a + "kv_a_proj_with_mqa.weight", {kv_lora + rope, hidden});
    add(a + "kv_a_layernorm.weight", {kv_lora}, Fill::kOnes);
    add(a + "kv_b_proj.weight", {heads * (nope + v_dim), kv_lora});
    add(a + "o_proj.weight", {hidden, heads * v_dim});
    const int64_t experts = IntOr(c, "n_routed_experts", 0);
    const int64_t first_dense = IntOr(c, "first_k_dense_replace", 0);
    const int64_t freq = std::max<int64_t>(1, IntOr(c, "moe_layer_freq", 1));
    if (experts <= 0 || l < first_dense || l % freq != 0) {
      mlp(p + "mlp.", inter);
      continue;
    }
    DH_ASSIGN_OR_RETURN(const int64_t moe_inter, Int(c, "moe_intermediate_size"));
    for (int64_t e = 0; e < experts; ++e) {
      mlp(p + "mlp.experts." + std::to_string(e) + ".", moe_inter);
    }
    add(p + "mlp.gate.weight", {experts, hidden});
    if (c.value("topk_method", std::string("greedy")) == "noaux_tc") {
      add(p + "mlp.gate.e_score_correction_bias", {experts}, Fill::kZeros, DType::kF32);
    }
    const int64_t shared = IntOr(c, "n_shared_experts", 0);
    if (shared > 0) mlp(p + "mlp.shared_experts.", moe_inter * shared);
  }
  add("model.norm.weight", {hidden}, Fill::kOnes);
  if (!tied) add("lm_head.weight", {vocab, hidden});
  return t;
}

void FillRandomNormal(uint64_t seed, double stddev, int64_t n, DType dtype, void* out) {
  uint64_t state = seed;
  // Sum of four U(0,1) has mean 2 and variance 1/3.
  const float scale = static_cast<float>(stddev * std::sqrt(3.0) / 65536.0);
  const float offset = static_cast<float>(2.0 * 65536.0);
  auto next = [&]() {
    const uint64_t r = SplitMix64(state);
    const float s =
        static_cast<float>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48)) +
        2.0f;  // centre each 16-bit uniform on its bucket
    return (s - offset) * scale;
  };
  if (dtype == DType::kBF16) {
    auto* p = static_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) p[i] = F32ToBF16(next());
  } else {
    DH_CHECK(dtype == DType::kF32, "FillRandomNormal: dtype {}", DTypeName(dtype));
    auto* p = static_cast<float*>(out);
    for (int64_t i = 0; i < n; ++i) p[i] = next();
  }
}

constexpr uint64_t kMaxCheckpointBytes = uint64_t{1} << 40;

Result<RandomModelSummary> WriteRandomModel(const RandomModelOptions& options,
                                            const std::string& dir) {
  DH_ASSIGN_OR_RETURN(json config, RandomModelConfig(options));
  DH_ASSIGN_OR_RETURN(std::vector<RandomTensorSpec> specs,
                      RandomModelTensors(config, options.dtype));
  // Plan shards: consecutive tensors up to shard_bytes each (a single larger tensor gets its own).
  std::vector<size_t> shard_start = {0};
  uint64_t in_shard = 0;
  RandomModelSummary summary;
  for (size_t i = 0; i < specs.size(); ++i) {
    // Shapes come from config values a user can set: sizes are checked before anything is
    // written (a tensor or a checkpoint past 1 TiB is refused).
    const auto elems = CheckedProduct(specs[i].shape);
    const auto bytes = elems ? CheckedMul(*elems, DTypeSize(specs[i].dtype)) : std::nullopt;
    const auto total = bytes ? CheckedAdd(summary.bytes, *bytes) : std::nullopt;
    if (!total || *total > kMaxCheckpointBytes) {
      return InvalidArgument("random model: tensor {} makes the checkpoint larger than 1 TiB",
                             specs[i].name);
    }
    const uint64_t b = *bytes;
    if (in_shard > 0 && in_shard + b > options.shard_bytes) {
      shard_start.push_back(i);
      in_shard = 0;
    }
    in_shard += b;
    summary.bytes += b;
    summary.num_parameters += static_cast<int64_t>(*elems);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("{}: cannot create directory: {}", dir, ec.message());
  shard_start.push_back(specs.size());
  const int num_shards = static_cast<int>(shard_start.size()) - 1;
  summary.num_tensors = static_cast<int64_t>(specs.size());
  summary.num_files = num_shards;

  json weight_map = json::object();
  std::set<std::string> written;
  for (int s = 0; s < num_shards; ++s) {
    std::string file = "model.safetensors";
    if (num_shards > 1) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s + 1, num_shards);
      file = name;
    }
    uint64_t shard_total = 0;
    for (size_t i = shard_start[s]; i < shard_start[s + 1]; ++i) shard_total += specs[i].nbytes();
    std::vector<uint8_t> storage;
    storage.resize(shard_total);
    std::vector<std::pair<std::string, Tensor>> tensors;
    uint64_t offset = 0;
    for (size_t i = shard_start[s]; i < shard_start[s + 1]; ++i) {
      const RandomTensorSpec& spec = specs[i];
      void* data = storage.data() + offset;
      const int64_t n = static_cast<int64_t>(spec.nbytes() / DTypeSize(spec.dtype));
      switch (spec.fill) {
        case RandomTensorSpec::Fill::kNormal:
          // A distinct stream per tensor: the seed mixed with the tensor's index.
          FillRandomNormal(options.seed * 0x100000001B3ull + i * 0x9E3779B97F4A7C15ull + 1,
                           options.stddev, n, spec.dtype, data);
          break;
        case RandomTensorSpec::Fill::kOnes:
          for (int64_t k = 0; k < n; ++k) {
            if (spec.dtype == DType::kBF16) {
              static_cast<uint16_t*>(data)[k] = F32ToBF16(1.0f);
            } else {
              static_cast<float*>(data)[k] = 1.0f;
            }
          }
          break;
        case RandomTensorSpec::Fill::kZeros:
          break;  // resize zero-fills
      }
      tensors.emplace_back(spec.name, Tensor::FromDims(data, spec.dtype, spec.shape));
      weight_map[spec.name] = file;
      offset += spec.nbytes();
    }
    DH_RETURN_IF_ERROR(WriteSafetensors(dir + "/" + file, tensors, {{"format", "pt"}}));
    written.insert(file);
  }
  // Drop shards of an earlier run with a different shard count.
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors") && !written.contains(name)) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (num_shards > 1) {
    json index = {{"metadata", {{"total_size", summary.bytes}}}, {"weight_map", weight_map}};
    DH_RETURN_IF_ERROR(WriteTextFile(index_path, index.dump(2) + "\n"));
  } else {
    std::filesystem::remove(index_path, ec);
  }
  DH_RETURN_IF_ERROR(WriteTextFile(dir + "/config.json", config.dump(2) + "\n"));
  json gen = {{"bos_token_id", config["bos_token_id"]}, {"eos_token_id", config["eos_token_id"]}};
  DH_RETURN_IF_ERROR(WriteTextFile(dir + "/generation_config.json", gen.dump(2) + "\n"));
  return summary;
}

}  // namespace dh::tools
