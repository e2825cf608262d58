// LlamaForCausalLM and Qwen2ForCausalLM (the DeepSeek-R1-Distill models): pre-norm decoder
// layers of GQA attention with rotate-half rope and a SwiGLU MLP. Qwen2 differs only in its
// q/k/v biases; Llama may have all four attention biases (attention_bias) and MLP biases.
#include "model/arch/architectures.h"
#include "model/layers/attention.h"

namespace dh {
namespace {

struct DenseLayer {
  Tensor input_norm, post_attention_norm;  // [hidden] f32
  GqaAttention attn;
  Mlp mlp;
};

class DenseDecoder final : public Model {
 public:
  DenseDecoder(const ModelConfig& config, Backend& backend) : config_(config), backend_(backend),
                                                              arena_(backend) {}

  Status Load(WeightLoader& w, bool qkv_bias, bool o_bias) {
    const ModelConfig& c = config_;
    DH_ASSIGN_OR_RETURN(embed_, w.Matrix("model.embed_tokens.weight", c.vocab_size, c.hidden_size));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = fmt::format("model.layers.{}", l);
      DenseLayer layer;
      DH_ASSIGN_OR_RETURN(layer.input_norm, w.Vector(p + ".input_layernorm.weight", c.hidden_size));
      DH_ASSIGN_OR_RETURN(layer.post_attention_norm,
                          w.Vector(p + ".post_attention_layernorm.weight", c.hidden_size));
      DH_ASSIGN_OR_RETURN(layer.attn, GqaAttention::Load(w, p + ".self_attn", c, qkv_bias, o_bias));
      DH_ASSIGN_OR_RETURN(layer.mlp, Mlp::Load(w, p + ".mlp", c.hidden_size, c.intermediate_size));
      layers_.push_back(std::move(layer));
    }
    DH_ASSIGN_OR_RETURN(norm_, w.Vector("model.norm.weight", c.hidden_size));
    if (c.tie_word_embeddings && !w.Has("lm_head.weight")) {
      lm_head_ = embed_;
    } else {
      DH_ASSIGN_OR_RETURN(lm_head_, w.Matrix("lm_head.weight", c.vocab_size, c.hidden_size));
    }
    DH_ASSIGN_OR_RETURN(rope_, RotaryEmbedding::Create(backend_, c, static_cast<int>(c.head_dim),
                                                       RopeStyle::kHalf, 0));
    DH_RETURN_IF_ERROR(w.Finish(&info_));
    info_.architecture = c.architecture;
    info_.kv_bytes_per_token = kv_spec().BytesPerToken();
    info_.active_weight_bytes_per_token = info_.weight_bytes;
    return Status::Ok();
  }

  const ModelConfig& config() const override { return config_; }
  const ModelInfo& info() const override { return info_; }
  KvCacheSpec kv_spec() const override {
    const int64_t kv_heads = config_.num_key_value_heads, d = config_.head_dim;
    return {static_cast<int>(config_.num_hidden_layers), kv_heads, d, kv_heads, d, DType::kF32};
  }

  Status Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) override {
    arena_.Reset();
    DH_ASSIGN_OR_RETURN(StepInputs step, PrepareStep(batch, kv, config_.vocab_size, arena_));
    const int64_t T = step.num_tokens, H = config_.hidden_size;
    const float eps = static_cast<float>(config_.rms_norm_eps);
    const RopeParams rope = rope_.ForStep(backend_, arena_, step.max_position);

    Tensor residual = arena_.Alloc(DType::kF32, {T, H});  // [T, H]
    backend_.Embedding(embed_, step.token_ids, residual);
    Tensor h = arena_.Alloc(DType::kF32, {T, H});
    Tensor x;  // output of the previous sub-block, added to the residual by the next norm
    const size_t layer_mark = arena_.Mark();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const DenseLayer& layer = layers_[l];
      if (l == 0) {
        backend_.RmsNorm(residual, layer.input_norm, eps, h);
      } else {
        backend_.AddRmsNorm(residual, x, layer.input_norm, eps, h);
      }
      arena_.Rewind(layer_mark);  // the previous layer's activations are consumed
      x = layer.attn.Forward(backend_, arena_, step, rope, kv.k(l), kv.v(l), h);
      backend_.AddRmsNorm(residual, x, layer.post_attention_norm, eps, h);
      x = layer.mlp.Forward(backend_, arena_, h);
    }
    return ComputeLogits(backend_, arena_, step, residual, x, norm_, eps, lm_head_, logits);
  }

 private:
  ModelConfig config_;
  Backend& backend_;
  Arena arena_;
  ModelInfo info_;
  Weight embed_, lm_head_;
  Tensor norm_;
  std::vector<DenseLayer> layers_;
  RotaryEmbedding rope_;
};

Status ValidateDense(const ModelConfig& c) {
  if (c.intermediate_size <= 0) {
    return InvalidArgument("config.json: field 'intermediate_size': expected a positive integer");
  }
  if (c.head_dim % 2 != 0) {
    return InvalidArgument("config.json: head_dim {} must be even for rotary embeddings",
                           c.head_dim);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Model>> MakeDense(const ModelConfig& c, WeightLoader& w, Backend& b,
                                         bool qkv_bias, bool o_bias) {
  DH_RETURN_IF_ERROR(ValidateDense(c));
  auto model = std::make_unique<DenseDecoder>(c, b);
  DH_RETURN_IF_ERROR(model->Load(w, qkv_bias, o_bias));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace

Result<std::unique_ptr<Model>> MakeLlama(const ModelConfig& c, WeightLoader& w, Backend& b) {
  if (c.mlp_bias) return Unsupported("config.json: mlp_bias true is not supported");
  return MakeDense(c, w, b, c.attention_bias, c.attention_bias);
}

Result<std::unique_ptr<Model>> MakeQwen2(const ModelConfig& c, WeightLoader& w, Backend& b) {
  return MakeDense(c, w, b, /*qkv_bias=*/true, /*o_bias=*/false);
}

}  // namespace dh
