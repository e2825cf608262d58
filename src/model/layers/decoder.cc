// The shared decoder skeleton (decoder.h).
#include "model/layers/decoder.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "base/trace.h"
#include "model/tap.h"

namespace dh {

Result<std::unique_ptr<Model>> Decoder::Load(const ModelConfig& c, WeightLoader& w,
                                             Backend& backend, KvCacheSpec kv_spec,
                                             RopeSpec rope, const LayerBlocksLoader& load_blocks) {
  kv_spec.dtype = w.options().kv_cache_dtype;
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
  const bool mtp = w.options().load_mtp && c.num_nextn_predict_layers > 0;
  if (mtp) ++kv_spec.num_layers;  // the MTP layer's cache comes last
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
  // A tied dense table whose lm_head the policy quantizes: the embedding keeps its dense rows
  // for the lookups and lm_head gets a quantized copy (of this rank's rows), the table a decode
  // step reads whole.
  const bool quantized_copy =
      tied && m->embed_.format == WeightFormat::kDense &&
      w.plan().policy.FormatFor("lm_head.weight").kind == PrecisionFormat::Kind::kQuant;
  bool head_is_table = false;
  if (quantized_copy) {
    const int64_t H = c.hidden_size;
    const std::array<int64_t, 2> shape = {vocab.count, H};
    DH_ASSIGN_OR_RETURN(
        std::vector<Weight> head,
        w.DerivedMatrices("lm_head.weight", {&shape, 1}, [&]() -> Result<std::vector<Weight>> {
          DType stored;
          DH_ASSIGN_OR_RETURN(std::vector<float> table,
                              w.HostMatrixF32("model.embed_tokens.weight", c.vocab_size, H,
                                              &stored));
          const std::span<const float> rows(table.data() + vocab.first * H,
                                            static_cast<size_t>(vocab.count * H));
          DH_ASSIGN_OR_RETURN(Weight q,
                              w.QuantizedFromHost(rows, vocab.count, H, "lm_head.weight"));
          return std::vector<Weight>{q};
        }));
    m->lm_head_ = head[0];
  } else if (tied && (!tp.enabled() || m->embed_.format == WeightFormat::kDense)) {
    head_is_table = true;
    m->lm_head_ = m->embed_;
    if (tp.enabled()) {
      m->lm_head_.data = m->embed_.data.Slice0(vocab.first, vocab.count);
      m->lm_head_.rows = vocab.count;
      m->lm_head_.packed = Tensor();  // a backend's copy holds every row
    }
  } else if (!tp.enabled()) {
    DH_ASSIGN_OR_RETURN(m->lm_head_, w.Matrix("lm_head.weight", c.vocab_size, c.hidden_size));
  } else {
    DH_ASSIGN_OR_RETURN(m->lm_head_,
                        w.MatrixPart(tied ? "model.embed_tokens.weight" : "lm_head.weight",
                                     c.vocab_size, c.hidden_size,
                                     TensorParallel::Rows(vocab, 1, c.vocab_size)));
  }
  if (mtp) {
    const std::string p = fmt::format("model.layers.{}", c.num_hidden_layers);
    const int64_t H = c.hidden_size;
    auto layer = std::make_unique<MtpLayer>();
    if (w.Has(p + ".embed_tokens.weight")) {
      DH_ASSIGN_OR_RETURN(layer->embed, w.Matrix(p + ".embed_tokens.weight", c.vocab_size, H));
    } else {
      layer->embed = m->embed_;
    }
    DH_ASSIGN_OR_RETURN(layer->enorm, w.Vector(p + ".enorm.weight", H));
    DH_ASSIGN_OR_RETURN(layer->hnorm, w.Vector(p + ".hnorm.weight", H));
    DH_ASSIGN_OR_RETURN(layer->eh_proj, Linear::Load(w, p + ".eh_proj", H, 2 * H, false));
    DH_ASSIGN_OR_RETURN(layer->block.input_norm, w.Vector(p + ".input_layernorm.weight", H));
    DH_ASSIGN_OR_RETURN(layer->block.post_attention_norm,
                        w.Vector(p + ".post_attention_layernorm.weight", H));
    DH_RETURN_IF_ERROR(load_blocks(w, c.num_hidden_layers, p, &layer->block));
    DH_ASSIGN_OR_RETURN(layer->head_norm, w.Vector(p + ".shared_head.norm.weight", H));
    DH_ASSIGN_OR_RETURN(layer->head, w.Matrix(p + ".shared_head.head.weight", c.vocab_size, H));
    m->mtp_ = std::move(layer);
  }
  // The rope keeps a pointer to the config it was made from: the model's own copy.
  DH_ASSIGN_OR_RETURN(m->rope_,
                      RotaryEmbedding::Create(backend, m->config_, rope.dim, rope.style, 0));
  DH_RETURN_IF_ERROR(w.Finish(&m->info_));
  m->info_.architecture = c.architecture;
  m->info_.kv_bytes_per_token = kv_spec.BytesPerToken();
  // What a decode step reads: every weight but the routed experts a token does not choose and
  // the embedding table, of which it reads its tokens' rows only (unless lm_head is the table).
  FfnBlock::Inactive inactive;
  for (const DecoderLayer& layer : m->layers_) {
    const FfnBlock::Inactive i = layer.ffn->InactivePerToken();
    inactive.bytes += i.bytes;
    inactive.params += i.params;
  }
  if (!head_is_table) inactive.bytes += m->embed_.nbytes();
  // A tied table's parameters are lm_head's (a quantized copy adds bytes, not parameters).
  if (!tied) inactive.params += m->embed_.rows * m->embed_.cols;
  ModelInfo& info = m->info_;
  info.active_weight_bytes_per_token =
      info.weight_bytes > inactive.bytes ? info.weight_bytes - inactive.bytes : 0;
  info.active_parameters_per_token = std::max<int64_t>(0, info.num_parameters - inactive.params);
  return std::unique_ptr<Model>(std::move(m));
}

Status Decoder::Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) {
  TapStepBegins();
  TraceSpan forward_span("forward");
  if (forward_span.active()) {
    forward_span.SetArgs(fmt::format("{}, {}", JsonArg("tokens", batch.num_tokens()),
                                     JsonArg("sequences", batch.num_seqs())));
  }
  arena_.Reset();
  DH_ASSIGN_OR_RETURN(StepInputs step, PrepareStep(batch, kv, config_.vocab_size, arena_));
  const int64_t T = step.num_tokens, H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const RopeParams rope = rope_.ForStep(backend_, arena_, step.max_position);

  Tensor residual = arena_.Alloc(DType::kF32, {T, H});  // [T, H]
  {
    TraceSpan span("embedding");
    backend_.Embedding(embed_, step.token_ids, residual);
  }
  Tap(backend_, "model.embed_tokens", residual);
  Tensor h = arena_.Alloc(DType::kF32, {T, H});
  Tensor x;  // output of the previous sub-block, added to the residual by the next norm
  const size_t layer_mark = arena_.Mark();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DecoderLayer& layer = layers_[l];
    TraceSpan layer_span("layer");
    if (layer_span.active()) layer_span.SetName(fmt::format("model.layers.{}", l));
    if (l == 0) {
      backend_.RmsNorm(residual, layer.input_norm, eps, h);
    } else {
      backend_.AddRmsNorm(residual, x, layer.input_norm, eps, h);
    }
    TapLayer(backend_, l, "input_layernorm", h);
    arena_.Rewind(layer_mark);  // the previous layer's activations are consumed
    {
      TraceSpan span(layer.attn->trace_label());
      x = layer.attn->Forward(backend_, arena_, step, rope, kv, static_cast<int>(l), h);
      DH_RETURN_IF_ERROR(tp_.AllReduce(backend_, x, &comm_staging_));
    }
    TapLayer(backend_, l, "self_attn", x);
    backend_.AddRmsNorm(residual, x, layer.post_attention_norm, eps, h);
    TapLayer(backend_, l, "post_attention_layernorm", h);
    {
      TraceSpan span(layer.ffn->trace_label());
      x = layer.ffn->Forward(backend_, arena_, h);
      DH_RETURN_IF_ERROR(tp_.AllReduce(backend_, x, &comm_staging_));
    }
    TapLayer(backend_, l, "mlp", x);
  }
  TraceSpan span("head");
  std::vector<float>* hidden_out = mtp_ ? &last_hidden_ : nullptr;
  if (!tp_.enabled()) {
    return ComputeLogits(backend_, arena_, step, residual, x, norm_, eps, lm_head_, logits,
                         hidden_out);
  }
  DH_RETURN_IF_ERROR(ComputeLogits(backend_, arena_, step, residual, x, norm_, eps, lm_head_,
                                   &vocab_slice_, hidden_out, /*tap_logits=*/false));
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  DH_RETURN_IF_ERROR(tp_.GatherLogits(vocab_slice_, rows, config_.vocab_size,
                                      batch.logits_on_rank0_only, logits));
  if (ActiveTapSink() != nullptr && !logits->empty()) {  // the gathered logits, on the host
    Tap(backend_, "logits",
        Tensor::FromDims(logits->data(), DType::kF32, std::vector<int64_t>{rows, config_.vocab_size}));
  }
  return Status::Ok();
}

