// DeepSeek architectures: DeepseekV3ForCausalLM (V3, R1, V3.1), DeepseekV2ForCausalLM (V2,
// V2-Lite, V2.5, Coder-V2) and DeepseekForCausalLM (deepseek-moe-16b). V2/V3 use MLA attention
// (arXiv:2405.04434 §2.1): a compressed latent c_kv plus one shared rotary key per token is all
// the cache holds. Prefill decompresses it through kv_b_proj; decode absorbs kv_b_proj into the
// query and the output (§2.1.2) and attends over the latent directly. FFNs are dense for the
// first `first_k_dense_replace` layers, then MoE with shared experts. Every variant is config;
// see docs/reference/deepseek-semantics.md for the details that are easy to get wrong.
#include <cmath>

#include "model/arch/architectures.h"
#include "model/layers/attention.h"
#include "model/layers/moe.h"

namespace dh {
namespace {

constexpr float kLatentNormEps = 1e-6f;  // q_a_layernorm / kv_a_layernorm, all releases

struct MlaAttention {
  int64_t heads = 0, nope = 0, rope = 0, vdim = 0, kv_lora = 0;
  bool has_q_lora = false;
  bool naive_prefill = true, absorbed_decode = true;
  float softmax_scale = 1.0f;
  Linear q_a, q_b, q_proj, kv_a, kv_b, o;
  Tensor q_a_norm, kv_a_norm;
  std::vector<Weight> uk_t;  // per head [kv_lora, nope]: q_nope -> latent
  std::vector<Weight> uv;    // per head [vdim, kv_lora]: latent -> v

  static Result<MlaAttention> Load(WeightLoader& w, const std::string& p, const ModelConfig& c);
  Tensor Forward(Backend& b, Arena& a, const StepInputs& step, const RopeParams& rope,
                 Tensor cache, const Tensor& h) const;

