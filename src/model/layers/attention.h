// Grouped-query self-attention as Llama, Qwen2 and DeepSeek-MoE use it: q/k/v projections
// (optional biases), rotary embedding on the whole head (rotate-half pairing), paged KV write,
// causal attention over the cache, output projection.
#pragma once

#include <vector>

#include "model/layers/common.h"
#include "model/layers/rope.h"

namespace dh {

// Rope frequencies on the backend; "dynamic" scaling is recomputed when a step's positions
// outgrow max_position_embeddings.
class RotaryEmbedding {
 public:
  static Result<RotaryEmbedding> Create(Backend& backend, const ModelConfig& config, int rot_dim,
                                        RopeStyle style, int offset);
  // Parameters for a step whose largest position is `max_position`.
  RopeParams ForStep(Backend& backend, Arena& arena, int32_t max_position) const;
  float attention_factor() const { return params_.attention_factor; }

 private:
  const ModelConfig* config_ = nullptr;
  RopeParams params_;
  std::shared_ptr<std::vector<std::unique_ptr<Buffer>>> keep_;
};

struct GqaAttention {
  Linear q, k, v, o;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  // Taps of q and k after the rotary embedding, [T, heads, head_dim]: "<prefix>.query_states",
  // "<prefix>.key_states" (the variables of HF's forward after apply_rotary_pos_emb; no module
  // holds them). Empty when this rank holds a slice of the heads.
  std::string q_rope_tap, k_rope_tap;

  static Result<GqaAttention> Load(WeightLoader& loader, const std::string& prefix,
                                   const ModelConfig& config, bool qkv_bias, bool o_bias);
  // h: [T, hidden] -> [T, hidden]
  Tensor Forward(Backend& backend, Arena& arena, const StepInputs& step, const RopeParams& rope,
                 const KvCacheView& k_cache, const KvCacheView& v_cache, const Tensor& h) const;
};

// The paged cache of a step gathered into one contiguous buffer, laid out like a paged cache of
// its own (each sequence padded to whole blocks; padding repeats a real row and is never
// attended), with attention metadata addressing it. `meta.host_block_tables` points into
// `host_block_tables`, so a PagedGather must not be copied.
struct PagedGather {
  Tensor rows;  // [N, heads * dim] f32, dequantized
  AttentionMeta meta;
  std::vector<int32_t> host_block_tables;

  PagedGather() = default;
  PagedGather(const PagedGather&) = delete;
  PagedGather& operator=(const PagedGather&) = delete;
};

// Gathers every sequence's cached rows of `cache` ([slots, heads, dim], any cache dtype) per
// `meta` into *out (MLA's naive path decompresses them before ordinary attention).
void GatherPagedCache(Backend& b, Arena& a, const AttentionMeta& meta, const KvCacheView& cache,
                      PagedGather* out);

}  // namespace dh
