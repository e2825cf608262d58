// Per-SIMD-target int8 / int4 MatMul kernels (Highway, foreach_target + HWY_DYNAMIC_DISPATCH).
// int4 codes hold even columns in the low nibble and odd columns in the high one, so each row of
// x is first split into its even and odd columns; a byte vector then multiplies two x vectors.
#include "backend/cpu/quant_matmul.h"

#include <algorithm>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/quant_matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace dh::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DI = hn::Rebind<int32_t, DF>;

HWY_INLINE float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t n) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + i + L), hn::LoadU(df, b + i + L), acc1);
  }
  for (; i + L <= n; i += L) acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1))) + tail;
}

// L int8 codes at p as f32.
HWY_INLINE VF LoadI8(DF df, const int8_t* HWY_RESTRICT p) {
  const hn::Rebind<int8_t, DF> d8;
  return hn::ConvertTo(df, hn::PromoteTo(DI(), hn::LoadU(d8, p)));
}

// dot(x, dequant(int8 row)).
HWY_INLINE float DotInt8(const int8_t* HWY_RESTRICT q, const float* HWY_RESTRICT s, int64_t k,
                         int64_t g, const float* HWY_RESTRICT x) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  float tail = 0.0f;
  for (int64_t g0 = 0, gi = 0; g0 < k; g0 += g, ++gi) {
    const int64_t g1 = std::min(k, g0 + g);
    const VF vs = hn::Set(df, s[gi]);
    int64_t c = g0;
    for (; c + 2 * L <= g1; c += 2 * L) {
      acc0 = hn::MulAdd(hn::Mul(LoadI8(df, q + c), vs), hn::LoadU(df, x + c), acc0);
      acc1 = hn::MulAdd(hn::Mul(LoadI8(df, q + c + L), vs), hn::LoadU(df, x + c + L), acc1);
    }
    for (; c + L <= g1; c += L) {
      acc0 = hn::MulAdd(hn::Mul(LoadI8(df, q + c), vs), hn::LoadU(df, x + c), acc0);
    }
    float part = 0.0f;
    for (; c < g1; ++c) part += static_cast<float>(q[c]) * x[c];
    tail += part * s[gi];
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1))) + tail;
}

HWY_INLINE void DequantInt8(const int8_t* HWY_RESTRICT q, const float* HWY_RESTRICT s, int64_t k,
                            int64_t g, float* HWY_RESTRICT out) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t g0 = 0, gi = 0; g0 < k; g0 += g, ++gi) {
    const int64_t g1 = std::min(k, g0 + g);
    const VF vs = hn::Set(df, s[gi]);
    int64_t c = g0;
    for (; c + L <= g1; c += L) hn::StoreU(hn::Mul(LoadI8(df, q + c), vs), df, out + c);
    for (; c < g1; ++c) out[c] = static_cast<float>(q[c]) * s[gi];
  }
}

// The low and high nibbles of L bytes at p, as f32.
HWY_INLINE void LoadNibbles(DF df, const uint8_t* HWY_RESTRICT p, VF* lo, VF* hi) {
  const hn::Rebind<uint8_t, DF> d8;
  const DI di;
  const auto v = hn::PromoteTo(di, hn::LoadU(d8, p));
  *lo = hn::ConvertTo(df, hn::And(v, hn::Set(di, 15)));
  *hi = hn::ConvertTo(df, hn::ShiftRight<4>(v));
}

// dot(x, dequant(int4 row)) with x split into even columns xe and odd columns xo (kb each;
// xo[kb - 1] = 0 when k is odd). gb = bytes per group.
HWY_INLINE float DotInt4(const uint8_t* HWY_RESTRICT q, const float* HWY_RESTRICT s,
                         const float* HWY_RESTRICT mn, int64_t kb, int64_t gb,
                         const float* HWY_RESTRICT xe, const float* HWY_RESTRICT xo) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  float tail = 0.0f;
  for (int64_t b0 = 0, gi = 0; b0 < kb; b0 += gb, ++gi) {
    const int64_t b1 = std::min(kb, b0 + gb);
    const VF vs = hn::Set(df, s[gi]), vm = hn::Set(df, mn[gi]);
    int64_t b = b0;
    for (; b + L <= b1; b += L) {
      VF lo, hi;
      LoadNibbles(df, q + b, &lo, &hi);
      acc0 = hn::MulAdd(hn::MulAdd(lo, vs, vm), hn::LoadU(df, xe + b), acc0);
      acc1 = hn::MulAdd(hn::MulAdd(hi, vs, vm), hn::LoadU(df, xo + b), acc1);
    }
    for (; b < b1; ++b) {
      tail += (static_cast<float>(q[b] & 15) * s[gi] + mn[gi]) * xe[b] +
              (static_cast<float>(q[b] >> 4) * s[gi] + mn[gi]) * xo[b];
    }
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1))) + tail;
}

