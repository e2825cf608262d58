// Per-SIMD-target int8 / int4 MatMul kernels (Highway, foreach_target + HWY_DYNAMIC_DISPATCH).
// int4 codes hold even columns in the low nibble and odd columns in the high one, so each row of
// x is first split into its even and odd columns; a byte vector then multiplies two x vectors.
#include "backend/cpu/quant_matmul.h"

#include <algorithm>
#include <vector>

#include "backend/weight.h"
#include "tensor/dtype.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/quant_matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "backend/cpu/weight_load-inl.h"  // after highway.h: per-target code

HWY_BEFORE_NAMESPACE();
namespace dh::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DI = hn::Rebind<int32_t, DF>;

// L int8 codes at p as f32.
HWY_INLINE VF LoadI8(DF df, const int8_t* HWY_RESTRICT p) {
  const hn::Rebind<int8_t, DF> d8;
  return hn::ConvertTo(df, hn::PromoteTo(DI(), hn::LoadU(d8, p)));
}

// L e4m3 codes at p as f32 / 2^8 (quant_matmul.h): sign-extend to i16, shift the magnitude under
// the f16 exponent (bit 14 cleared: it held a copy of the sign), widen f16 -> f32.
HWY_INLINE VF LoadFp8(DF df, const uint8_t* HWY_RESTRICT p) {
  const hn::Rebind<int8_t, DF> d8;
  const hn::Rebind<int16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  auto v = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
  v = hn::And(hn::ShiftLeft<7>(v), hn::Set(d16, static_cast<int16_t>(0xBF80)));
  return hn::PromoteTo(df, hn::BitCast(dh, v));
}

// The one-code-per-column formats with one scale per block of columns: how a vector and a single
// code decode. Load(df, p) * (scale * kVectorScale) == One(*p) * scale.
struct Int8Codes {
  using Code = int8_t;
  static constexpr float kVectorScale = 1.0f;
  static HWY_INLINE VF Load(DF df, const int8_t* HWY_RESTRICT p) { return LoadI8(df, p); }
  static HWY_INLINE float One(int8_t q) { return static_cast<float>(q); }
};
struct Fp8Codes {
  using Code = uint8_t;
  static constexpr float kVectorScale = 256.0f;  // LoadFp8 gives the value / 2^8
  static HWY_INLINE VF Load(DF df, const uint8_t* HWY_RESTRICT p) { return LoadFp8(df, p); }
  static HWY_INLINE float One(uint8_t q) { return F8E4M3ToF32(q); }
};

