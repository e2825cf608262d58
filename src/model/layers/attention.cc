// GQA attention block and rotary-embedding tables.
#include "model/layers/attention.h"

#include <algorithm>
#include <cmath>

#include "model/layers/parallel.h"
#include "model/tap.h"

namespace dh {

Result<RotaryEmbedding> RotaryEmbedding::Create(Backend& backend, const ModelConfig& config,
                                                int rot_dim, RopeStyle style, int offset) {
  RotaryEmbedding r;
  r.config_ = &config;
  RopeFrequencies f = ComputeRopeFrequencies(config, rot_dim, config.rope_theta, 0);
  r.params_.style = style;
  r.params_.offset = offset;
  r.params_.rot_dim = rot_dim;
  r.params_.attention_factor = f.attention_factor;
  r.keep_ = std::make_shared<std::vector<std::unique_ptr<Buffer>>>();
  DH_ASSIGN_OR_RETURN(r.params_.inv_freq, UploadF32(backend, f.inv_freq, *r.keep_));
  return r;
}

RopeParams RotaryEmbedding::ForStep(Backend& backend, Arena& arena, int32_t max_position) const {
  if (config_->rope_scaling.type != RopeType::kDynamic ||
      max_position + 1 <= config_->max_position_embeddings) {
    return params_;
  }
  RopeFrequencies f =
      ComputeRopeFrequencies(*config_, params_.rot_dim, config_->rope_theta, max_position + 1);
  RopeParams p = params_;
  p.inv_freq = arena.Alloc(DType::kF32, {static_cast<int64_t>(f.inv_freq.size())});
  backend.CopyToDevice(p.inv_freq, f.inv_freq.data());
  return p;
}

Result<GqaAttention> GqaAttention::Load(WeightLoader& loader, const std::string& prefix,
                                        const ModelConfig& c, bool qkv_bias, bool o_bias) {
  GqaAttention a;
  // With tensor parallelism this rank holds its query heads and the kv heads they read.
  const TensorParallel tp = TensorParallel::From(loader.options());
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads, d = c.head_dim;
  DH_ASSIGN_OR_RETURN(const PartRange q_part, tp.Split(heads, "num_attention_heads"));
  DH_ASSIGN_OR_RETURN(const PartRange kv_part, tp.KvHeads(kv_heads, heads));
  a.num_heads = q_part.count;
  a.num_kv_heads = kv_part.count;
  a.head_dim = d;
  const int64_t q_dim = heads * d, kv_dim = kv_heads * d;
  const MatrixSlice q_rows = TensorParallel::Rows(q_part, d, heads);
  const MatrixSlice kv_rows = TensorParallel::Rows(kv_part, d, kv_heads);
  DH_ASSIGN_OR_RETURN(a.q, Linear::Load(loader, prefix + ".q_proj", q_dim, c.hidden_size, qkv_bias, q_rows));
  DH_ASSIGN_OR_RETURN(a.k, Linear::Load(loader, prefix + ".k_proj", kv_dim, c.hidden_size, qkv_bias, kv_rows));
  DH_ASSIGN_OR_RETURN(a.v, Linear::Load(loader, prefix + ".v_proj", kv_dim, c.hidden_size, qkv_bias, kv_rows));
  if (q_part.count == heads) a.q_rope_tap = prefix + ".query_states";
  if (kv_part.count == kv_heads) a.k_rope_tap = prefix + ".key_states";
  DH_ASSIGN_OR_RETURN(a.o, Linear::Load(loader, prefix + ".o_proj", c.hidden_size, q_dim, o_bias,
                                        TensorParallel::Cols(q_part, d, heads)));
  return a;
}

Tensor GqaAttention::Forward(Backend& backend, Arena& arena, const StepInputs& step,
                             const RopeParams& rope, const KvCacheView& k_cache,
                             const KvCacheView& v_cache, const Tensor& h) const {
  const int64_t T = h.dim(0);
  const Linear* const qkv_proj[] = {&q, &k, &v};
  Tensor qkv[3];
  ForwardSameX(backend, arena, h, qkv_proj, qkv);
  Tensor q3 = qkv[0].Reshape({T, num_heads, head_dim});
  Tensor k3 = qkv[1].Reshape({T, num_kv_heads, head_dim});
  Tensor v3 = qkv[2].Reshape({T, num_kv_heads, head_dim});
  backend.Rope(q3, step.positions, rope);
  backend.Rope(k3, step.positions, rope);
  if (!q_rope_tap.empty()) Tap(backend, q_rope_tap, q3);
  if (!k_rope_tap.empty()) Tap(backend, k_rope_tap, k3);
  backend.KvWrite(k3, v3, k_cache, v_cache, step.meta.slot_mapping);
  Tensor attn = arena.Alloc(DType::kF32, {T, num_heads, head_dim});
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  backend.Attention(q3, k_cache, v_cache, step.meta, scale, attn);
  return o.Forward(backend, arena, attn.Reshape({T, num_heads * head_dim}));
}

void GatherPagedCache(Backend& b, Arena& a, const AttentionMeta& m, const KvCacheView& cache,
                      PagedGather* out) {
  const int bs = m.block_size;
  std::vector<int32_t> rows;
  std::vector<int32_t>& tables = out->host_block_tables;
  tables.clear();
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
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t heads = cache.dim(1), dim = cache.dim(2);
  Tensor gathered = a.Alloc(DType::kF32, {n, heads, dim});
  b.KvGather(cache, a.Upload(rows), gathered);
  out->rows = gathered.Reshape({n, heads * dim});
  out->meta = m;
  out->meta.max_blocks_per_seq = max_blocks;
  out->meta.block_tables = a.Upload(tables);
  out->meta.host_block_tables = tables;
}

}  // namespace dh