 private:
  Tensor Naive(Backend& b, Arena& a, const StepInputs& step, const Tensor& cache,
               const Tensor& q3) const;
  Tensor Absorbed(Backend& b, Arena& a, const StepInputs& step, const Tensor& cache,
                  const Tensor& q3) const;
};

Result<MlaAttention> MlaAttention::Load(WeightLoader& w, const std::string& p,
                                        const ModelConfig& c) {
  MlaAttention m;
  m.heads = c.num_attention_heads;
  m.nope = c.qk_nope_head_dim;
  m.rope = c.qk_rope_head_dim;
  m.vdim = c.v_head_dim;
  m.kv_lora = c.kv_lora_rank;
  const int64_t H = c.hidden_size, qk = m.nope + m.rope;
  m.has_q_lora = c.q_lora_rank.has_value();
  if (m.has_q_lora) {
    const int64_t r = *c.q_lora_rank;
    DH_ASSIGN_OR_RETURN(m.q_a, Linear::Load(w, p + ".q_a_proj", r, H, c.attention_bias));
    DH_ASSIGN_OR_RETURN(m.q_a_norm, w.Vector(p + ".q_a_layernorm.weight", r));
    DH_ASSIGN_OR_RETURN(m.q_b, Linear::Load(w, p + ".q_b_proj", m.heads * qk, r, false));
  } else {
    DH_ASSIGN_OR_RETURN(m.q_proj, Linear::Load(w, p + ".q_proj", m.heads * qk, H, false));
  }
  DH_ASSIGN_OR_RETURN(m.kv_a, Linear::Load(w, p + ".kv_a_proj_with_mqa", m.kv_lora + m.rope, H,
                                           c.attention_bias));
  DH_ASSIGN_OR_RETURN(m.kv_a_norm, w.Vector(p + ".kv_a_layernorm.weight", m.kv_lora));
  const std::string kv_b_name = p + ".kv_b_proj.weight";
  DH_ASSIGN_OR_RETURN(m.kv_b, Linear::Load(w, p + ".kv_b_proj", m.heads * (m.nope + m.vdim),
                                           m.kv_lora, false));
  DH_ASSIGN_OR_RETURN(m.o, Linear::Load(w, p + ".o_proj", H, m.heads * m.vdim, c.attention_bias));

  // Absorbed copies of kv_b_proj, split per head: rows [h*(nope+v), +nope) are W_uk[h],
  // the next vdim rows W_uv[h]. Derived weights: a compile cache serves them without kv_b.
  std::vector<std::array<int64_t, 2>> shapes;
  for (int64_t h = 0; h < m.heads; ++h) {
    shapes.push_back({m.kv_lora, m.nope});  // uk_t[h]
    shapes.push_back({m.vdim, m.kv_lora});  // uv[h]
  }
  auto absorb = [&]() -> Result<std::vector<Weight>> {
    DType dtype;
    DH_ASSIGN_OR_RETURN(std::vector<float> kv_b,
                        w.HostMatrixF32(kv_b_name, m.heads * (m.nope + m.vdim), m.kv_lora, &dtype));
    std::vector<Weight> out;
    std::vector<float> tmp;
    for (int64_t h = 0; h < m.heads; ++h) {
      const float* base = kv_b.data() + h * (m.nope + m.vdim) * m.kv_lora;
      tmp.assign(static_cast<size_t>(m.kv_lora * m.nope), 0.0f);
      for (int64_t i = 0; i < m.nope; ++i) {
        for (int64_t j = 0; j < m.kv_lora; ++j) tmp[j * m.nope + i] = base[i * m.kv_lora + j];
      }
      DH_ASSIGN_OR_RETURN(Weight uk, w.MatrixFromHost(tmp, m.kv_lora, m.nope, dtype));
      out.push_back(uk);
      std::span<const float> v_rows(base + m.nope * m.kv_lora, m.vdim * m.kv_lora);
      DH_ASSIGN_OR_RETURN(Weight uv, w.MatrixFromHost(v_rows, m.vdim, m.kv_lora, dtype));
      out.push_back(uv);
    }
    return out;
  };
  DH_ASSIGN_OR_RETURN(std::vector<Weight> absorbed,
                      w.DerivedMatrices(p + ".kv_b_proj.absorbed", shapes, absorb));
  for (int64_t h = 0; h < m.heads; ++h) {
    m.uk_t.push_back(absorbed[2 * h]);
    m.uv.push_back(absorbed[2 * h + 1]);
  }
  // Softmax scale over the whole score, times YaRN's mscale^2 (DeepSeek's convention).
  m.softmax_scale = 1.0f / std::sqrt(static_cast<float>(qk));
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == "yarn" && rs.mscale_all_dim != 0.0) {
    const double ms = YarnMscale(rs.factor, rs.mscale_all_dim);
    m.softmax_scale = static_cast<float>(m.softmax_scale * ms * ms);
  }
  const std::string& mode = w.options().mla_mode;
  m.naive_prefill = mode != "absorbed";
  m.absorbed_decode = mode != "naive";
  return m;
}

Tensor MlaAttention::Forward(Backend& b, Arena& a, const StepInputs& step,
                             const RopeParams& rope_params, Tensor cache, const Tensor& h) const {
  const int64_t T = h.dim(0), qk = nope + rope;
  Tensor q;
  if (has_q_lora) {
    Tensor qa = q_a.Forward(b, a, h);                 // [T, q_lora]
    b.RmsNorm(qa, q_a_norm, kLatentNormEps, qa);
    q = q_b.Forward(b, a, qa);                        // [T, heads * qk]
  } else {
    q = q_proj.Forward(b, a, h);
  }
  Tensor q3 = q.Reshape({T, heads, qk});
  RopeParams rp = rope_params;
  rp.offset = static_cast<int>(nope);
  b.Rope(q3, step.positions, rp);

  // Latent entry per token: [normalised c_kv (kv_lora) | rotated k_pe (rope)].
  Tensor kva = kv_a.Forward(b, a, h);                 // [T, kv_lora + rope]
  Tensor c_kv = a.Alloc(DType::kF32, {T, kv_lora});
  b.Copy(kva.Narrow(1, 0, kv_lora), c_kv);
  b.RmsNorm(c_kv, kv_a_norm, kLatentNormEps, c_kv);
  b.Copy(c_kv, kva.Narrow(1, 0, kv_lora));
  Tensor latent = kva.Reshape({T, 1, kv_lora + rope});
  RopeParams kp = rope_params;
  kp.offset = static_cast<int>(kv_lora);
  b.Rope(latent, step.positions, kp);
  b.KvWrite(latent, Tensor(), cache, Tensor(), step.meta.slot_mapping);

  const bool decode = step.num_tokens == step.meta.num_seqs;
  const bool use_absorbed = decode ? absorbed_decode : !naive_prefill;
  Tensor out = use_absorbed ? Absorbed(b, a, step, cache, q3) : Naive(b, a, step, cache, q3);
  return o.Forward(b, a, out.Reshape({T, heads * vdim}));
}

// Decompresses every sequence's cached latents into per-head keys and values in a temporary
// paged buffer laid out like the cache, then runs ordinary attention over it.
Tensor MlaAttention::Naive(Backend& b, Arena& a, const StepInputs& step, const Tensor& cache,
                           const Tensor& q3) const {
  const AttentionMeta& m = step.meta;
  const int bs = m.block_size;
  std::vector<int32_t> rows, tables, starts{0};
  int max_blocks = 0;
  for (int s = 0; s < m.num_seqs; ++s) {
    max_blocks = std::max(max_blocks, (m.host_seq_lens[s] + bs - 1) / bs);
  }
  for (int s = 0; s < m.num_seqs; ++s) {
    const int len = m.host_seq_lens[s];
    const int blocks = (len + bs - 1) / bs;
    const int first_block = static_cast<int>(rows.size()) / bs;
    for (int i = 0; i < blocks * bs; ++i) {
      const int pos = std::min(i, len - 1);  // padding repeats a real row; never attended
      const int32_t block = m.host_block_tables[s * m.max_blocks_per_seq + pos / bs];
      rows.push_back(block * bs + pos % bs);
    }
    for (int j = 0; j < max_blocks; ++j) tables.push_back(j < blocks ? first_block + j : -1);
  }
  const int64_t N = static_cast<int64_t>(rows.size());
  Tensor gathered = a.Alloc(DType::kF32, {N, kv_lora + rope});
  b.GatherRows(cache.Reshape({cache.dim(0), kv_lora + rope}), a.Upload(rows), gathered);
  Tensor c_kv = a.Alloc(DType::kF32, {N, kv_lora});
  b.Copy(gathered.Narrow(1, 0, kv_lora), c_kv);
  Tensor kv = kv_b.Forward(b, a, c_kv).Reshape({N, heads, nope + vdim});
  Tensor k = a.Alloc(DType::kF32, {N, heads, nope + rope});
  b.Copy(kv.Narrow(2, 0, nope), k.Narrow(2, 0, nope));
  // [N, heads, rope] view of the rotary keys with a zero head stride: shared by every head.
  Tensor k_pe = gathered.Narrow(1, kv_lora, rope);
  k_pe.ndim = 3;
  k_pe.shape = {N, heads, rope, 0};
  k_pe.stride = {gathered.stride[0], 0, 1, 0};
  b.Copy(k_pe, k.Narrow(2, nope, rope));
  Tensor v = a.Alloc(DType::kF32, {N, heads, vdim});
  b.Copy(kv.Narrow(2, nope, vdim), v);

  AttentionMeta tmp = m;
  tmp.max_blocks_per_seq = max_blocks;
  tmp.block_tables = a.Upload(tables);
  tmp.host_block_tables = tables;
  Tensor out = a.Alloc(DType::kF32, {q3.dim(0), heads, vdim});
  b.Attention(q3, k, v, tmp, softmax_scale, out);
  return out;
}

// Attends over the latent cache directly: q_lat[h] = W_uk[h]^T q_nope[h]; the scores are
// q_lat·c_kv + q_pe·k_pe; the output o_lat[h] goes back through W_uv[h].
Tensor MlaAttention::Absorbed(Backend& b, Arena& a, const StepInputs& step, const Tensor& cache,
                              const Tensor& q3) const {
  const int64_t T = q3.dim(0);
  Tensor q_full = a.Alloc(DType::kF32, {T, heads, kv_lora + rope});
  Tensor q_nope = a.Alloc(DType::kF32, {T, nope});
  Tensor q_lat = a.Alloc(DType::kF32, {T, kv_lora});
  for (int64_t h = 0; h < heads; ++h) {
    b.Copy(q3.Narrow(1, h, 1).Narrow(2, 0, nope), q_nope.Reshape({T, 1, nope}));
    b.MatMul(q_nope, uk_t[h], Tensor(), q_lat);
    b.Copy(q_lat.Reshape({T, 1, kv_lora}), q_full.Narrow(1, h, 1).Narrow(2, 0, kv_lora));
  }
  b.Copy(q3.Narrow(2, nope, rope), q_full.Narrow(2, kv_lora, rope));
  Tensor o_lat = a.Alloc(DType::kF32, {T, heads, kv_lora});
  b.Attention(q_full, cache, cache.Narrow(2, 0, kv_lora), step.meta, softmax_scale, o_lat);
  Tensor out = a.Alloc(DType::kF32, {T, heads, vdim});
  Tensor o_h = a.Alloc(DType::kF32, {T, kv_lora});
  Tensor v_h = a.Alloc(DType::kF32, {T, vdim});
  for (int64_t h = 0; h < heads; ++h) {
    b.Copy(o_lat.Narrow(1, h, 1), o_h.Reshape({T, 1, kv_lora}));
    b.MatMul(o_h, uv[h], Tensor(), v_h);
    b.Copy(v_h.Reshape({T, 1, vdim}), out.Narrow(1, h, 1));
  }
  return out;
}

struct DeepseekLayer {
  Tensor input_norm, post_attention_norm;
  std::optional<MlaAttention> mla;
  std::optional<GqaAttention> gqa;  // DeepseekForCausalLM
  std::optional<Mlp> dense;
  std::optional<MoeFfn> moe;
};

class DeepseekDecoder final : public Model {
 public:
  DeepseekDecoder(const ModelConfig& c, Backend& b, bool mla)
      : config_(c), backend_(b), arena_(b), mla_(mla) {}