// sums[r] = dot(x row r, dequant(row q)) for MR rows of x (stride xs), the row's k codes scaled
// by s[b] per block b of `block` columns: each weight vector is decoded and scaled once, in
// registers, and used for all MR rows (one row: each block's sum is scaled instead): the int8
// f32 kernel (DH_INTEGER_DOT=off, or CPUs without an integer path).
template <int MR, class Codes>
HWY_INLINE void DotBlocks(const typename Codes::Code* HWY_RESTRICT q, const float* HWY_RESTRICT s,
                          int64_t k, int64_t block, const float* HWY_RESTRICT x, int64_t xs,
                          float* sums) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF acc0[MR], acc1[MR];
  float tail[MR];
  for (int r = 0; r < MR; ++r) {
    acc0[r] = hn::Zero(df);
    acc1[r] = hn::Zero(df);
    tail[r] = 0.0f;
  }
  for (int64_t c0 = 0, bi = 0; c0 < k; c0 += block, ++bi) {
    const int64_t c1 = std::min(k, c0 + block);
    const VF vs = hn::Set(df, s[bi] * Codes::kVectorScale);
    int64_t c = c0;
    if constexpr (MR == 1) {
      // One row of x (decode): the block's products are summed unscaled and scaled once per
      // block, instead of a multiply per weight vector (FP8 M = 1 on Zen 1: 4.3-4.6 -> 3.7 cycles
      // per 8 weights; bench/README.md "Zen 1, session 14").
      VF b0 = hn::Zero(df), b1 = hn::Zero(df);
      for (; c + 2 * L <= c1; c += 2 * L) {
        b0 = hn::MulAdd(Codes::Load(df, q + c), hn::LoadU(df, x + c), b0);
        b1 = hn::MulAdd(Codes::Load(df, q + c + L), hn::LoadU(df, x + c + L), b1);
      }
      for (; c + L <= c1; c += L) b0 = hn::MulAdd(Codes::Load(df, q + c), hn::LoadU(df, x + c), b0);
      acc0[0] = hn::MulAdd(hn::Add(b0, b1), vs, acc0[0]);
    } else {
      for (; c + 2 * L <= c1; c += 2 * L) {
        const VF w0 = hn::Mul(Codes::Load(df, q + c), vs);
        const VF w1 = hn::Mul(Codes::Load(df, q + c + L), vs);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          acc0[r] = hn::MulAdd(w0, hn::LoadU(df, x + r * xs + c), acc0[r]);
          acc1[r] = hn::MulAdd(w1, hn::LoadU(df, x + r * xs + c + L), acc1[r]);
        }
      }
      for (; c + L <= c1; c += L) {
        const VF w0 = hn::Mul(Codes::Load(df, q + c), vs);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          acc0[r] = hn::MulAdd(w0, hn::LoadU(df, x + r * xs + c), acc0[r]);
        }
      }
    }
    for (; c < c1; ++c) {
      const float w = Codes::One(q[c]) * s[bi];
      for (int r = 0; r < MR; ++r) tail[r] += w * x[r * xs + c];
    }
  }
  for (int r = 0; r < MR; ++r) {
    sums[r] = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0[r], acc1[r]))) + tail[r];
  }
}

// out[0, k) = the decoded row of DotBlocks.
template <class Codes>
HWY_INLINE void DequantBlocks(const typename Codes::Code* HWY_RESTRICT q,
                              const float* HWY_RESTRICT s, int64_t k, int64_t block,
                              float* HWY_RESTRICT out) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t c0 = 0, bi = 0; c0 < k; c0 += block, ++bi) {
    const int64_t c1 = std::min(k, c0 + block);
    const VF vs = hn::Set(df, s[bi] * Codes::kVectorScale);
    int64_t c = c0;
    for (; c + L <= c1; c += L) hn::StoreU(hn::Mul(Codes::Load(df, q + c), vs), df, out + c);
    for (; c < c1; ++c) out[c] = Codes::One(q[c]) * s[bi];
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

// sums[r] = dot(x row r, dequant(int4 row)) for MR rows of x, each split into even columns
// (at x + r * xs) and odd columns (at x + r * xs + kb), kb each; the odd half is zero-padded when
// k is odd. gb = bytes per group. Weights are dequantized once, in registers, for all MR rows.
template <int MR>
HWY_INLINE void DotInt4(const uint8_t* HWY_RESTRICT q, const float* HWY_RESTRICT s,
                        const float* HWY_RESTRICT mn, int64_t kb, int64_t gb,
                        const float* HWY_RESTRICT x, int64_t xs, float* sums) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF acc0[MR], acc1[MR];
  float tail[MR];
  for (int r = 0; r < MR; ++r) {
    acc0[r] = hn::Zero(df);
    acc1[r] = hn::Zero(df);
    tail[r] = 0.0f;
  }
  for (int64_t b0 = 0, gi = 0; b0 < kb; b0 += gb, ++gi) {
    const int64_t b1 = std::min(kb, b0 + gb);
    const VF vs = hn::Set(df, s[gi]), vm = hn::Set(df, mn[gi]);
    int64_t b = b0;
    for (; b + L <= b1; b += L) {
      VF lo, hi;
      LoadNibbles(df, q + b, &lo, &hi);
      const VF we = hn::MulAdd(lo, vs, vm), wo = hn::MulAdd(hi, vs, vm);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        acc0[r] = hn::MulAdd(we, hn::LoadU(df, x + r * xs + b), acc0[r]);
        acc1[r] = hn::MulAdd(wo, hn::LoadU(df, x + r * xs + kb + b), acc1[r]);
      }
    }
    for (; b < b1; ++b) {
      const float we = static_cast<float>(q[b] & 15) * s[gi] + mn[gi];
      const float wo = static_cast<float>(q[b] >> 4) * s[gi] + mn[gi];
      for (int r = 0; r < MR; ++r) tail[r] += we * x[r * xs + b] + wo * x[r * xs + kb + b];
    }
  }
  for (int r = 0; r < MR; ++r) {
    sums[r] = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0[r], acc1[r]))) + tail[r];
  }
}

