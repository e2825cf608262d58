// Entry points of the per-SIMD-target kernels in cpu_kernels.cc. Each call dispatches at run time
// to the best target the CPU supports (or the one a test forces with SetSupportedTargetsForTest).
// Pointers are host memory; rows are contiguous in their last dim.
#pragma once

#include <cstdint>

#include "backend/cpu/activation_args.h"

namespace dh::cpu {

// Element type of a dense weight, norm weight or embedding table.
enum class WType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// out[r, j] = dot(x[r, :], w[j, :]) + bias[j] for r < m and j in [n_begin, n_end).
struct MatMulArgs : ActivationArgs {
  const void* w = nullptr;
  WType wtype = WType::kF32;
  int64_t w_stride = 0;  // elements between rows of w
};
void MatMulRange(const MatMulArgs& a, int64_t n_begin, int64_t n_end);

// Element type of a KV cache (backend.h KvCacheView); the quantized ones carry one f32 scale
// per `group` elements of a head row.
enum class KvType : int { kF32 = 0, kBF16 = 1, kF8E4M3 = 2, kI8 = 3 };

// One query row of one head against positions [0, num_positions) of its sequence. K and V
// share the element type and group size (they are one cache dtype).
struct AttendArgs {
  const float* q = nullptr;        // [dk]
  KvType kv_type = KvType::kF32;
  const void* k_base = nullptr;    // k_cache data, offset to this kv head
  int64_t k_slot_stride = 0;       // elements between cache slots
  const void* v_base = nullptr;    // v_cache data, offset to this kv head
  int64_t v_slot_stride = 0;
  // Quantized types: scales of this kv head, scales between slots, elements per scale.
  const float* k_scales = nullptr;
  int64_t k_scale_stride = 0;
  const float* v_scales = nullptr;
  int64_t v_scale_stride = 0;
  int64_t group = 0;
  int64_t dk = 0;
  int64_t dv = 0;
  const int64_t* slots = nullptr;  // cache slot of each position
  int64_t num_positions = 0;
  float scale = 1.0f;
  float* scores = nullptr;  // scratch, num_positions floats
  float* out = nullptr;     // [dv]
};
void Attend(const AttendArgs& a);

float SumOfSquares(const float* x, int64_t n);
// out = x * inv * w (w of type wtype).
void ScaleByWeight(const float* x, float inv, const void* w, WType wtype, float* out, int64_t n);
void AddRow(const float* a, const float* b, float* out, int64_t n);
void SiluMulRow(const float* gate, const float* up, float* out, int64_t n);
// out = float(src).
void WidenRow(const void* src, WType wtype, float* out, int64_t n);

// Sum of n words, read with full-width vector loads (the memory bandwidth probe).
uint64_t SumWords(const uint64_t* p, int64_t n);
// The same sum, read as two streams at once (the first and second half in lockstep).
uint64_t SumWordsTwoStreams(const uint64_t* p, int64_t n);

// Name of the SIMD target the dispatcher picks now ("AVX3", "AVX2", ...).
const char* DispatchedTargetName();

}  // namespace dh::cpu
