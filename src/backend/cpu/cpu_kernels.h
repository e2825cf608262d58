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
// per `group` elements of a head row. Attention over it: attention.h.
enum class KvType : int { kF32 = 0, kBF16 = 1, kF8E4M3 = 2, kI8 = 3 };

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
// Whether the dispatcher picks an AVX-512 target now. Cheap, and unlike hwy::SupportedTargets()
// it leaves the choice alone: Highway 1.0's SupportedTargets() re-detects the CPU (cpuid, a VM
// exit under KVM) and resets the chosen target to the CPU's best, undoing DH_CPU_TIER.
bool DispatchesAvx512();

}  // namespace dh::cpu
