// DeepSeek architectures: DeepseekV3ForCausalLM (V3, R1, V3.1), DeepseekV2ForCausalLM (V2,
// V2-Lite, V2.5, Coder-V2) and DeepseekForCausalLM (deepseek-moe-16b). V2/V3 use MLA attention
// (arXiv:2405.04434 §2.1): a compressed latent c_kv plus one shared rotary key per token is all
// the cache holds. Prefill decompresses it through kv_b_proj; decode (and speculative decoding's
// short verification chunks) absorbs kv_b_proj into the query and the output (§2.1.2) and attends
// over the latent directly. FFNs are dense for the
// first `first_k_dense_replace` layers, then MoE with shared experts. Every variant is config;
// see docs/reference/deepseek-semantics.md for the details that are easy to get wrong.
#include <algorithm>
#include <cmath>

#include "model/arch/architectures.h"
#include "model/layers/attention.h"
#include "model/layers/decoder.h"
#include "model/layers/moe.h"
#include "model/layers/parallel.h"
#include "model/tap.h"

namespace dh {
namespace {

constexpr float kLatentNormEps = 1e-6f;  // q_a_layernorm / kv_a_layernorm, all releases

// Whether a step is decode-like for MLA: every sequence adds at most a few tokens (one when
// decoding; speculative decoding's K + 1 verification rows) to a cache that already holds
// context. Such steps attend over the latent cache directly (absorbed); the naive path first
// decompresses every cached position through kv_b_proj, which pays off only for long query
// chunks (prefill) and would cost a verification step as much as re-reading the whole context.
bool DecodeLike(const AttentionMeta& m) {
  constexpr int kShortChunk = 9;  // 1 + the largest --num-speculative-tokens
  if (m.num_tokens == m.num_seqs) return true;
  if (m.host_query_start.size() < static_cast<size_t>(m.num_seqs) + 1 ||
      m.host_seq_lens.size() < static_cast<size_t>(m.num_seqs)) {
    return false;
  }
  for (int s = 0; s < m.num_seqs; ++s) {
    const int q = m.host_query_start[s + 1] - m.host_query_start[s];
    if (q > kShortChunk || m.host_seq_lens[s] <= q) return false;  // seq_lens count the new ones
  }
  return true;
}

struct MlaAttention {
  int64_t heads = 0, nope = 0, rope = 0, vdim = 0, kv_lora = 0;
  bool has_q_lora = false;
  bool naive_prefill = true, absorbed_decode = true;
  float softmax_scale = 1.0f;
  Linear q_a, q_b, q_proj, kv_a, kv_b, o;
  Tensor q_a_norm, kv_a_norm;
  std::vector<Weight> uk_t;  // per head [kv_lora, nope]: q_nope -> latent
  std::vector<Weight> uv;    // per head [vdim, kv_lora]: latent -> v
  std::string q_a_norm_tap, kv_a_norm_tap;  // "<prefix>.q_a_layernorm", "<prefix>.kv_a_layernorm"
  // After the rotary embedding (HF's forward variables; no module holds them): the query
  // [T, heads, nope + rope] ("<prefix>.query_states", empty when this rank holds a slice of the
  // heads) and the shared rotary key [T, rope] ("<prefix>.k_pe").
  std::string q_rope_tap, k_pe_tap;

  static Result<MlaAttention> Load(WeightLoader& w, const std::string& p, const ModelConfig& c);
  Tensor Forward(Backend& b, Arena& a, const StepInputs& step, const RopeParams& rope,
                 const KvCacheView& cache, const Tensor& h) const;