  Status Load(WeightLoader& w) {
    const ModelConfig& c = config_;
    DH_ASSIGN_OR_RETURN(embed_, w.Matrix("model.embed_tokens.weight", c.vocab_size, c.hidden_size));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = fmt::format("model.layers.{}", l);
      DeepseekLayer layer;
      DH_ASSIGN_OR_RETURN(layer.input_norm, w.Vector(p + ".input_layernorm.weight", c.hidden_size));
      DH_ASSIGN_OR_RETURN(layer.post_attention_norm,
                          w.Vector(p + ".post_attention_layernorm.weight", c.hidden_size));
      if (mla_) {
        DH_ASSIGN_OR_RETURN(layer.mla, MlaAttention::Load(w, p + ".self_attn", c));
      } else {
        DH_ASSIGN_OR_RETURN(layer.gqa, GqaAttention::Load(w, p + ".self_attn", c,
                                                          c.attention_bias, c.attention_bias));
      }
      const bool moe = c.n_routed_experts > 0 && l >= c.first_k_dense_replace &&
                       l % c.moe_layer_freq == 0;
      if (moe) {
        DH_ASSIGN_OR_RETURN(layer.moe, MoeFfn::Load(w, p + ".mlp", c));
      } else {
        DH_ASSIGN_OR_RETURN(layer.dense, Mlp::Load(w, p + ".mlp", c.hidden_size,
                                                   c.intermediate_size));
      }
      layers_.push_back(std::move(layer));
    }
    for (int64_t l = c.num_hidden_layers; l < c.num_hidden_layers + c.num_nextn_predict_layers;
         ++l) {
      w.Skip(fmt::format("model.layers.{}.", l));  // multi-token prediction, not the main model
    }
    DH_ASSIGN_OR_RETURN(norm_, w.Vector("model.norm.weight", c.hidden_size));
    if (c.tie_word_embeddings && !w.Has("lm_head.weight")) {
      lm_head_ = embed_;
    } else {
      DH_ASSIGN_OR_RETURN(lm_head_, w.Matrix("lm_head.weight", c.vocab_size, c.hidden_size));
    }
    if (mla_) {
      DH_ASSIGN_OR_RETURN(rope_, RotaryEmbedding::Create(backend_, c,
                                                         static_cast<int>(c.qk_rope_head_dim),
                                                         RopeStyle::kInterleaved, 0));
    } else {
      DH_ASSIGN_OR_RETURN(rope_, RotaryEmbedding::Create(backend_, c, static_cast<int>(c.head_dim),
                                                         RopeStyle::kHalf, 0));
    }
    DH_RETURN_IF_ERROR(w.Finish(&info_));
    info_.architecture = c.architecture;
    info_.kv_bytes_per_token = kv_spec().BytesPerToken();
    info_.active_weight_bytes_per_token = ActiveBytes();
    return Status::Ok();
  }

