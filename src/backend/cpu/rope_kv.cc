// Per-SIMD-target Rope and KV cache kernels (rope_kv.h; Highway, compiled once per target via
// foreach_target.h and chosen at run time by HWY_DYNAMIC_DISPATCH). Bit-identical to the
// reference: the rotation is the reference's products and sums (this file is compiled with
// -ffp-contract=off, backend.cmake, so no multiply-add is fused), and the stored formats round as
// tensor/dtype.h does, in integer arithmetic on the f32 bits; tails use those scalar functions.
#include "backend/cpu/rope_kv.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/rope_kv.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace dh::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VI = hn::Vec<DI>;
using VU = hn::Vec<DU>;

// (a, b) -> (a * c - b * s, b * c + a * s), the reference's expression.
HWY_INLINE void Rotate(VF& a, VF& b, VF c, VF s) {
  const VF ra = hn::Sub(hn::Mul(a, c), hn::Mul(b, s));
  b = hn::Add(hn::Mul(b, c), hn::Mul(a, s));
  a = ra;
}
inline void RotateScalar(float* pa, float* pb, float c, float s) {
  const float a = *pa, b = *pb;
  *pa = a * c - b * s;
  *pb = b * c + a * s;
}

void RopeTokens(const RopeArgs& a, int64_t t_begin, int64_t t_end) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t half = a.half;
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* HWY_RESTRICT c = a.cos + t * half;
    const float* HWY_RESTRICT s = a.sin + t * half;
    for (int64_t h = 0; h < a.heads; ++h) {
      float* x = a.x + t * a.token_stride + h * a.head_stride + a.offset;
      int64_t i = 0;
      if (a.interleaved) {
        for (; i + lanes <= half; i += lanes) {
          VF va, vb;
          hn::LoadInterleaved2(df, x + 2 * i, va, vb);
          Rotate(va, vb, hn::LoadU(df, c + i), hn::LoadU(df, s + i));
          hn::StoreInterleaved2(va, vb, df, x + 2 * i);
        }
        for (; i < half; ++i) RotateScalar(x + 2 * i, x + 2 * i + 1, c[i], s[i]);
      } else {
        for (; i + lanes <= half; i += lanes) {
          VF va = hn::LoadU(df, x + i), vb = hn::LoadU(df, x + half + i);
          Rotate(va, vb, hn::LoadU(df, c + i), hn::LoadU(df, s + i));
          hn::StoreU(va, df, x + i);
          hn::StoreU(vb, df, x + half + i);
        }
        for (; i < half; ++i) RotateScalar(x + i, x + half + i, c[i], s[i]);
      }
    }
  }
}

// The codes of tensor/dtype.h's conversions, per lane (as i32), for finite and non-finite x.
// A normal value keeps `bits` mantissa bits by adding half an ulp of the kept part (ties to
// even) to the f32 bits, and its exponent field moves with the carry; below the smallest normal
// the value is a multiple of the subnormal step, rounded in f32 (ties to even as nearbyint).
// kShift (template argument) = 23 - kept mantissa bits; kSignShift moves the f32 sign bit onto
// the format's.
struct NarrowFormat {
  uint32_t rebias;    // (127 - format bias) << mantissa bits
  uint32_t max_code;  // code of the largest finite magnitude (or infinity), saturated to
  float min_normal;   // below it: subnormal
  float sub_scale;    // 1 / subnormal step
  uint32_t sign_bit;
  uint32_t nan_code;
  bool nan_signed;  // NaN keeps its sign
};
constexpr NarrowFormat kF16Format{112u << 10, 0x7c00, 6.103515625e-05f, 16777216.0f, 0x8000,
                                  0x7e00,     true};
constexpr NarrowFormat kF8Format{120u << 3, 0x7e, 0.015625f, 512.0f, 0x80, 0x7f, false};

template <int kShift, int kSignShift>
HWY_INLINE VI NarrowCode(VF x, const NarrowFormat& f) {
  const DF df;
  const DI di;
  const DU du;
  const VU u = hn::BitCast(du, x);
  const VU sign = hn::And(hn::ShiftRight<kSignShift>(u), hn::Set(du, f.sign_bit));
  const VF ax = hn::Abs(x);
  const VU ua = hn::BitCast(du, ax);
  const VU lsb = hn::And(hn::ShiftRight<kShift>(ua), hn::Set(du, 1));
  const VU rounded = hn::Add(ua, hn::Add(hn::Set(du, (1u << (kShift - 1)) - 1), lsb));
  const VU normal = hn::Min(hn::Sub(hn::ShiftRight<kShift>(rounded), hn::Set(du, f.rebias)),
                            hn::Set(du, f.max_code));
  const VU sub =
      hn::BitCast(du, hn::ConvertTo(di, hn::Round(hn::Mul(ax, hn::Set(df, f.sub_scale)))));
  VU code = hn::Or(
      sign, hn::IfThenElse(hn::RebindMask(du, hn::Lt(ax, hn::Set(df, f.min_normal))), sub, normal));
  const VU nan = f.nan_signed ? hn::Or(sign, hn::Set(du, f.nan_code)) : hn::Set(du, f.nan_code);
  code = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), nan, code);
  return hn::BitCast(di, code);
}