 private:
  Tensor Naive(Backend& b, Arena& a, const StepInputs& step, const KvCacheView& cache,
               const Tensor& q3) const;
  Tensor Absorbed(Backend& b, Arena& a, const StepInputs& step, const KvCacheView& cache,
                  const Tensor& q3) const;
};

Result<MlaAttention> MlaAttention::Load(WeightLoader& w, const std::string& p,
                                        const ModelConfig& c) {
  MlaAttention m;
  // Tensor parallelism: this rank's heads of q_b/q_proj, kv_b and o_proj; the latent
  // projections (q_a, kv_a) and the cache stay whole on every rank.
  const int64_t all_heads = c.num_attention_heads;
  DH_ASSIGN_OR_RETURN(const PartRange hp,
                      TensorParallel::From(w.options()).Split(all_heads, "num_attention_heads"));
  m.heads = hp.count;
  m.nope = c.qk_nope_head_dim;
  m.rope = c.qk_rope_head_dim;
  m.vdim = c.v_head_dim;
  m.kv_lora = c.kv_lora_rank;
  const int64_t H = c.hidden_size, qk = m.nope + m.rope;
  m.has_q_lora = c.q_lora_rank.has_value();
  m.q_a_norm_tap = p + ".q_a_layernorm";
  m.kv_a_norm_tap = p + ".kv_a_layernorm";
  if (hp.count == all_heads) m.q_rope_tap = p + ".query_states";
  m.k_pe_tap = p + ".k_pe";
  if (m.has_q_lora) {
    const int64_t r = *c.q_lora_rank;
    DH_ASSIGN_OR_RETURN(m.q_a, Linear::Load(w, p + ".q_a_proj", r, H, c.attention_bias));
    DH_ASSIGN_OR_RETURN(m.q_a_norm, w.Vector(p + ".q_a_layernorm.weight", r));
    DH_ASSIGN_OR_RETURN(m.q_b, Linear::Load(w, p + ".q_b_proj", all_heads * qk, r, false,
                                            TensorParallel::Rows(hp, qk, all_heads)));
  } else {
    DH_ASSIGN_OR_RETURN(m.q_proj, Linear::Load(w, p + ".q_proj", all_heads * qk, H, false,
                                               TensorParallel::Rows(hp, qk, all_heads)));
  }
  DH_ASSIGN_OR_RETURN(m.kv_a, Linear::Load(w, p + ".kv_a_proj_with_mqa", m.kv_lora + m.rope, H,
                                           c.attention_bias));
  DH_ASSIGN_OR_RETURN(m.kv_a_norm, w.Vector(p + ".kv_a_layernorm.weight", m.kv_lora));
  const std::string kv_b_name = p + ".kv_b_proj.weight";
  DH_ASSIGN_OR_RETURN(m.kv_b, Linear::Load(w, p + ".kv_b_proj", all_heads * (m.nope + m.vdim),
                                           m.kv_lora, false,
                                           TensorParallel::Rows(hp, m.nope + m.vdim, all_heads)));
  DH_ASSIGN_OR_RETURN(m.o, Linear::Load(w, p + ".o_proj", H, all_heads * m.vdim, c.attention_bias,
                                        TensorParallel::Cols(hp, m.vdim, all_heads)));

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
                        w.HostMatrixF32(kv_b_name, all_heads * (m.nope + m.vdim), m.kv_lora, &dtype));
    std::vector<Weight> out;
    std::vector<float> tmp;
    for (int64_t h = 0; h < m.heads; ++h) {
      const float* base = kv_b.data() + (hp.first + h) * (m.nope + m.vdim) * m.kv_lora;
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
  // kv_b_proj decompresses the latent (naive) or is absorbed into the query and the output
  // (absorbed); which one a step takes depends on its query length and heads per rank. With
  // exact x both give the same products up to the order of f32 sums; rounding x to bf16 for
  // bf16 weights (backend/cpu/gemm_bf16.h) would round different operands on each path and make a
  // sequence's logits depend on chunking and tensor parallelism. So these keep x exact.
  m.kv_b.weight.exact_x = true;
  for (Weight& wh : m.uk_t) wh.exact_x = true;
  for (Weight& wh : m.uv) wh.exact_x = true;
  // Softmax scale over the whole score, times YaRN's mscale^2 (DeepSeek's convention).
  m.softmax_scale = 1.0f / std::sqrt(static_cast<float>(qk));
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeType::kYarn && rs.mscale_all_dim != 0.0) {
    const double ms = YarnMscale(rs.factor, rs.mscale_all_dim);
    m.softmax_scale = static_cast<float>(m.softmax_scale * ms * ms);
  }
  const MlaMode mode = w.plan().mla_mode;
  m.naive_prefill = mode != MlaMode::kAbsorbed;
  m.absorbed_decode = mode != MlaMode::kNaive;
  return m;
}

Tensor MlaAttention::Forward(Backend& b, Arena& a, const StepInputs& step,
                             const RopeParams& rope_params, const KvCacheView& cache,
                             const Tensor& h) const {
  const int64_t T = h.dim(0), qk = nope + rope;
  // The first query projection and kv_a read the same h: one MatMuls.
  const Linear* const from_h[] = {has_q_lora ? &q_a : &q_proj, &kv_a};
  Tensor first[2];
  ForwardSameX(b, a, h, from_h, first);
  Tensor q = first[0];
  if (has_q_lora) {
    Tensor qa = first[0];                             // [T, q_lora]
    b.RmsNorm(qa, q_a_norm, kLatentNormEps, qa);
    Tap(b, q_a_norm_tap, qa);
    q = q_b.Forward(b, a, qa);                        // [T, heads * qk]
  }
  Tensor q3 = q.Reshape({T, heads, qk});
  RopeParams rp = rope_params;
  rp.offset = static_cast<int>(nope);
  b.Rope(q3, step.positions, rp);
  if (!q_rope_tap.empty()) Tap(b, q_rope_tap, q3);

  // Latent entry per token: [normalised c_kv (kv_lora) | rotated k_pe (rope)].
  Tensor kva = first[1];                              // [T, kv_lora + rope]
  Tensor c_kv = a.Alloc(DType::kF32, {T, kv_lora});
  b.Copy(kva.Narrow(1, 0, kv_lora), c_kv);
  b.RmsNorm(c_kv, kv_a_norm, kLatentNormEps, c_kv);
  Tap(b, kv_a_norm_tap, c_kv);
  b.Copy(c_kv, kva.Narrow(1, 0, kv_lora));
  Tensor latent = kva.Reshape({T, 1, kv_lora + rope});
  RopeParams kp = rope_params;
  kp.offset = static_cast<int>(kv_lora);
  b.Rope(latent, step.positions, kp);
  if (ActiveTapSink()) [[unlikely]] {  // k_pe is a strided slice of the cache entry: copied
    Tensor k_pe = a.Alloc(DType::kF32, {T, rope});
    b.Copy(kva.Narrow(1, kv_lora, rope), k_pe);
    Tap(b, k_pe_tap, k_pe);
  }
  b.KvWrite(latent, Tensor(), cache, KvCacheView(), step.meta.slot_mapping);

  const bool use_absorbed = DecodeLike(step.meta) ? absorbed_decode : !naive_prefill;
  Tensor out = use_absorbed ? Absorbed(b, a, step, cache, q3) : Naive(b, a, step, cache, q3);
  return o.Forward(b, a, out.Reshape({T, heads * vdim}));
}

// Decompresses every sequence's cached latents (gathered into a paged buffer of their own) into
// per-head keys and values, then runs ordinary attention over them.
Tensor MlaAttention::Naive(Backend& b, Arena& a, const StepInputs& step,
                           const KvCacheView& cache, const Tensor& q3) const {
  PagedGather g;
  GatherPagedCache(b, a, step.meta, cache, &g);  // rows [N, kv_lora + rope]
  const int64_t N = g.rows.dim(0);
  Tensor c_kv = a.Alloc(DType::kF32, {N, kv_lora});
  b.Copy(g.rows.Narrow(1, 0, kv_lora), c_kv);
  Tensor kv = kv_b.Forward(b, a, c_kv).Reshape({N, heads, nope + vdim});
  Tensor k = a.Alloc(DType::kF32, {N, heads, nope + rope});
  b.Copy(kv.Narrow(2, 0, nope), k.Narrow(2, 0, nope));
  // The rotary key is shared by every head.
  b.Copy(g.rows.Narrow(1, kv_lora, rope).Broadcast(1, heads), k.Narrow(2, nope, rope));
  Tensor v = a.Alloc(DType::kF32, {N, heads, vdim});
  b.Copy(kv.Narrow(2, nope, vdim), v);

  Tensor out = a.Alloc(DType::kF32, {q3.dim(0), heads, vdim});
  b.Attention(q3, k, v, g.meta, softmax_scale, out);
  return out;
}

// Attends over the latent cache directly: q_lat[h] = W_uk[h]^T q_nope[h]; the scores are
// q_lat·c_kv + q_pe·k_pe; the output o_lat[h] goes back through W_uv[h].
Tensor MlaAttention::Absorbed(Backend& b, Arena& a, const StepInputs& step,
                              const KvCacheView& cache, const Tensor& q3) const {
  const int64_t T = q3.dim(0);
  // q_full = [q_nope · W_uk | q_pe]: the query in the cache's latent layout.
  Tensor q_full = a.Alloc(DType::kF32, {T, heads, kv_lora + rope});
  // [T, heads, kv_lora]
  b.BatchedMatMul(q3.Narrow(2, 0, nope), uk_t, q_full.Narrow(2, 0, kv_lora));
  b.Copy(q3.Narrow(2, nope, rope), q_full.Narrow(2, kv_lora, rope));
  Tensor o_lat = a.Alloc(DType::kF32, {T, heads, kv_lora});
  b.Attention(q_full, cache, cache.NarrowRow(0, kv_lora), step.meta, softmax_scale, o_lat);
  Tensor out = a.Alloc(DType::kF32, {T, heads, vdim});
  b.BatchedMatMul(o_lat, uv, out);  // [T, heads, vdim]
  return out;
}

// MLA attention over the layer's latent cache.
class MlaBlock final : public AttentionBlock {
 public:
  explicit MlaBlock(MlaAttention attn) : attn_(std::move(attn)) {}
  Tensor Forward(Backend& b, Arena& a, const StepInputs& step, const RopeParams& rope,
                 KvStorage& kv, int layer, const Tensor& h) const override {
    return attn_.Forward(b, a, step, rope, kv.k(layer), h);
  }
  const char* trace_label() const override { return "attention.mla"; }