// Dequantizes the int4 columns [0, n) of a row (byte b holds column 2b in its low nibble and
// 2b + 1 in its high one; gb bytes per group) into out[0, n) in column order: each vector of
// bytes gives its even and odd columns, stored interleaved. (Decoding into even and odd halves
// and interleaving them one float at a time had made the int4 f32 GEMM of 8 rows 2.3x slower
// than int8's: bench/README.md "Benchmark weights in huge pages, int4 decoding".)
HWY_INLINE void DequantInt4Row(const uint8_t* HWY_RESTRICT q, const float* HWY_RESTRICT s,
                               const float* HWY_RESTRICT mn, int64_t n, int64_t gb,
                               float* HWY_RESTRICT out) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t whole = n / 2;  // bytes with both columns inside [0, n)
  for (int64_t b0 = 0, gi = 0; b0 < whole; b0 += gb, ++gi) {
    const int64_t b1 = std::min(whole, b0 + gb);
    const VF vs = hn::Set(df, s[gi]), vm = hn::Set(df, mn[gi]);
    int64_t b = b0;
    for (; b + L <= b1; b += L) {
      VF lo, hi;
      LoadNibbles(df, q + b, &lo, &hi);
      hn::StoreInterleaved2(hn::MulAdd(lo, vs, vm), hn::MulAdd(hi, vs, vm), df, out + 2 * b);
    }
    for (; b < b1; ++b) {
      out[2 * b] = static_cast<float>(q[b] & 15) * s[gi] + mn[gi];
      out[2 * b + 1] = static_cast<float>(q[b] >> 4) * s[gi] + mn[gi];
    }
  }
  if (n % 2 != 0) {  // the last column, alone in the low nibble of its byte
    const int64_t gi = whole / gb;
    out[n - 1] = static_cast<float>(q[whole] & 15) * s[gi] + mn[gi];
  }
}

// Widens the f16 scales of groups [g0, g0 + groups) of row j to f32 (s[0, groups)) and, for
// int4, sets mn[i] = -z * s[i].
HWY_INLINE void GroupParams(const QuantMatMulArgs& a, int64_t j, int64_t g0, int64_t groups,
                            float* HWY_RESTRICT s, float* HWY_RESTRICT mn) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const uint16_t* row = a.scales + j * a.scale_stride + g0;
  const auto* h = reinterpret_cast<const hwy::float16_t*>(row);
  int64_t g = 0;
  for (; g + L <= groups; g += L) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, h + g)), df, s + g);
  for (; g < groups; ++g) s[g] = F16ToF32(row[g]);
  if (!a.int4) return;
  const uint8_t* z = a.zeros + j * a.zero_stride;
  for (g = 0; g < groups; ++g) {
    const int zero = ZeroNibble(z, g0 + g) + a.zero_offset;
    mn[g] = -static_cast<float>(zero) * s[g];
  }
}

// Per-thread f32 group parameters of one weight row, grown once.
struct RowParams {
  std::vector<float> s, mn;
  void Fit(int64_t groups) {
    if (static_cast<int64_t>(s.size()) < groups) {
      s.resize(static_cast<size_t>(groups));
      mn.resize(static_cast<size_t>(groups));
    }
  }
};