// F32ToBF16: round to nearest even on the f32 bits; NaN keeps its top bits and becomes quiet.
HWY_INLINE VI Bf16Code(VF x) {
  const DI di;
  const DU du;
  const VU u = hn::BitCast(du, x);
  const VU lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1));
  const VU rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fff), lsb)));
  const VU nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40));
  return hn::BitCast(di, hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), nan, rounded));
}

// Stores n values (src / scale when `scale` is given) of one row as `type`.
void StoreRow(const float* HWY_RESTRICT src, DType type, const float* scale, void* dst, int64_t n) {
  const DF df;
  const DI di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const VF vscale = hn::Set(df, scale ? *scale : 1.0f);
  auto value = [&](int64_t i) {
    const VF v = hn::LoadU(df, src + i);
    return scale ? hn::Div(v, vscale) : v;
  };
  auto scalar = [&](int64_t i) { return scale ? src[i] / *scale : src[i]; };
  int64_t i = 0;
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16:
    case DType::kF16: {
      const hn::Rebind<uint16_t, DF> d16;
      uint16_t* out = static_cast<uint16_t*>(dst);
      const bool bf16 = type == DType::kBF16;
      for (; i + lanes <= n; i += lanes) {
        const VI code = bf16 ? Bf16Code(value(i)) : NarrowCode<13, 16>(value(i), kF16Format);
        hn::StoreU(hn::DemoteTo(d16, code), d16, out + i);
      }
      for (; i < n; ++i) out[i] = bf16 ? F32ToBF16(scalar(i)) : F32ToF16(scalar(i));
      return;
    }
    case DType::kF8E4M3: {
      const hn::Rebind<uint8_t, DF> d8;
      uint8_t* out = static_cast<uint8_t*>(dst);
      for (; i + lanes <= n; i += lanes) {
        hn::StoreU(hn::DemoteTo(d8, NarrowCode<20, 24>(value(i), kF8Format)), d8, out + i);
      }
      for (; i < n; ++i) out[i] = F32ToF8E4M3(scalar(i));
      return;
    }
    case DType::kI8: {
      const hn::Rebind<int8_t, DF> d8;
      int8_t* out = static_cast<int8_t*>(dst);
      const VF lo = hn::Set(df, -127.0f), hi = hn::Set(df, 127.0f);
      for (; i + lanes <= n; i += lanes) {
        const VF r = hn::Min(hn::Max(hn::Round(value(i)), lo), hi);
        hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, r)), d8, out + i);
      }
      for (; i < n; ++i) {
        out[i] = static_cast<int8_t>(std::clamp(std::nearbyint(scalar(i)), -127.0f, 127.0f));
      }
      return;
    }
    default:
      return;
  }
}

// max |x| over n values, NaNs ignored (as std::max(amax, fabs(x)) does).
float AbsMax(const float* HWY_RESTRICT x, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  VF m = hn::Zero(df);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const VF v = hn::LoadU(df, x + i);
    m = hn::Max(m, hn::IfThenZeroElse(hn::IsNaN(v), hn::Abs(v)));
  }
  float amax = hn::GetLane(hn::MaxOfLanes(df, m));
  for (; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

void KvWriteHead(const KvWriteArgs& a) {
  const size_t esize = DTypeSize(a.type);
  const bool quantized = a.type == DType::kF8E4M3 || a.type == DType::kI8;
  const float qmax = a.type == DType::kF8E4M3 ? 448.0f : 127.0f;
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int32_t slot = a.slots[t * a.slot_stride];
    if (slot < 0) continue;
    const float* src = a.src + t * a.src_token_stride;
    char* dst = static_cast<char*>(a.dst) + slot * a.dst_slot_stride * esize;
    if (!quantized) {
      StoreRow(src, a.type, nullptr, dst, a.dim);
      continue;
    }
    float* scales = a.scales + slot * a.scale_slot_stride;
    for (int64_t g0 = 0; g0 < a.dim; g0 += a.group) {
      const int64_t n = std::min(a.dim, g0 + a.group) - g0;
      const float scale = AbsMax(src + g0, n) / qmax;
      scales[g0 / a.group] = scale;
      if (scale > 0) {
        StoreRow(src + g0, a.type, &scale, dst + g0 * esize, n);
      } else {
        std::memset(dst + g0 * esize, 0, n * esize);  // both formats encode +0 as 0
      }
    }
  }
}

