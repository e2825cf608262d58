// The shared decoder skeleton (decoder.h).
#include "model/layers/decoder.h"

#include <fmt/format.h>

namespace dh {

Result<std::unique_ptr<Model>> Decoder::Load(const ModelConfig& c, WeightLoader& w,
                                             Backend& backend, KvCacheSpec kv_spec,
                                             RopeSpec rope, const LayerBlocksLoader& load_blocks) {
  const TensorParallel tp = TensorParallel::From(w.options());
  if (tp.enabled()) {
    // Each rank caches the kv heads of its query heads (MLA's one latent head stays whole).
    DH_ASSIGN_OR_RETURN(PartRange k, tp.KvHeads(kv_spec.k_heads, c.num_attention_heads));
    kv_spec.k_heads = k.count;
    if (kv_spec.v_heads > 0) {
      DH_ASSIGN_OR_RETURN(PartRange v, tp.KvHeads(kv_spec.v_heads, c.num_attention_heads));
      kv_spec.v_heads = v.count;
    }
  }
  std::unique_ptr<Decoder> m(new Decoder(c, backend, kv_spec));
  m->tp_ = tp;
  DH_ASSIGN_OR_RETURN(m->embed_, w.Matrix("model.embed_tokens.weight", c.vocab_size,
                                          c.hidden_size));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}", l);
    DecoderLayer layer;
    DH_ASSIGN_OR_RETURN(layer.input_norm, w.Vector(p + ".input_layernorm.weight", c.hidden_size));
    DH_ASSIGN_OR_RETURN(layer.post_attention_norm,
                        w.Vector(p + ".post_attention_layernorm.weight", c.hidden_size));
    DH_RETURN_IF_ERROR(load_blocks(w, l, p, &layer));
    m->layers_.push_back(std::move(layer));
  }
  DH_ASSIGN_OR_RETURN(m->norm_, w.Vector("model.norm.weight", c.hidden_size));
  // With tensor parallelism each rank holds a slice of the vocabulary's rows (GatherLogits puts
  // the logits back together); a tied dense embedding is sliced in place.
  const PartRange vocab = tp.VocabRows(c.vocab_size, tp.rank);
  if (tp.enabled() && tp.VocabRows(c.vocab_size, tp.size - 1).count == 0) {
    return InvalidArgument("config.json: vocab_size {} leaves the last of --tp-size {} ranks no "
                           "lm_head rows", c.vocab_size, tp.size);
  }
  const bool tied = c.tie_word_embeddings && !w.Has("lm_head.weight");
  if (tied && (!tp.enabled() || m->embed_.format == WeightFormat::kDense)) {
    m->lm_head_ = m->embed_;
    if (tp.enabled()) {
      m->lm_head_.data = m->embed_.data.Slice0(vocab.first, vocab.count);
      m->lm_head_.rows = vocab.count;
    }
  } else if (!tp.enabled()) {
    DH_ASSIGN_OR_RETURN(m->lm_head_, w.Matrix("lm_head.weight", c.vocab_size, c.hidden_size));
  } else {
    DH_ASSIGN_OR_RETURN(m->lm_head_,
                        w.MatrixPart(tied ? "model.embed_tokens.weight" : "lm_head.weight",
                                     c.vocab_size, c.hidden_size,
                                     TensorParallel::Rows(vocab, 1, c.vocab_size)));
  }
  // The rope keeps a pointer to the config it was made from: the model's own copy.
  DH_ASSIGN_OR_RETURN(m->rope_,
                      RotaryEmbedding::Create(backend, m->config_, rope.dim, rope.style, 0));
  DH_RETURN_IF_ERROR(w.Finish(&m->info_));
  m->info_.architecture = c.architecture;
  m->info_.kv_bytes_per_token = kv_spec.BytesPerToken();
  // Bytes a decode step reads: everything but the routed experts that are not chosen.
  uint64_t inactive = 0;
  for (const DecoderLayer& layer : m->layers_) inactive += layer.ffn->InactiveBytesPerToken();
  m->info_.active_weight_bytes_per_token =
      m->info_.weight_bytes > inactive ? m->info_.weight_bytes - inactive : 0;
  return std::unique_ptr<Model>(std::move(m));
}

Status Decoder::Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) {
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
    const DecoderLayer& layer = layers_[l];
    if (l == 0) {
      backend_.RmsNorm(residual, layer.input_norm, eps, h);
    } else {
      backend_.AddRmsNorm(residual, x, layer.input_norm, eps, h);
    }
    arena_.Rewind(layer_mark);  // the previous layer's activations are consumed
    x = layer.attn->Forward(backend_, arena_, step, rope, kv, static_cast<int>(l), h);
    DH_RETURN_IF_ERROR(tp_.AllReduce(backend_, x, &comm_staging_));
    backend_.AddRmsNorm(residual, x, layer.post_attention_norm, eps, h);
    x = layer.ffn->Forward(backend_, arena_, h);
    DH_RETURN_IF_ERROR(tp_.AllReduce(backend_, x, &comm_staging_));
  }
  if (!tp_.enabled()) {
    return ComputeLogits(backend_, arena_, step, residual, x, norm_, eps, lm_head_, logits);
  }
  DH_RETURN_IF_ERROR(
      ComputeLogits(backend_, arena_, step, residual, x, norm_, eps, lm_head_, &vocab_slice_));
  return tp_.GatherLogits(vocab_slice_, static_cast<int64_t>(batch.logits_rows.size()),
                          config_.vocab_size, batch.logits_on_rank0_only, logits);
}

}  // namespace dh
