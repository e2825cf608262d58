// config.json / generation_config.json readers. The whole config is validated (presence, type,
// range, divisibility, upper bounds) before any derived value is computed, so later code can
// multiply and divide these numbers without overflow or division by zero (sglang#32028).
#include "io/model_config.h"

#include <array>
#include <cctype>
#include <cmath>
#include <optional>
#include <string_view>

#include "base/mapped_file.h"
#include "io/json_util.h"

namespace dh {
namespace {

using nlohmann::json;

// Upper bounds far above any real model; they keep products such as vocab x hidden far from
// overflowing 64 bits.
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxHeads = int64_t{1} << 14;
constexpr int64_t kMaxPositions = int64_t{1} << 24;
constexpr int64_t kMaxExperts = int64_t{1} << 16;

std::string IntKind(int64_t min) {
  if (min == 1) return "a positive integer";
  if (min == 0) return "a non-negative integer";
  return fmt::format("an integer >= {}", min);
}

// Typed access to the fields of one JSON object, with errors in the form
// "<source>: field '<prefix><key>': expected <what>, got <value>".
class Fields {
 public:
  Fields(const json& obj, const std::string& source, std::string prefix = "")
      : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

  // The value of `key`, or nullptr when it is absent or null.
  const json* Get(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  bool Has(const char* key) const { return Get(key) != nullptr; }

  Status Error(const char* key, std::string_view expected, std::string_view got) const {
    return InvalidArgument("{}: field '{}{}': expected {}, got {}", source_, prefix_, key, expected,
                           got);
  }
  Status Missing(const char* key, std::string_view expected) const {
    return InvalidArgument("{}: field '{}{}': expected {}, but it is missing", source_, prefix_,
                           key, expected);
  }

  // Leaves *out unchanged when the field is absent and not required.
  Status Int(const char* key, int64_t* out, int64_t min, int64_t max, bool required = false) const {
    const json* v = Get(key);
    if (v == nullptr) return required ? Missing(key, IntKind(min)) : Status::Ok();
    std::optional<int64_t> value;
    if (v->is_number_integer()) {
      value = v->get<int64_t>();  // is_number_integer() also covers unsigned values
      if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        value.reset();
      }
    }
    if (!value) return Error(key, IntKind(min), JsonSnippet(*v));
    if (*value < min) return Error(key, IntKind(min), JsonSnippet(*v));
    if (*value > max) {
      return Error(key, fmt::format("{} of at most {}", IntKind(min), max), JsonSnippet(*v));
    }
    *out = *value;
    return Status::Ok();
  }
  Status OptionalInt(const char* key, std::optional<int64_t>* out, int64_t min, int64_t max) const {
    if (!Has(key)) return Status::Ok();
    int64_t v = 0;
    DH_RETURN_IF_ERROR(Int(key, &v, min, max));
    *out = v;
    return Status::Ok();
  }
  Status IntAsInt(const char* key, int* out, int min, int max, bool required = false) const {
    int64_t v = *out;
    DH_RETURN_IF_ERROR(Int(key, &v, min, max, required));
    *out = static_cast<int>(v);
    return Status::Ok();
  }

  // A finite number; when `positive`, strictly above zero.
  Status Number(const char* key, double* out, bool positive, bool required = false) const {
    const json* v = Get(key);
    const char* kind = positive ? "a positive number" : "a number";
    if (v == nullptr) return required ? Missing(key, kind) : Status::Ok();
    if (!v->is_number()) return Error(key, kind, JsonSnippet(*v));
    double d = v->get<double>();
    if (!std::isfinite(d) || (positive && !(d > 0))) return Error(key, kind, JsonSnippet(*v));
    *out = d;
    return Status::Ok();
  }
  Status OptionalNumber(const char* key, std::optional<double>* out, bool positive) const {
    if (!Has(key)) return Status::Ok();
    double d = 0;
    DH_RETURN_IF_ERROR(Number(key, &d, positive));
    *out = d;
    return Status::Ok();
  }