Status Decoder::ForwardMtp(const Batch& batch, KvStorage& kv, std::span<const float> hidden,
                           std::vector<float>* logits) {
  if (!mtp_) return Unsupported("this model has no multi-token-prediction layer loaded");
  arena_.Reset();
  DH_ASSIGN_OR_RETURN(StepInputs step, PrepareStep(batch, kv, config_.vocab_size, arena_));
  const int64_t T = step.num_tokens, H = config_.hidden_size;
  if (hidden.size() != static_cast<size_t>(T * H)) {
    return InvalidArgument("MTP step: {} hidden values for {} tokens of hidden size {}",
                           hidden.size(), T, H);
  }
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const RopeParams rope = rope_.ForStep(backend_, arena_, step.max_position);
  const MtpLayer& mtp = *mtp_;
  // [T, 2H] = [enorm(embed(t_{i+1})) | hnorm(h_i)]: the embedding first, as eh_proj was trained
  // (docs/mtp.md on the order).
  Tensor cat = arena_.Alloc(DType::kF32, {T, 2 * H});
  Tensor e = arena_.Alloc(DType::kF32, {T, H});
  backend_.Embedding(mtp.embed, step.token_ids, e);
  backend_.RmsNorm(e, mtp.enorm, eps, cat.Narrow(1, 0, H));
  Tensor h_prev = arena_.Alloc(DType::kF32, {T, H});
  backend_.CopyToDevice(h_prev, hidden.data());
  backend_.RmsNorm(h_prev, mtp.hnorm, eps, cat.Narrow(1, H, H));
  Tensor residual = mtp.eh_proj.Forward(backend_, arena_, cat);  // [T, H]
  Tensor h = arena_.Alloc(DType::kF32, {T, H});
  backend_.RmsNorm(residual, mtp.block.input_norm, eps, h);
  Tensor x = mtp.block.attn->Forward(backend_, arena_, step, rope, kv,
                                     static_cast<int>(config_.num_hidden_layers), h);
  DH_RETURN_IF_ERROR(tp_.AllReduce(backend_, x, &comm_staging_));
  backend_.AddRmsNorm(residual, x, mtp.block.post_attention_norm, eps, h);
  x = mtp.block.ffn->Forward(backend_, arena_, h);
  DH_RETURN_IF_ERROR(tp_.AllReduce(backend_, x, &comm_staging_));
  // shared_head.norm(residual + x) -> shared_head.head
  // last_hidden_ then holds shared_head.norm's rows: the next chained draft's h (docs/mtp.md).
  return ComputeLogits(backend_, arena_, step, residual, x, mtp.head_norm, eps, mtp.head, logits,
                       &last_hidden_);
}

}  // namespace dh