// Runs Dot<MR> over the weight rows [n_begin, n_end) for x rows [r0, r0 + MR).
template <int MR>
HWY_INLINE void RowBlock(const QuantMatMulArgs& a, const float* x, int64_t xs, int64_t r0,
                         int64_t n_begin, int64_t n_end) {
  const int64_t k = a.k, g = std::min(a.group_size, k);
  const uint8_t* qbase = static_cast<const uint8_t*>(a.q);
  const int64_t kb = (k + 1) / 2, gb = g >= k ? kb : g / 2;
  const int64_t groups = (k + g - 1) / g;
  thread_local RowParams p;
  p.Fit(groups);
  float* s = p.s.data();
  float sums[MR];
  for (int64_t j = n_begin; j < n_end; ++j) {
    GroupParams(a, j, 0, groups, s, p.mn.data());
    if (a.int4) {
      DotInt4<MR>(qbase + j * a.q_stride, s, p.mn.data(), kb, gb, x, xs, sums);
    } else {
      DotBlocks<MR, Int8Codes>(reinterpret_cast<const int8_t*>(qbase + j * a.q_stride), s, k, g, x,
                               xs, sums);
    }
    const float bias = a.bias ? a.bias[j] : 0.0f;
    for (int r = 0; r < MR; ++r) a.out[(r0 + r) * a.out_stride + j] = sums[r] + bias;
  }
}

void QuantMatMulRangeImpl(const QuantMatMulArgs& a, int64_t n_begin, int64_t n_end) {
  const int64_t k = a.k;
  const float* x = a.x;
  int64_t xs = a.x_stride;
  thread_local std::vector<float> split;  // grown once per thread, reused
  if (a.int4) {
    // Split each x row into even and odd columns, zero-padded to kb each.
    const int64_t kb = (k + 1) / 2;
    split.assign(static_cast<size_t>(a.m * 2 * kb), 0.0f);
    for (int64_t r = 0; r < a.m; ++r) {
      const float* xr = a.x + r * a.x_stride;
      float* xe = split.data() + r * 2 * kb;
      for (int64_t c = 0; c < k; ++c) xe[(c % 2) * kb + c / 2] = xr[c];
    }
    x = split.data();
    xs = 2 * kb;
  }
  // Blocks of up to 4 rows of x share each dequantized weight vector.
  int64_t r0 = 0;
  for (; r0 + 4 <= a.m; r0 += 4) RowBlock<4>(a, x + r0 * xs, xs, r0, n_begin, n_end);
  switch (a.m - r0) {
    case 3:
      RowBlock<3>(a, x + r0 * xs, xs, r0, n_begin, n_end);
      break;
    case 2:
      RowBlock<2>(a, x + r0 * xs, xs, r0, n_begin, n_end);
      break;
    case 1:
      RowBlock<1>(a, x + r0 * xs, xs, r0, n_begin, n_end);
      break;
    default:
      break;
  }
}

// Dequantizes columns [c0, c0 + n) of weight rows [row_begin, row_begin + count) into out
// (count x n f32, row-major); c0 starts a group (DequantizeSliceAligned).
void DequantizeRowsImpl(const QuantMatMulArgs& a, int64_t row_begin, int64_t count, int64_t c0,
                        int64_t n, float* out) {
  const int64_t k = a.k, g = std::min(a.group_size, k);
  const uint8_t* qbase = static_cast<const uint8_t*>(a.q);
  const int64_t kb = (n + 1) / 2, gb = g >= k ? kb : g / 2;  // int4: bytes of the slice, a group
  const int64_t g0 = c0 / g, groups = g >= k ? 1 : (n + g - 1) / g;
  thread_local RowParams p;
  p.Fit(groups);
  const float* s = p.s.data();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = row_begin + i;
    GroupParams(a, j, g0, groups, p.s.data(), p.mn.data());
    float* o = out + i * n;
    if (!a.int4) {
      DequantBlocks<Int8Codes>(reinterpret_cast<const int8_t*>(qbase + j * a.q_stride + c0), s, n,
                               g, o);
      continue;
    }
    DequantInt4Row(qbase + j * a.q_stride + c0 / 2, s, p.mn.data(), n, gb, o);
  }
}

// LoadE4M3Over2To120's 2^-120 (weight_load-inl.h), split between x (times 2^60 with its scale)
// and the sums (times 2^60): x * scale stays finite up to 2^68 (3e20; activations are far
// below), and only products under 2^-66 (1e-20) fall into f32 subnormals, each then off by at
// most 2^-90.
constexpr float kFp8HalfShift = 0x1p60f;

