// LlamaForCausalLM and Qwen2ForCausalLM (the DeepSeek-R1-Distill models): pre-norm decoder
// layers of GQA attention with rotate-half rope and a SwiGLU MLP. Qwen2 differs only in its
// q/k/v biases; Llama may have all four attention biases (attention_bias) and MLP biases.
#include "model/arch/architectures.h"
#include "model/layers/decoder.h"

namespace dh {
namespace {

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
  const int64_t kv_heads = c.num_key_value_heads, d = c.head_dim;
  const KvCacheSpec kv{static_cast<int>(c.num_hidden_layers), kv_heads, d, kv_heads, d,
                       DType::kF32};
  return Decoder::Load(
      c, w, b, kv, RopeSpec{static_cast<int>(c.head_dim), RopeStyle::kHalf},
      [&](WeightLoader& loader, int64_t, const std::string& p, DecoderLayer* layer) -> Status {
        DH_ASSIGN_OR_RETURN(GqaAttention attn,
                            GqaAttention::Load(loader, p + ".self_attn", c, qkv_bias, o_bias));
        DH_ASSIGN_OR_RETURN(Mlp mlp,
                            Mlp::Load(loader, p + ".mlp", c.hidden_size, c.intermediate_size));
        layer->attn = std::make_unique<GqaBlock>(std::move(attn));
        layer->ffn = std::make_unique<MlpBlock>(std::move(mlp));
        return Status::Ok();
      });
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