  const ModelConfig& config() const override { return config_; }
  const ModelInfo& info() const override { return info_; }
  KvCacheSpec kv_spec() const override {
    const int n = static_cast<int>(config_.num_hidden_layers);
    if (mla_) return {n, 1, config_.kv_lora_rank + config_.qk_rope_head_dim, 0, 0, DType::kF32};
    const int64_t kvh = config_.num_key_value_heads, d = config_.head_dim;
    return {n, kvh, d, kvh, d, DType::kF32};
  }

  Status Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) override {
    arena_.Reset();
    DH_ASSIGN_OR_RETURN(StepInputs step, PrepareStep(batch, kv, config_.vocab_size, arena_));
    const int64_t T = step.num_tokens, H = config_.hidden_size;
    const float eps = static_cast<float>(config_.rms_norm_eps);
    const RopeParams rope = rope_.ForStep(backend_, arena_, step.max_position);

    Tensor residual = arena_.Alloc(DType::kF32, {T, H});
    backend_.Embedding(embed_, step.token_ids, residual);
    Tensor h = arena_.Alloc(DType::kF32, {T, H});
    Tensor x;
    const size_t layer_mark = arena_.Mark();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const DeepseekLayer& layer = layers_[l];
      if (l == 0) {
        backend_.RmsNorm(residual, layer.input_norm, eps, h);
      } else {
        backend_.AddRmsNorm(residual, x, layer.input_norm, eps, h);
      }
      arena_.Rewind(layer_mark);  // the previous layer's activations are consumed
      x = layer.mla ? layer.mla->Forward(backend_, arena_, step, rope, kv.k(l), h)
                    : layer.gqa->Forward(backend_, arena_, step, rope, kv.k(l), kv.v(l), h);
      backend_.AddRmsNorm(residual, x, layer.post_attention_norm, eps, h);
      x = layer.moe ? layer.moe->Forward(backend_, arena_, h) : layer.dense->Forward(backend_, arena_, h);
    }
    return ComputeLogits(backend_, arena_, step, residual, x, norm_, eps, lm_head_, logits);
  }

 private:
  // Bytes a decode step reads: everything but the routed experts that are not chosen.
  uint64_t ActiveBytes() const {
    uint64_t inactive = 0;
    for (const auto& layer : layers_) {
      if (!layer.moe) continue;
      const auto& experts = layer.moe->experts;
      if (experts.empty()) continue;
      const uint64_t per_expert =
          experts[0].gate.nbytes() + experts[0].up.nbytes() + experts[0].down.nbytes();
      inactive += per_expert * (experts.size() - layer.moe->gate_params.top_k);
    }
    // The absorbed kv_b copies are read instead of kv_b itself at decode: count neither twice.
    return info_.weight_bytes > inactive ? info_.weight_bytes - inactive : 0;
  }

  ModelConfig config_;
  Backend& backend_;
  Arena arena_;
  bool mla_;
  ModelInfo info_;
  Weight embed_, lm_head_;
  Tensor norm_;
  std::vector<DeepseekLayer> layers_;
  RotaryEmbedding rope_;
};