// The most weight rows per Fp8Tile on any target (Fp8TileRowsFor, below).
constexpr int kFp8MaxTileRows = 4;

// FP8 weight rows take x pre-scaled (Fp8MatMulRangeImpl): every weight row of one block of
// block_rows rows has the same scale per block of columns, so x * scale is formed once per such
// block (M x K multiplies per block_rows weight rows) and the weight vectors need no multiply.
// Rows of x at xp, xk floats apart, already times the scales and 2^60; kv: the columns taken by
// whole vectors. sums[r][n] = the dot of x row r and weight row n over [0, kv): NR weight rows
// (q_stride bytes apart) are decoded once per vector for MR rows of x, whose MR x NR
// accumulators stay in registers over the whole row. The next tile's rows are prefetched a line
// at a time: NR rows read side by side are NR streams, which this VM's prefetchers did not keep
// full (Zen 5, 8960 x 1536, M = 1 from memory, two threads, best of three: 631 us without the
// prefetch, 291 with it, 431 one weight row at a time).
template <int MR, int NR>
HWY_INLINE void Fp8Tile(const uint8_t* HWY_RESTRICT q, int64_t q_stride,
                        const float* HWY_RESTRICT xp, int64_t xk, int64_t kv,
                        float (*sums)[kFp8MaxTileRows], int n0) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF acc[MR][NR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) acc[r][n] = hn::Zero(df);
  }
  const uint8_t* next = q + NR * q_stride;
  for (int64_t c = 0; c < kv; c += L) {
    if ((c & 63) == 0) {
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) __builtin_prefetch(next + n * q_stride + c, 0, 3);
    }
    VF w[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) w[n] = LoadE4M3Over2To120(df, q + n * q_stride + c);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const VF xv = hn::LoadU(df, xp + r * xk + c);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[r][n] = hn::MulAdd(w[n], xv, acc[r][n]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) {
      sums[r][n0 + n] = hn::GetLane(hn::SumOfLanes(df, acc[r][n])) * kFp8HalfShift;
    }
  }
}

// Weight rows per Fp8Tile for MR rows of x: 4 where 32 vector registers hold the 16
// accumulators of 4 x 4 rows beside the weight vectors (AVX-512), and on 16 registers (AVX2) 4
// for one or two rows of x, 2 for more (8 accumulators). With 2 weight rows per tile at every
// MR (AVX2 until session 44) one row of x ran 2 multiply-add chains, bound by their latency: 4
// ran 1.5-1.7x faster in cache, 1.25-1.35x from memory (bench/README.md "Zen 5, session 44";
// 8 rows per tile on AVX-512 ran no faster than 4). Each output keeps one accumulator summed in
// column order whatever the tile, so a row's bits do not depend on the rows of x or weights
// beside it.
template <int MR>
constexpr int Fp8TileRowsFor() {
  if (HWY_MAX_BYTES >= 64) return 4;
  return MR <= 2 ? 4 : 2;
}

// Weight rows [j0, j0 + nr) (nr <= kFp8MaxTileRows, one block of block_rows) against x rows
// [r0, r0 + MR), pre-scaled at xp (row r0's first): the outputs, with the last k % L columns
// added one code at a time.
template <int MR>
HWY_INLINE void Fp8Rows(const Fp8MatMulArgs& a, const float* HWY_RESTRICT xp, int64_t xk,
                        int64_t r0, int64_t j0, int64_t nr) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t kv = a.k / L * L;
  constexpr int kMax = Fp8TileRowsFor<MR>();
  const uint8_t* q = a.q + j0 * a.q_stride;
  float sums[MR][kFp8MaxTileRows];
  for (int n0 = 0; n0 < nr;) {
    const int64_t left = nr - n0;
    const uint8_t* qn = q + n0 * a.q_stride;
    if constexpr (kMax >= 4) {
      if (left >= 4) {
        Fp8Tile<MR, 4>(qn, a.q_stride, xp, xk, kv, sums, n0);
        n0 += 4;
        continue;
      }
      if (left == 3) {
        Fp8Tile<MR, 3>(qn, a.q_stride, xp, xk, kv, sums, n0);
        n0 += 3;
        continue;
      }
    }
    if (left >= 2) {
      Fp8Tile<MR, 2>(qn, a.q_stride, xp, xk, kv, sums, n0);
      n0 += 2;
    } else {
      Fp8Tile<MR, 1>(qn, a.q_stride, xp, xk, kv, sums, n0);
      n0 += 1;
    }
  }
  for (int64_t n = 0; n < nr; ++n) {
    const float bias = a.bias ? a.bias[j0 + n] : 0.0f;
    for (int r = 0; r < MR; ++r) {
      float tail = 0.0f;
      for (int64_t c = kv; c < a.k; ++c) {
        tail += Fp8Codes::One(q[n * a.q_stride + c]) * xp[r * xk + c];
      }
      a.out[(r0 + r) * a.out_stride + j0 + n] = sums[r][n] + tail / kFp8HalfShift + bias;
    }
  }
}