  Status Bool(const char* key, bool* out) const {
    const json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) return Error(key, "true or false", JsonSnippet(*v));
    *out = v->get<bool>();
    return Status::Ok();
  }

  Status String(const char* key, std::string* out, bool required = false) const {
    const json* v = Get(key);
    if (v == nullptr) return required ? Missing(key, "a string") : Status::Ok();
    if (!v->is_string()) return Error(key, "a string", JsonSnippet(*v));
    *out = v->get<std::string>();
    return Status::Ok();
  }

  // A token id or a list of token ids, each in [0, limit).
  Status TokenIds(const char* key, std::vector<int64_t>* out, int64_t limit) const {
    const json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    const std::string kind = fmt::format("a token id in [0, {}) or a list of them", limit);
    std::vector<int64_t> ids;
    auto add = [&](const json& item) {
      if (!item.is_number_integer()) return false;
      if (item.is_number_unsigned() ? item.get<uint64_t>() >= static_cast<uint64_t>(limit)
                                    : (item.get<int64_t>() < 0 || item.get<int64_t>() >= limit)) {
        return false;
      }
      ids.push_back(item.get<int64_t>());
      return true;
    };
    if (v->is_array()) {
      for (const json& item : *v) {
        if (!add(item)) return Error(key, kind, JsonSnippet(*v));
      }
    } else if (!add(*v)) {
      return Error(key, kind, JsonSnippet(*v));
    }
    *out = std::move(ids);
    return Status::Ok();
  }

  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  const std::string& source_;
  std::string prefix_;
};

constexpr std::array<std::string_view, 5> kRopeTypeNames = {"default", "linear", "dynamic",
                                                            "llama3", "yarn"};
constexpr std::array<std::string_view, 2> kScoringNames = {"softmax", "sigmoid"};
constexpr std::array<std::string_view, 3> kTopkNames = {"greedy", "group_limited_greedy",
                                                        "noaux_tc"};

// The enum value whose name (in `names`, in enum order) is `text`, or nullopt.
template <class E, size_t N>
std::optional<E> EnumByName(const std::array<std::string_view, N>& names, std::string_view text) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == text) return static_cast<E>(i);
  }
  return std::nullopt;
}

Status ParseRopeScaling(const Fields& top, ModelConfig* c) {
  const json* v = top.Get("rope_scaling");
  if (v == nullptr) return Status::Ok();
  if (!v->is_object()) return top.Error("rope_scaling", "null or an object", JsonSnippet(*v));
  Fields f(*v, top.source(), "rope_scaling.");
  RopeScaling& r = c->rope_scaling;
  // HF prefers "rope_type" and keeps "type" for older configs.
  const char* type_key = f.Has("rope_type") ? "rope_type" : "type";
  std::string type;
  DH_RETURN_IF_ERROR(f.String(type_key, &type, /*required=*/true));
  const auto parsed = EnumByName<RopeType>(kRopeTypeNames, type);
  if (!parsed) {
    return Unsupported(
        "{}: field 'rope_scaling.{}': unsupported '{}' (expected default, linear, dynamic, llama3 "
        "or yarn)",
        top.source(), type_key, type);
  }
  r.type = *parsed;
  const bool needs_factor = r.type != RopeType::kDefault;
  DH_RETURN_IF_ERROR(f.Number("factor", &r.factor, /*positive=*/true, needs_factor));
  DH_RETURN_IF_ERROR(f.Int("original_max_position_embeddings", &r.original_max_position_embeddings,
                           1, kMaxPositions, /*required=*/r.type == RopeType::kLlama3));
  DH_RETURN_IF_ERROR(f.Number("low_freq_factor", &r.low_freq_factor, true));
  DH_RETURN_IF_ERROR(f.Number("high_freq_factor", &r.high_freq_factor, true));
  DH_RETURN_IF_ERROR(f.Number("beta_fast", &r.beta_fast, true));
  DH_RETURN_IF_ERROR(f.Number("beta_slow", &r.beta_slow, true));
  DH_RETURN_IF_ERROR(f.Number("mscale", &r.mscale, false));
  DH_RETURN_IF_ERROR(f.Number("mscale_all_dim", &r.mscale_all_dim, false));
  DH_RETURN_IF_ERROR(f.OptionalNumber("attention_factor", &r.attention_factor, true));
  if (r.type == RopeType::kLlama3 && !(r.high_freq_factor > r.low_freq_factor)) {
    return f.Error("high_freq_factor",
                   fmt::format("a number above low_freq_factor {}", r.low_freq_factor),
                   fmt::format("{}", r.high_freq_factor));
  }
  return Status::Ok();
}

