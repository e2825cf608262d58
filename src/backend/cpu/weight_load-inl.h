// Per-SIMD-target loads of f32 / bf16 / f16 weights (and fp8 e4m3 codes) as f32, shared by the
// kernels of cpu_kernels.cc, gemm.cc, attention.cc and quant_matmul.cc. Included by a file
// compiled once per target (foreach_target.h), so it uses Highway's per-target include guard
// instead of #pragma once.
#if defined(DH_BACKEND_CPU_WEIGHT_LOAD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DH_BACKEND_CPU_WEIGHT_LOAD_INL_H_
#undef DH_BACKEND_CPU_WEIGHT_LOAD_INL_H_
#else
#define DH_BACKEND_CPU_WEIGHT_LOAD_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "tensor/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace dh::cpu {
namespace HWY_NAMESPACE {

// Loads Lanes(df) weights starting at p as f32.
template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DF> LoadW(DF df, const float* HWY_RESTRICT p) {
  return hwy::HWY_NAMESPACE::LoadU(df, p);
}
template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DF> LoadW(DF df, const hwy::bfloat16_t* HWY_RESTRICT p) {
  const hwy::HWY_NAMESPACE::Rebind<hwy::bfloat16_t, DF> dbf;
  return hwy::HWY_NAMESPACE::PromoteTo(df, hwy::HWY_NAMESPACE::LoadU(dbf, p));
}
template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DF> LoadW(DF df, const hwy::float16_t* HWY_RESTRICT p) {
  const hwy::HWY_NAMESPACE::Rebind<hwy::float16_t, DF> dh16;
  return hwy::HWY_NAMESPACE::PromoteTo(df, hwy::HWY_NAMESPACE::LoadU(dh16, p));
}

// Lanes(df) fp8 e4m3 codes at p as f32, each the code's value / 2^120: the code's sign, and its
// 7 exponent / mantissa bits placed at the top of an f32's (sign-extend, shift, mask: three
// integer steps, no conversion). Exact for every code but NaN, subnormal codes too (the f32 is
// subnormal then, and no build sets DAZ). The fp8 KV cache (attention.cc) and the FP8 weight
// tiles (quant_matmul.cc) decode with it and put the 2^120 back in their scales.
template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DF> LoadE4M3Over2To120(DF df, const uint8_t* HWY_RESTRICT p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::Rebind<int8_t, DF> d8;
  const hn::RebindToSigned<DF> di;
  const auto v = hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
  const auto top = hn::Set(di, static_cast<int32_t>(0x87F00000u));  // sign, 7 bits under it
  return hn::BitCast(df, hn::And(hn::ShiftLeft<20>(v), top));
}

// One weight as f32 (the scalar tails of the same kernels).
HWY_INLINE float ToF32(float v) { return v; }
HWY_INLINE float ToF32(hwy::bfloat16_t v) {
  uint16_t bits;
  std::memcpy(&bits, &v, 2);
  return BF16ToF32(bits);
}
HWY_INLINE float ToF32(hwy::float16_t v) {
  uint16_t bits;
  std::memcpy(&bits, &v, 2);
  return F16ToF32(bits);
}
// The same read through a pointer: weights mapped from a safetensors file need not be aligned to
// their element size (the format puts tensors at any byte offset), so the scalar tails copy the
// bytes instead of dereferencing.
template <typename WT>
HWY_INLINE float WeightAt(const WT* p) {
  WT v;
  std::memcpy(&v, p, sizeof v);
  return ToF32(v);
}

}  // namespace HWY_NAMESPACE
}  // namespace dh::cpu
HWY_AFTER_NAMESPACE();

#endif  // include guard