 private:
  MlaAttention attn_;
};

// Routed experts (+ shared experts) behind the router.
class MoeBlock final : public FfnBlock {
 public:
  explicit MoeBlock(MoeFfn moe) : moe_(std::move(moe)) {}
  Tensor Forward(Backend& b, Arena& a, const Tensor& h) const override {
    return moe_.Forward(b, a, h);
  }
  const char* trace_label() const override { return "ffn.moe"; }
  // The experts a token does not route to are not read. The absorbed kv_b copies are read
  // instead of kv_b itself at decode: neither is discounted.
  Inactive InactivePerToken() const override {
    const auto& experts = moe_.experts;
    if (experts.empty()) return {};
    const ExpertWeights& e = experts[0];
    const uint64_t per_expert = e.gate.nbytes() + e.up.nbytes() + e.down.nbytes();
    const int64_t params_per_expert =
        e.gate.rows * e.gate.cols + e.up.rows * e.up.cols + e.down.rows * e.down.cols;
    // Of this rank's experts (all of them without expert parallelism), a token routes to
    // top_k * local / total on average.
    const uint64_t local = experts.size(), total = static_cast<uint64_t>(moe_.gate.rows);
    const uint64_t active = std::min<uint64_t>(local, moe_.gate_params.top_k * local / total);
    return {per_expert * (local - active), params_per_expert * static_cast<int64_t>(local - active)};
  }