// Every weight row of [n_begin, n_end) against every row of x: per block of block_rows weight
// rows, x times that block's column scales (and 2^60) into a per-thread buffer (M x K), then
// tiles of up to 4 weight rows (Fp8TileRowsFor) against up to 4 rows of x at a time. Zen 5,
// 8960 x 1536 from memory, two threads, against the f16-decoding row kernel (M <= 3) and the
// GEMM over decoded panels (M >= 4) it replaced, three rounds (bench/README.md "Zen 5, session
// 38"): M = 1 426 -> 346 us, 2 1203 -> 356, 4 1710 -> 443, 8 2174 -> 1072, 16 3119 -> 1760, 32
// 4872 -> 3294.
void Fp8MatMulRangeImpl(const Fp8MatMulArgs& a, int64_t n_begin, int64_t n_end) {
  const int64_t k = a.k, m = a.m, bc = a.block_cols, br = a.block_rows;
  thread_local std::vector<float> scaled;  // grown once per thread
  if (static_cast<int64_t>(scaled.size()) < m * k) scaled.resize(static_cast<size_t>(m * k));
  float* xp = scaled.data();
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t b0 = n_begin / br * br; b0 < n_end; b0 += br) {
    const float* s = a.scales + (b0 / br) * a.scale_stride;
    for (int64_t r = 0; r < m; ++r) {
      const float* x = a.x + r * a.x_stride;
      float* o = xp + r * k;
      for (int64_t c0 = 0, bi = 0; c0 < k; c0 += bc, ++bi) {
        const int64_t c1 = std::min(k, c0 + bc);
        const float sb = s[bi] * kFp8HalfShift;
        const VF vs = hn::Set(df, sb);
        int64_t c = c0;
        for (; c + L <= c1; c += L) hn::StoreU(hn::Mul(hn::LoadU(df, x + c), vs), df, o + c);
        for (; c < c1; ++c) o[c] = x[c] * sb;
      }
    }
    const int64_t j_end = std::min(n_end, b0 + br);
    for (int64_t j = std::max(n_begin, b0); j < j_end; j += kFp8MaxTileRows) {
      const int64_t nr = std::min<int64_t>(kFp8MaxTileRows, j_end - j);
      int64_t r0 = 0;
      for (; r0 + 4 <= m; r0 += 4) Fp8Rows<4>(a, xp + r0 * k, k, r0, j, nr);
      switch (m - r0) {
        case 3: Fp8Rows<3>(a, xp + r0 * k, k, r0, j, nr); break;
        case 2: Fp8Rows<2>(a, xp + r0 * k, k, r0, j, nr); break;
        case 1: Fp8Rows<1>(a, xp + r0 * k, k, r0, j, nr); break;
        default: break;
      }
    }
  }
}

int64_t Fp8FusedMaxRowsImpl() { return HWY_MAX_BYTES >= 64 ? 32 : 8; }