Status ParseQuantization(const Fields& top, QuantizationConfig* q) {
  const json* v = top.Get("quantization_config");
  if (v == nullptr) return Status::Ok();
  if (!v->is_object()) {
    return top.Error("quantization_config", "null or an object", JsonSnippet(*v));
  }
  Fields f(*v, top.source(), "quantization_config.");
  DH_RETURN_IF_ERROR(f.String("quant_method", &q->method, /*required=*/true));
  if (q->method == "fp8") {
    const json* bs = f.Get("weight_block_size");
    if (bs == nullptr) {
      return Unsupported(
          "{}: field 'quantization_config.weight_block_size': fp8 without block "
          "scales is not supported (expected [rows, cols])",
          top.source());
    }
    if (!bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() ||
        !(*bs)[1].is_number_integer() || (*bs)[0].get<int64_t>() <= 0 ||
        (*bs)[1].get<int64_t>() <= 0 || (*bs)[0].get<int64_t>() > 4096 ||
        (*bs)[1].get<int64_t>() > 4096) {
      return f.Error("weight_block_size", "[rows, cols] of positive integers up to 4096",
                     JsonSnippet(*bs));
    }
    q->block_rows = static_cast<int>((*bs)[0].get<int64_t>());
    q->block_cols = static_cast<int>((*bs)[1].get<int64_t>());
  } else if (q->method == "awq" || q->method == "gptq") {
    DH_RETURN_IF_ERROR(f.IntAsInt("bits", &q->bits, 2, 8, /*required=*/true));
    if (q->bits != 4) {
      return Unsupported(
          "{}: field 'quantization_config.bits': {}-bit {} is not supported (expected 4)",
          top.source(), q->bits, q->method);
    }
    // -1 means one group per row (GPTQ's per-channel quantization).
    DH_RETURN_IF_ERROR(f.IntAsInt("group_size", &q->group_size, -1, 1 << 20, true));
    if (q->group_size == 0) return f.Error("group_size", "-1 or a positive integer", "0");
    DH_RETURN_IF_ERROR(f.Bool("desc_act", &q->desc_act));
    DH_RETURN_IF_ERROR(f.Bool("zero_point", &q->zero_point));
    DH_RETURN_IF_ERROR(f.Bool("sym", &q->sym));
    if (q->method == "awq") {
      DH_RETURN_IF_ERROR(f.String("version", &q->version));
      for (char& ch : q->version) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (q->version != "gemm") {
        return Unsupported(
            "{}: field 'quantization_config.version': unsupported AWQ packing '{}' (expected "
            "gemm)",
            top.source(), q->version);
      }
      if (!q->zero_point) {
        return Unsupported(
            "{}: field 'quantization_config.zero_point': false (symmetric AWQ) is not supported "
            "(expected true)",
            top.source());
      }
    } else {
      DH_RETURN_IF_ERROR(f.String("checkpoint_format", &q->checkpoint_format));
      if (q->checkpoint_format != "gptq" && q->checkpoint_format != "gptq_v2") {
        return Unsupported(
            "{}: field 'quantization_config.checkpoint_format': unsupported '{}' (expected gptq "
            "or gptq_v2)",
            top.source(), q->checkpoint_format);
      }
      // GPTQModel's per-module overrides may change bits or group size per layer.
      const json* dyn = f.Get("dynamic");
      if (dyn != nullptr && !(dyn->is_object() && dyn->empty())) {
        return Unsupported(
            "{}: field 'quantization_config.dynamic': per-module overrides are not supported "
            "(got {})",
            top.source(), JsonSnippet(*dyn));
      }
    }
  } else {
    return Unsupported(
        "{}: field 'quantization_config.quant_method': unsupported '{}' (expected fp8, awq or "
        "gptq)",
        top.source(), q->method);
  }
  return Status::Ok();
}