// Dequantizes an int4 row into we (even columns) and wo (odd columns), kb each.
HWY_INLINE void DequantInt4(const uint8_t* HWY_RESTRICT q, const float* HWY_RESTRICT s,
                            const float* HWY_RESTRICT mn, int64_t kb, int64_t gb,
                            float* HWY_RESTRICT we, float* HWY_RESTRICT wo) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t b0 = 0, gi = 0; b0 < kb; b0 += gb, ++gi) {
    const int64_t b1 = std::min(kb, b0 + gb);
    const VF vs = hn::Set(df, s[gi]), vm = hn::Set(df, mn[gi]);
    int64_t b = b0;
    for (; b + L <= b1; b += L) {
      VF lo, hi;
      LoadNibbles(df, q + b, &lo, &hi);
      hn::StoreU(hn::MulAdd(lo, vs, vm), df, we + b);
      hn::StoreU(hn::MulAdd(hi, vs, vm), df, wo + b);
    }
    for (; b < b1; ++b) {
      we[b] = static_cast<float>(q[b] & 15) * s[gi] + mn[gi];
      wo[b] = static_cast<float>(q[b] >> 4) * s[gi] + mn[gi];
    }
  }
}

void QuantMatMulRangeImpl(const QuantMatMulArgs& a, int64_t n_begin, int64_t n_end) {
  const int64_t k = a.k, m = a.m, g = std::min(a.group_size, k);
  const uint8_t* qbase = static_cast<const uint8_t*>(a.q);
  auto finish = [&](int64_t r, int64_t j, float v) {
    a.out[r * a.out_stride + j] = v + (a.bias ? a.bias[j] : 0.0f);
  };
  if (!a.int4) {
    if (m == 1) {
      for (int64_t j = n_begin; j < n_end; ++j) {
        const auto* q = reinterpret_cast<const int8_t*>(qbase + j * a.q_stride);
        finish(0, j, DotInt8(q, a.scales + j * a.scale_stride, k, g, a.x));
      }
      return;
    }
    std::vector<float> wrow(k);
    for (int64_t j = n_begin; j < n_end; ++j) {
      const auto* q = reinterpret_cast<const int8_t*>(qbase + j * a.q_stride);
      DequantInt8(q, a.scales + j * a.scale_stride, k, g, wrow.data());
      for (int64_t r = 0; r < m; ++r) finish(r, j, Dot(wrow.data(), a.x + r * a.x_stride, k));
    }
    return;
  }
  // int4: split each x row into even and odd columns (zero-padded to kb).
  const int64_t kb = (k + 1) / 2;
  const int64_t gb = g >= k ? kb : g / 2;
  std::vector<float> xs(static_cast<size_t>(m * 2 * kb), 0.0f);
  for (int64_t r = 0; r < m; ++r) {
    const float* x = a.x + r * a.x_stride;
    float* xe = xs.data() + r * 2 * kb;
    float* xo = xe + kb;
    for (int64_t c = 0; c < k; ++c) (c % 2 == 0 ? xe : xo)[c / 2] = x[c];
  }
  if (m == 1) {
    for (int64_t j = n_begin; j < n_end; ++j) {
      finish(0, j, DotInt4(qbase + j * a.q_stride, a.scales + j * a.scale_stride,
                           a.mins + j * a.min_stride, kb, gb, xs.data(), xs.data() + kb));
    }
    return;
  }
  std::vector<float> wrow(2 * kb);
  for (int64_t j = n_begin; j < n_end; ++j) {
    DequantInt4(qbase + j * a.q_stride, a.scales + j * a.scale_stride, a.mins + j * a.min_stride,
                kb, gb, wrow.data(), wrow.data() + kb);
    for (int64_t r = 0; r < m; ++r) finish(r, j, Dot(wrow.data(), xs.data() + r * 2 * kb, 2 * kb));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dh::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "base/check.h"

namespace dh::cpu {

HWY_EXPORT(QuantMatMulRangeImpl);

void QuantMatMulRange(const QuantMatMulArgs& a, int64_t n_begin, int64_t n_end) {
  DH_CHECK(QuantMatMulSupports(a.int4, a.k, a.group_size), "quant matmul: {} k={} group={}",
           a.int4 ? "int4" : "int8", a.k, a.group_size);
  if (n_begin >= n_end || a.m <= 0) return;
  HWY_DYNAMIC_DISPATCH(QuantMatMulRangeImpl)(a, n_begin, n_end);
}

}  // namespace dh::cpu
#endif  // HWY_ONCE