// Columns [c0, c0 + n) of rows [row_begin, row_begin + count) into out (count x n); c0 starts a
// block.
void Fp8DequantizeRowsImpl(const Fp8MatMulArgs& a, int64_t row_begin, int64_t count, int64_t c0,
                           int64_t n, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = row_begin + i;
    DequantBlocks<Fp8Codes>(a.q + j * a.q_stride + c0,
                            a.scales + (j / a.block_rows) * a.scale_stride + c0 / a.block_cols, n,
                            a.block_cols, out + i * n);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dh::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "base/check.h"

namespace dh::cpu {

HWY_EXPORT(QuantMatMulRangeImpl);
HWY_EXPORT(DequantizeRowsImpl);
HWY_EXPORT(Fp8MatMulRangeImpl);
HWY_EXPORT(Fp8FusedMaxRowsImpl);
HWY_EXPORT(Fp8DequantizeRowsImpl);

bool DequantizeSliceAligned(const QuantMatMulArgs& a, int64_t col_begin) {
  const int64_t g = std::min(a.group_size, a.k);
  return col_begin == 0 || ((g >= a.k || col_begin % g == 0) && (!a.int4 || col_begin % 2 == 0));
}

void DequantizeRows(const QuantMatMulArgs& a, int64_t row_begin, int64_t count, float* out,
                    int64_t col_begin, int64_t col_count) {
  DH_CHECK(QuantMatMulSupports(a.int4, a.k, a.group_size), "dequantize rows: {} k={} group={}",
           a.int4 ? "int4" : "int8", a.k, a.group_size);
  if (col_count < 0) col_count = a.k - col_begin;
  DH_CHECK(col_begin >= 0 && col_begin + col_count <= a.k && DequantizeSliceAligned(a, col_begin),
           "dequantize rows: columns [{}, +{}) of k={} group={}", col_begin, col_count, a.k,
           a.group_size);
  if (count <= 0 || col_count <= 0) return;
  HWY_DYNAMIC_DISPATCH(DequantizeRowsImpl)(a, row_begin, count, col_begin, col_count, out);
}

void Fp8MatMulRange(const Fp8MatMulArgs& a, int64_t n_begin, int64_t n_end) {
  DH_CHECK(a.block_rows > 0 && a.block_cols > 0 && a.k > 0, "fp8 matmul: k={} block {}x{}", a.k,
           a.block_rows, a.block_cols);
  if (n_begin >= n_end || a.m <= 0) return;
  HWY_DYNAMIC_DISPATCH(Fp8MatMulRangeImpl)(a, n_begin, n_end);
}

int64_t Fp8FusedMaxRows() { return HWY_DYNAMIC_DISPATCH(Fp8FusedMaxRowsImpl)(); }

bool Fp8DequantizeSliceAligned(const Fp8MatMulArgs& a, int64_t col_begin) {
  return a.block_cols > 0 && col_begin % a.block_cols == 0;
}

void Fp8DequantizeRows(const Fp8MatMulArgs& a, int64_t row_begin, int64_t count, float* out,
                       int64_t col_begin, int64_t col_count) {
  DH_CHECK(a.block_rows > 0 && a.block_cols > 0 && a.k > 0, "fp8 dequantize: k={} block {}x{}",
           a.k, a.block_rows, a.block_cols);
  if (col_count < 0) col_count = a.k - col_begin;
  DH_CHECK(col_begin >= 0 && col_begin + col_count <= a.k &&
               Fp8DequantizeSliceAligned(a, col_begin),
           "fp8 dequantize: columns [{}, +{}) of k={} blocks of {}", col_begin, col_count, a.k,
           a.block_cols);
  if (count <= 0 || col_count <= 0) return;
  HWY_DYNAMIC_DISPATCH(Fp8DequantizeRowsImpl)(a, row_begin, count, col_begin, col_count, out);
}

void QuantMatMulRange(const QuantMatMulArgs& a, int64_t n_begin, int64_t n_end) {
  DH_CHECK(QuantMatMulSupports(a.int4, a.k, a.group_size), "quant matmul: {} k={} group={}",
           a.int4 ? "int4" : "int8", a.k, a.group_size);
  if (n_begin >= n_end || a.m <= 0) return;
  HWY_DYNAMIC_DISPATCH(QuantMatMulRangeImpl)(a, n_begin, n_end);
}

}  // namespace dh::cpu
#endif  // HWY_ONCE
