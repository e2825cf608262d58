// The reference maths of every Backend op as free functions over host tensors: plain scalar loops
// that read as the definition. ReferenceBackend forwards to them; faster backends reuse them for
// the cases they do not accelerate, and tests use them as the oracle.
#pragma once

#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace dh::ref {

// Element access for f32/f16/bf16 (and, for LoadFloat, the integer types) host tensors.
float LoadFloat(const void* base, DType dtype, int64_t index);
void StoreFloat(void* base, DType dtype, int64_t index, float value);

// Element offset of t[i0, i1, ...] from its strides (missing trailing indices are 0).
inline int64_t Offset(const Tensor& t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0,
                      int64_t i3 = 0) {
  return i0 * t.stride[0] + (t.ndim > 1 ? i1 * t.stride[1] : 0) +
         (t.ndim > 2 ? i2 * t.stride[2] : 0) + (t.ndim > 3 ? i3 * t.stride[3] : 0);
}
inline float Get(const Tensor& t, int64_t offset) { return LoadFloat(t.data, t.dtype, offset); }
inline void Set(const Tensor& t, int64_t offset, float v) { StoreFloat(t.data, t.dtype, offset, v); }
inline int32_t GetI32(const Tensor& t, int64_t i) { return t.as<const int32_t>()[i * t.stride[0]]; }

// Writes row `row` of `w` (w.cols values, dequantized per its format) to out.
void DecodeWeightRow(const Weight& w, int64_t row, float* out);

void Embedding(const Weight& table, const Tensor& ids, Tensor out);
void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out);
void AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps, Tensor out);
void MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out);
void BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out);
void Rope(Tensor x, const Tensor& positions, const RopeParams& p);
void KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache, KvCacheView v_cache,
             const Tensor& slot_mapping);
void Attention(const Tensor& q, const KvCacheView& k_cache, const KvCacheView& v_cache,
               const AttentionMeta& meta, float scale, Tensor out);
void KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out);

// The KV cache formats (KvCacheView): the largest quantized magnitude of a cache dtype (448 for
// f8e4m3, 127 for i8, 0 for the unquantized ones), and element [slot, head, i] dequantized.
float KvQuantMax(DType dtype);
float KvGet(const KvCacheView& c, int64_t slot, int64_t head, int64_t i);
void SiluMul(const Tensor& gate, const Tensor& up, Tensor out);
void Add(const Tensor& a, const Tensor& b, Tensor out);
void Copy(const Tensor& src, Tensor dst);
void GatherRows(const Tensor& x, const Tensor& rows, Tensor out);
void MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p, Tensor topk_ids,
             Tensor topk_weights);
// Groups tokens by expert and runs each expert through `backend`'s GatherRows/MatMul/SiluMul, so
// a backend that accelerates those gets a fast MoE for free. Host memory only.
void MoeExperts(Backend& backend, const Tensor& x, const Tensor& topk_ids,
                const Tensor& topk_weights, std::span<const ExpertWeights> experts, Tensor out);

// The sequence layout of an AttentionMeta, read from its host spans when present, else from its
// (host-resident) tensors.
struct SeqLayout {
  int32_t query_start = 0;  // first query row
  int32_t query_end = 0;    // one past the last query row
  int32_t seq_len = 0;      // cached tokens, including this step's
  const int32_t* block_table = nullptr;  // max_blocks_per_seq entries
};
SeqLayout GetSeqLayout(const AttentionMeta& meta, int s);
// Cache slot of position `pos` of a sequence.
inline int64_t SlotOf(const SeqLayout& seq, int block_size, int64_t pos) {
  return static_cast<int64_t>(seq.block_table[pos / block_size]) * block_size + pos % block_size;
}

}  // namespace dh::ref