Status ValidateDeepseek(const ModelConfig& c, bool mla) {
  auto positive = [](int64_t v, const char* field) -> Status {
    if (v <= 0) return InvalidArgument("config.json: field '{}': expected a positive integer, got {}", field, v);
    return Status::Ok();
  };
  if (mla) {
    DH_RETURN_IF_ERROR(positive(c.kv_lora_rank, "kv_lora_rank"));
    DH_RETURN_IF_ERROR(positive(c.qk_nope_head_dim, "qk_nope_head_dim"));
    DH_RETURN_IF_ERROR(positive(c.qk_rope_head_dim, "qk_rope_head_dim"));
    DH_RETURN_IF_ERROR(positive(c.v_head_dim, "v_head_dim"));
    if (c.qk_rope_head_dim % 2 != 0) {
      return InvalidArgument("config.json: field 'qk_rope_head_dim': expected an even number, got {}",
                             c.qk_rope_head_dim);
    }
    if (c.q_lora_rank && *c.q_lora_rank <= 0) {
      return InvalidArgument("config.json: field 'q_lora_rank': expected null or a positive integer");
    }
  }
  if (c.n_routed_experts > 0) {
    DH_RETURN_IF_ERROR(positive(c.moe_intermediate_size, "moe_intermediate_size"));
    DH_RETURN_IF_ERROR(positive(c.num_experts_per_tok, "num_experts_per_tok"));
    DH_RETURN_IF_ERROR(positive(c.moe_layer_freq, "moe_layer_freq"));
    if (c.num_experts_per_tok > c.n_routed_experts) {
      return InvalidArgument("config.json: num_experts_per_tok {} exceeds n_routed_experts {}",
                             c.num_experts_per_tok, c.n_routed_experts);
    }
  }
  if (c.first_k_dense_replace > 0 || c.n_routed_experts == 0) {
    DH_RETURN_IF_ERROR(positive(c.intermediate_size, "intermediate_size"));
  }
  return Status::Ok();
}

Result<std::unique_ptr<Model>> MakeDeepseekFamily(const ModelConfig& c, WeightLoader& w,
                                                  Backend& b, bool mla) {
  DH_RETURN_IF_ERROR(ValidateDeepseek(c, mla));
  DH_RETURN_IF_ERROR(ValidateMoeConfig(c));
  auto model = std::make_unique<DeepseekDecoder>(c, b, mla);
  DH_RETURN_IF_ERROR(model->Load(w));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace

Result<std::unique_ptr<Model>> MakeDeepseekV2V3(const ModelConfig& c, WeightLoader& w,
                                                Backend& b) {
  return MakeDeepseekFamily(c, w, b, /*mla=*/true);
}

Result<std::unique_ptr<Model>> MakeDeepseekMoe(const ModelConfig& c, WeightLoader& w, Backend& b) {
  return MakeDeepseekFamily(c, w, b, /*mla=*/false);
}

}  // namespace dh
