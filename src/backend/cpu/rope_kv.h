// Entry points of the per-SIMD-target Rope and KV cache kernels in rope_kv.cc (CpuBackend's Rope,
// KvWrite and KvGather, cpu_rope_kv.cc). They give the reference's results bit for bit: the same
// f32 operations in the same order per element, and the same integer rounding of every stored
// format (tensor/dtype.h), so a cache written here reads back exactly as the reference's would.
// Pointers are host memory; every row is contiguous in its last dim.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dh::cpu {

// Rotates tokens [t_begin, t_end) of x in place: for each head, pair i of the rot_dim elements
// from `offset` ((i, i + half) or (2i, 2i + 1) when interleaved) becomes
// (a * c - b * s, b * c + a * s) with c = cos[t * half + i], s = sin[t * half + i].
struct RopeArgs {
  float* x = nullptr;
  int64_t token_stride = 0;  // floats between tokens of x
  int64_t head_stride = 0;   // floats between heads of x
  int64_t heads = 0;
  int64_t offset = 0;
  int64_t half = 0;  // rot_dim / 2
  bool interleaved = false;
  const float* cos = nullptr;  // [tokens, half]
  const float* sin = nullptr;
};
void RopeTokens(const RopeArgs& a, int64_t t_begin, int64_t t_end);

// Writes row t of src (dim floats) to one head of cache slot slots[t] for every t with a slot
// >= 0, in token order (a slot named twice keeps the later row). Quantized types (kF8E4M3, kI8)
// store one scale per `group` elements (max |x| / 448 or / 127, 0 for an all-zero group) and
// the values divided by it; the others (kF32, kBF16, kF16) store the values rounded to nearest
// even. The caller has checked every slot against the cache.
struct KvWriteArgs {
  const float* src = nullptr;  // token 0's row of this head
  int64_t src_token_stride = 0;
  const int32_t* slots = nullptr;
  int64_t slot_stride = 1;  // int32s between entries of slots
  int64_t tokens = 0;
  DType type = DType::kF32;
  void* dst = nullptr;          // slot 0's row of this head
  int64_t dst_slot_stride = 0;  // elements between slots
  float* scales = nullptr;      // slot 0's scales of this head (quantized types)
  int64_t scale_slot_stride = 0;
  int64_t group = 0;
  int64_t dim = 0;
};
void KvWriteHead(const KvWriteArgs& a);

// out[i] = element i < n of a cache row of `type`, times scales[i / group] for the quantized
// types (scales null for the others): the reference's KvGet, bit for bit.
void KvReadRow(const void* src, DType type, const float* scales, int64_t group, float* out,
               int64_t n);

}  // namespace dh::cpu