// F16ToF32 on the bits: subnormals as mant * 2^-24, and infinities and NaNs (signalling ones
// too, which a hardware conversion would quiet) with their payload moved up.
HWY_INLINE VF WidenF16(hn::Vec<DU> h) {
  const DF df;
  const DU du;
  const VU sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000)));
  const VU exp = hn::And(hn::ShiftRight<10>(h), hn::Set(du, 0x1f));
  const VU mant = hn::And(h, hn::Set(du, 0x3ff));
  const VU normal =
      hn::Or(hn::ShiftLeft<23>(hn::Add(exp, hn::Set(du, 112))), hn::ShiftLeft<13>(mant));
  const VU special = hn::Or(hn::Set(du, 0x7f800000u), hn::ShiftLeft<13>(mant));
  const VF sub = hn::Mul(hn::ConvertTo(df, hn::BitCast(DI(), mant)), hn::Set(df, 0x1p-24f));
  const VU wide = hn::IfThenElse(hn::Eq(exp, hn::Set(du, 31)), special, normal);
  const VU bits = hn::IfThenElse(hn::Eq(exp, hn::Zero(du)), hn::BitCast(du, sub), wide);
  return hn::BitCast(df, hn::Or(sign, bits));
}

// Element i of a row of `type` as f32 (times its group's scale when quantized), lanes at once.
HWY_INLINE VF ReadLanes(const void* src, DType type, int64_t i) {
  const DF df;
  const DI di;
  const DU du;
  static const std::array<float, 256> f8_table = [] {
    std::array<float, 256> t;
    for (int v = 0; v < 256; ++v) t[v] = F8E4M3ToF32(static_cast<uint8_t>(v));
    return t;
  }();
  switch (type) {
    case DType::kBF16: {
      const hn::Rebind<uint16_t, DF> d16;
      const VU h = hn::PromoteTo(du, hn::LoadU(d16, static_cast<const uint16_t*>(src) + i));
      return hn::BitCast(df, hn::ShiftLeft<16>(h));
    }
    case DType::kF16: {
      const hn::Rebind<uint16_t, DF> d16;
      return WidenF16(hn::PromoteTo(du, hn::LoadU(d16, static_cast<const uint16_t*>(src) + i)));
    }
    case DType::kF8E4M3: {
      const hn::Rebind<uint8_t, DF> d8;
      const VI idx = hn::PromoteTo(di, hn::LoadU(d8, static_cast<const uint8_t*>(src) + i));
      return hn::GatherIndex(df, f8_table.data(), idx);
    }
    case DType::kI8: {
      const hn::Rebind<int8_t, DF> d8;
      return hn::ConvertTo(df,
                           hn::PromoteTo(di, hn::LoadU(d8, static_cast<const int8_t*>(src) + i)));
    }
    default:
      return hn::LoadU(df, static_cast<const float*>(src) + i);
  }
}

// The reference's element read (KvGet without the scale).
float ReadOne(const void* src, DType type, int64_t i) {
  switch (type) {
    case DType::kBF16:
      return BF16ToF32(static_cast<const uint16_t*>(src)[i]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(src)[i]);
    case DType::kF8E4M3:
      return F8E4M3ToF32(static_cast<const uint8_t*>(src)[i]);
    case DType::kI8:
      return static_cast<float>(static_cast<const int8_t*>(src)[i]);
    default:
      return static_cast<const float*>(src)[i];
  }
}

void KvReadRow(const void* src, DType type, const float* scales, int64_t group, float* out,
               int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  if (scales == nullptr) group = n;
  for (int64_t g0 = 0; g0 < n; g0 += group) {
    const int64_t g1 = std::min(n, g0 + group);
    int64_t i = g0;
    if (scales == nullptr) {
      for (; i + lanes <= g1; i += lanes) hn::StoreU(ReadLanes(src, type, i), df, out + i);
      for (; i < g1; ++i) out[i] = ReadOne(src, type, i);
      continue;
    }
    const float scale = scales[g0 / group];
    const VF vscale = hn::Set(df, scale);
    for (; i + lanes <= g1; i += lanes) {
      hn::StoreU(hn::Mul(ReadLanes(src, type, i), vscale), df, out + i);
    }
    for (; i < g1; ++i) out[i] = ReadOne(src, type, i) * scale;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dh::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dh::cpu {

HWY_EXPORT(RopeTokens);
HWY_EXPORT(KvWriteHead);
HWY_EXPORT(KvReadRow);

void RopeTokens(const RopeArgs& a, int64_t t_begin, int64_t t_end) {
  HWY_DYNAMIC_DISPATCH(RopeTokens)(a, t_begin, t_end);
}
void KvWriteHead(const KvWriteArgs& a) { HWY_DYNAMIC_DISPATCH(KvWriteHead)(a); }
void KvReadRow(const void* src, DType type, const float* scales, int64_t group, float* out,
               int64_t n) {
  HWY_DYNAMIC_DISPATCH(KvReadRow)(src, type, scales, group, out, n);
}

}  // namespace dh::cpu
#endif  // HWY_ONCE