Status ParseMoe(const Fields& f, ModelConfig* c) {
  DH_RETURN_IF_ERROR(f.OptionalInt("q_lora_rank", &c->q_lora_rank, 1, kMaxDim));
  DH_RETURN_IF_ERROR(f.Int("kv_lora_rank", &c->kv_lora_rank, 0, kMaxDim));
  DH_RETURN_IF_ERROR(f.Int("qk_nope_head_dim", &c->qk_nope_head_dim, 0, kMaxDim));
  DH_RETURN_IF_ERROR(f.Int("qk_rope_head_dim", &c->qk_rope_head_dim, 0, kMaxDim));
  DH_RETURN_IF_ERROR(f.Int("v_head_dim", &c->v_head_dim, 0, kMaxDim));
  DH_RETURN_IF_ERROR(f.Int("n_routed_experts", &c->n_routed_experts, 0, kMaxExperts));
  DH_RETURN_IF_ERROR(f.Int("n_shared_experts", &c->n_shared_experts, 0, kMaxExperts));
  DH_RETURN_IF_ERROR(f.Int("num_experts_per_tok", &c->num_experts_per_tok, 0, kMaxExperts));
  DH_RETURN_IF_ERROR(f.Int("moe_intermediate_size", &c->moe_intermediate_size, 0, kMaxDim));
  DH_RETURN_IF_ERROR(f.Int("first_k_dense_replace", &c->first_k_dense_replace, 0, kMaxLayers));
  DH_RETURN_IF_ERROR(f.Int("moe_layer_freq", &c->moe_layer_freq, 1, kMaxLayers));
  std::string scoring = "softmax", topk = "greedy";
  DH_RETURN_IF_ERROR(f.String("scoring_func", &scoring));
  DH_RETURN_IF_ERROR(f.String("topk_method", &topk));
  if (c->n_routed_experts > 0) {
    const auto s = EnumByName<MoeScoringFunc>(kScoringNames, scoring);
    if (!s) return f.Error("scoring_func", "softmax or sigmoid", scoring);
    const auto t = EnumByName<MoeTopkMethod>(kTopkNames, topk);
    if (!t) return f.Error("topk_method", "greedy, group_limited_greedy or noaux_tc", topk);
    c->scoring_func = *s;
    c->topk_method = *t;
  }
  DH_RETURN_IF_ERROR(f.Int("n_group", &c->n_group, 1, kMaxExperts));
  DH_RETURN_IF_ERROR(f.Int("topk_group", &c->topk_group, 1, kMaxExperts));
  DH_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &c->norm_topk_prob));
  DH_RETURN_IF_ERROR(f.Number("routed_scaling_factor", &c->routed_scaling_factor, true));
  DH_RETURN_IF_ERROR(f.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers, 0, 64));

  if (c->kv_lora_rank > 0) {  // MLA
    if (c->qk_rope_head_dim <= 0 || c->qk_rope_head_dim % 2 != 0) {
      return f.Error("qk_rope_head_dim", "a positive even integer with kv_lora_rank set",
                     fmt::format("{}", c->qk_rope_head_dim));
    }
    if (c->qk_nope_head_dim <= 0) {
      return f.Error("qk_nope_head_dim", "a positive integer with kv_lora_rank set",
                     fmt::format("{}", c->qk_nope_head_dim));
    }
    if (c->v_head_dim <= 0) {
      return f.Error("v_head_dim", "a positive integer with kv_lora_rank set",
                     fmt::format("{}", c->v_head_dim));
    }
  }
  if (c->n_routed_experts > 0) {
    if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->n_routed_experts) {
      return f.Error("num_experts_per_tok",
                     fmt::format("an integer in [1, n_routed_experts = {}]", c->n_routed_experts),
                     fmt::format("{}", c->num_experts_per_tok));
    }
    if (c->moe_intermediate_size <= 0) {
      return f.Error("moe_intermediate_size", "a positive integer for a MoE model",
                     fmt::format("{}", c->moe_intermediate_size));
    }
    if (c->n_routed_experts % c->n_group != 0) {
      return f.Error("n_group",
                     fmt::format("a divisor of n_routed_experts = {}", c->n_routed_experts),
                     fmt::format("{}", c->n_group));
    }
    if (c->topk_group > c->n_group) {
      return f.Error("topk_group", fmt::format("at most n_group = {}", c->n_group),
                     fmt::format("{}", c->topk_group));
    }
    if (c->first_k_dense_replace > c->num_hidden_layers) {
      return f.Error("first_k_dense_replace",
                     fmt::format("at most num_hidden_layers = {}", c->num_hidden_layers),
                     fmt::format("{}", c->first_k_dense_replace));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source) {
  DH_ASSIGN_OR_RETURN(json root, ParseJsonStrict(json_text, source));
  if (!root.is_object()) {
    return InvalidArgument("{}: expected a JSON object, got {}", source, JsonKind(root));
  }
  Fields f(root, source);
  ModelConfig c;

  const json* archs = f.Get("architectures");
  if (archs == nullptr) return f.Missing("architectures", "a non-empty list of strings");
  if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return f.Error("architectures", "a non-empty list of strings", JsonSnippet(*archs));
  }
  for (const json& a : *archs) {
    if (!a.is_string()) return f.Error("architectures", "a list of strings", JsonSnippet(*archs));
  }
  c.architecture = (*archs)[0].get<std::string>();
  DH_RETURN_IF_ERROR(f.String("model_type", &c.model_type));
  // Newer transformers write "dtype" instead of "torch_dtype".
  DH_RETURN_IF_ERROR(f.String(f.Has("torch_dtype") ? "torch_dtype" : "dtype", &c.torch_dtype));
  DH_RETURN_IF_ERROR(f.String("hidden_act", &c.hidden_act));

  DH_RETURN_IF_ERROR(f.Int("vocab_size", &c.vocab_size, 1, kMaxVocab, /*required=*/true));
  DH_RETURN_IF_ERROR(f.Int("hidden_size", &c.hidden_size, 1, kMaxDim, true));
  DH_RETURN_IF_ERROR(f.Int("num_hidden_layers", &c.num_hidden_layers, 1, kMaxLayers, true));
  DH_RETURN_IF_ERROR(f.Int("num_attention_heads", &c.num_attention_heads, 1, kMaxHeads, true));
  // MoE models (DeepSeek) use intermediate_size only for their first dense layers.
  DH_RETURN_IF_ERROR(f.Int("n_routed_experts", &c.n_routed_experts, 0, kMaxExperts));
  DH_RETURN_IF_ERROR(f.Int("intermediate_size", &c.intermediate_size, 1, kMaxDim,
                           /*required=*/c.n_routed_experts == 0));
  c.num_key_value_heads = c.num_attention_heads;
  DH_RETURN_IF_ERROR(f.Int("num_key_value_heads", &c.num_key_value_heads, 1, kMaxHeads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return f.Error("num_key_value_heads",
                   fmt::format("a divisor of num_attention_heads = {}", c.num_attention_heads),
                   fmt::format("{}", c.num_key_value_heads));
  }
  if (f.Has("head_dim")) {
    DH_RETURN_IF_ERROR(f.Int("head_dim", &c.head_dim, 1, kMaxDim));
  } else if (c.hidden_size % c.num_attention_heads != 0) {
    return f.Error(
        "num_attention_heads",
        fmt::format("a divisor of hidden_size = {} (or an explicit head_dim)", c.hidden_size),
        fmt::format("{}", c.num_attention_heads));
  } else {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  DH_RETURN_IF_ERROR(
      f.Int("max_position_embeddings", &c.max_position_embeddings, 1, kMaxPositions));
  DH_RETURN_IF_ERROR(f.Number("rms_norm_eps", &c.rms_norm_eps, /*positive=*/true));
  DH_RETURN_IF_ERROR(f.Number("rope_theta", &c.rope_theta, /*positive=*/true));
  DH_RETURN_IF_ERROR(ParseRopeScaling(f, &c));
  DH_RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  DH_RETURN_IF_ERROR(f.Bool("attention_bias", &c.attention_bias));
  DH_RETURN_IF_ERROR(f.Bool("mlp_bias", &c.mlp_bias));
  DH_RETURN_IF_ERROR(f.OptionalInt("bos_token_id", &c.bos_token_id, 0, c.vocab_size - 1));
  DH_RETURN_IF_ERROR(f.TokenIds("eos_token_id", &c.eos_token_ids, c.vocab_size));
  DH_RETURN_IF_ERROR(ParseMoe(f, &c));
  if (c.kv_lora_rank == 0 && c.head_dim % 2 != 0) {
    return f.Error("head_dim", "an even number (rotary embeddings rotate pairs)",
                   fmt::format("{}", c.head_dim));
  }
  DH_RETURN_IF_ERROR(ParseQuantization(f, &c.quantization));
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  DH_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  return ParseModelConfig(text, path);
}

Result<GenerationConfig> LoadGenerationConfig(const std::string& dir) {
  const std::string path = dir + "/generation_config.json";
  GenerationConfig g;
  auto text = ReadTextFile(path);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return g;
    return text.status();
  }
  DH_ASSIGN_OR_RETURN(json root, ParseJsonStrict(*text, path));
  if (!root.is_object()) {
    return InvalidArgument("{}: expected a JSON object, got {}", path, JsonKind(root));
  }
  Fields f(root, path);
  DH_RETURN_IF_ERROR(f.TokenIds("eos_token_id", &g.eos_token_ids, kMaxVocab));
  DH_RETURN_IF_ERROR(f.OptionalInt("bos_token_id", &g.bos_token_id, 0, kMaxVocab - 1));
  DH_RETURN_IF_ERROR(f.OptionalNumber("temperature", &g.temperature, /*positive=*/false));
  if (g.temperature && *g.temperature < 0) {
    return f.Error("temperature", "a non-negative number", fmt::format("{}", *g.temperature));
  }
  DH_RETURN_IF_ERROR(f.OptionalNumber("top_p", &g.top_p, /*positive=*/true));
  if (g.top_p && *g.top_p > 1) {
    return f.Error("top_p", "a number in (0, 1]", fmt::format("{}", *g.top_p));
  }
  DH_RETURN_IF_ERROR(f.OptionalInt("top_k", &g.top_k, 0, kMaxVocab));
  DH_RETURN_IF_ERROR(
      f.OptionalNumber("repetition_penalty", &g.repetition_penalty, /*positive=*/true));
  return g;
}

std::string_view RopeTypeName(RopeType t) { return kRopeTypeNames[static_cast<size_t>(t)]; }
std::string_view MoeScoringFuncName(MoeScoringFunc f) {
  return kScoringNames[static_cast<size_t>(f)];
}
std::string_view MoeTopkMethodName(MoeTopkMethod m) { return kTopkNames[static_cast<size_t>(m)]; }

}  // namespace dh
