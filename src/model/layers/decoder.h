// The decoder skeleton every architecture here shares: token embedding, then per layer
// pre-norm -> attention -> residual -> pre-norm -> FFN -> residual, then the final norm and
// lm_head on the rows that need logits. An architecture supplies only its attention and FFN
// blocks (and its cache layout); a new dense architecture is a layer loader plus kv_spec().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/layers/attention.h"
#include "model/layers/common.h"
#include "model/layers/parallel.h"

namespace dh {

// The attention of one layer: reads h [T, hidden], writes its keys/values into layer `layer` of
// the cache and returns [T, hidden].
class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  virtual Tensor Forward(Backend& b, Arena& a, const StepInputs& step, const RopeParams& rope,
                         KvStorage& kv, int layer, const Tensor& h) const = 0;
  // The trace label of its ops ("attention.gqa"): the profiler's layer type (base/trace.h).
  virtual const char* trace_label() const { return "attention"; }
};

// The feed-forward part of one layer: [T, hidden] -> [T, hidden].
class FfnBlock {
 public:
  virtual ~FfnBlock() = default;
  virtual Tensor Forward(Backend& b, Arena& a, const Tensor& h) const = 0;
  // This block's weights a decode step does not read (MoE: the unchosen experts).
  struct Inactive {
    uint64_t bytes = 0;
    int64_t params = 0;
  };
  virtual Inactive InactivePerToken() const { return {}; }
  // The trace label of its ops ("ffn.mlp"), as AttentionBlock::trace_label.
  virtual const char* trace_label() const { return "ffn"; }
};

// GQA/MHA attention over a K and a V cache (Llama, Qwen2, DeepSeek-MoE).
class GqaBlock final : public AttentionBlock {
 public:
  explicit GqaBlock(GqaAttention attn) : attn_(std::move(attn)) {}
  Tensor Forward(Backend& b, Arena& a, const StepInputs& step, const RopeParams& rope,
                 KvStorage& kv, int layer, const Tensor& h) const override {
    return attn_.Forward(b, a, step, rope, kv.k(layer), kv.v(layer), h);
  }
  const char* trace_label() const override { return "attention.gqa"; }

 private:
  GqaAttention attn_;
};

// A dense SwiGLU MLP.
class MlpBlock final : public FfnBlock {
 public:
  explicit MlpBlock(Mlp mlp) : mlp_(std::move(mlp)) {}
  Tensor Forward(Backend& b, Arena& a, const Tensor& h) const override {
    return mlp_.Forward(b, a, h);
  }
  const char* trace_label() const override { return "ffn.mlp"; }

 private:
  Mlp mlp_;
};

struct DecoderLayer {
  Tensor input_norm, post_attention_norm;  // [hidden] f32
  std::unique_ptr<AttentionBlock> attn;
  std::unique_ptr<FfnBlock> ffn;
};

// Fills layer `index` (HF prefix "model.layers.<index>") with its attention and FFN blocks; the
// two norms are loaded by the skeleton.
using LayerBlocksLoader = std::function<Status(WeightLoader& w, int64_t index,
                                               const std::string& prefix, DecoderLayer* layer)>;

// DeepSeek-V3's multi-token-prediction layer (docs/mtp.md), stored at layer index
// num_hidden_layers: x = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)]), one decoder layer on x,
// then shared_head.norm and shared_head.head give the logits of t_{i+2}.
struct MtpLayer {
  Weight embed;  // its own embed_tokens, or the model's when the checkpoint shares it
  Tensor enorm, hnorm, head_norm;
  Linear eh_proj;  // [hidden, 2 * hidden]
  DecoderLayer block;
  Weight head;
};

struct RopeSpec {
  int dim = 0;  // rotated dims per head
  RopeStyle style = RopeStyle::kHalf;
};

class Decoder final : public Model {
 public:
  // Loads, in this order: the embedding, each layer (norms, then `load_blocks`), the final norm,
  // lm_head (tied to the embedding when the config says so and the checkpoint has none: the
  // table itself, or a copy in lm_head's format when the policy quantizes lm_head; with
  // tensor parallelism this rank's rows of the vocabulary, the logits gathered after), then
  // the rope tables; finishes the loader and fills info(). With tensor parallelism
  // (LoadOptions::parallel) the blocks load their slices and return partial sums, which Forward
  // all-reduces after each attention and each FFN; `kv_spec` is the whole model's and is cut
  // to this rank's kv heads here (a quantized cache's scales are per head, so they follow), and
  // its dtype is the load options' kv_cache_dtype. With LoadOptions::load_mtp and a config with
  // num_nextn_predict_layers > 0, the first MTP layer is loaded too (through `load_blocks` for
  // its decoder layer) and caches as layer num_hidden_layers.
  static Result<std::unique_ptr<Model>> Load(const ModelConfig& config, WeightLoader& w,
                                             Backend& backend, KvCacheSpec kv_spec,
                                             RopeSpec rope, const LayerBlocksLoader& load_blocks);

  const ModelConfig& config() const override { return config_; }
  KvCacheSpec kv_spec() const override { return kv_spec_; }
  const ModelInfo& info() const override { return info_; }
  Status Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) override;
  bool has_mtp() const override { return mtp_ != nullptr; }
  std::span<const float> last_hidden() const override { return last_hidden_; }
  Status ForwardMtp(const Batch& batch, KvStorage& kv, std::span<const float> hidden,
                    std::vector<float>* logits) override;

 private:
  Decoder(const ModelConfig& config, Backend& backend, KvCacheSpec kv_spec)
      : config_(config), backend_(backend), arena_(backend), kv_spec_(kv_spec) {}

  ModelConfig config_;
  Backend& backend_;
  Arena arena_;
  KvCacheSpec kv_spec_;
  ModelInfo info_;
  TensorParallel tp_;
  std::vector<float> comm_staging_;  // host buffer of the all-reduce
  std::vector<float> vocab_slice_;   // this rank's [rows, vocab slice] logits before the gather
  Weight embed_, lm_head_;
  Tensor norm_;
  std::vector<DecoderLayer> layers_;
  RotaryEmbedding rope_;
  std::unique_ptr<MtpLayer> mtp_;
  // With mtp_: the normed logits rows of the last Forward, or of the last ForwardMtp
  // (shared_head.norm's output), which speculative decoding chains into the next draft.
  std::vector<float> last_hidden_;
};

}  // namespace dh