 private:
  MoeFfn moe_;
};

Status LoadDeepseekLayer(const ModelConfig& c, bool mla, WeightLoader& w, int64_t l,
                         const std::string& p, DecoderLayer* layer) {
  if (mla) {
    DH_ASSIGN_OR_RETURN(MlaAttention attn, MlaAttention::Load(w, p + ".self_attn", c));
    layer->attn = std::make_unique<MlaBlock>(std::move(attn));
  } else {
    DH_ASSIGN_OR_RETURN(GqaAttention attn, GqaAttention::Load(w, p + ".self_attn", c,
                                                              c.attention_bias, c.attention_bias));
    layer->attn = std::make_unique<GqaBlock>(std::move(attn));
  }
  const bool moe =
      c.n_routed_experts > 0 && l >= c.first_k_dense_replace && l % c.moe_layer_freq == 0;
  if (moe) {
    DH_ASSIGN_OR_RETURN(MoeFfn ffn, MoeFfn::Load(w, p + ".mlp", c));
    layer->ffn = std::make_unique<MoeBlock>(std::move(ffn));
  } else {
    DH_ASSIGN_OR_RETURN(Mlp mlp, Mlp::Load(w, p + ".mlp", c.hidden_size, c.intermediate_size));
    layer->ffn = std::make_unique<MlpBlock>(std::move(mlp));
  }
  return Status::Ok();
}

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
  // Multi-token prediction layers are not the main model; Decoder::Load reads the first one
  // when the load options ask for it (docs/mtp.md).
  const int64_t first_skipped = c.num_hidden_layers + (w.options().load_mtp ? 1 : 0);
  for (int64_t l = first_skipped; l < c.num_hidden_layers + c.num_nextn_predict_layers; ++l) {
    w.Skip(fmt::format("model.layers.{}.", l));
  }
  const int n = static_cast<int>(c.num_hidden_layers);
  // MLA caches one latent per token (kv_lora_rank + the shared rope key, a quantized cache's
  // scale for each part); GQA caches K and V. The dtype is the load options' (Decoder::Load).
  const KvCacheSpec kv =
      mla ? KvCacheSpec{.num_layers = n, .k_heads = 1, .k_dim = c.kv_lora_rank + c.qk_rope_head_dim,
                        .k_group = c.kv_lora_rank}
          : KvCacheSpec{.num_layers = n, .k_heads = c.num_key_value_heads, .k_dim = c.head_dim,
                        .v_heads = c.num_key_value_heads, .v_dim = c.head_dim};
  const RopeSpec rope = mla ? RopeSpec{static_cast<int>(c.qk_rope_head_dim),
                                       RopeStyle::kInterleaved}
                            : RopeSpec{static_cast<int>(c.head_dim), RopeStyle::kHalf};
  return Decoder::Load(c, w, b, kv, rope,
                       [&](WeightLoader& loader, int64_t l, const std::string& p,
                           DecoderLayer* layer) {
                         return LoadDeepseekLayer(c, mla, loader, l, p, layer);
                       });
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
