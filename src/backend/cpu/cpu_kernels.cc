// Per-SIMD-target kernels of CpuBackend (Highway, compiled once per target via foreach_target.h
// and chosen at run time by HWY_DYNAMIC_DISPATCH). All arithmetic is f32 with f32 accumulation.
#include "backend/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/dtype.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/cpu_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

#include "backend/cpu/weight_load-inl.h"  // after highway.h: per-target code

HWY_BEFORE_NAMESPACE();
namespace dh::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

HWY_INLINE float Sum(DF df, VF v) { return hn::GetLane(hn::SumOfLanes(df, v)); }

// Bytes ahead of the weight loads that the GEMV prefetches, one cache line per line it loads
// (0: none). On AVX2 2048: on Zen 1 the hardware prefetchers alone kept one stream per thread at
// about half the read probe (bf16 1 x 1536 x 1536, 2 threads: 16.6-18.9 -> 19.8-21.5 GB/s;
// 512-8192 bytes ahead measured, 2048-4096 best). The AVX3 kernel does not (on Zen 5 software
// prefetch made it slower, docs/kernels.md "Dense GEMV").
#if HWY_TARGET == HWY_AVX2
constexpr int64_t kPrefetchAhead = 2048;
#else
constexpr int64_t kPrefetchAhead = 0;
#endif

// Rows [r0, r0 + MR) of x against weight row j: four accumulators over k per x row, summed the
// same way for every MR, so a row's result does not depend on the rows sharing the call.
template <int MR, typename WT>
HWY_INLINE void StreamDot(const MatMulArgs& a, const WT* HWY_RESTRICT wr, int64_t j, int64_t r0) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t xs = a.x_stride;
  const float* HWY_RESTRICT x = a.x + r0 * xs;
  VF acc[MR][4];
  HWY_UNROLL(4)
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = hn::Zero(df);
  int64_t i = 0;
  for (; i + 4 * lanes <= a.k; i += 4 * lanes) {
    if constexpr (kPrefetchAhead > 0) {
      const char* p = reinterpret_cast<const char*>(wr + i) + kPrefetchAhead;
      constexpr int64_t kBytes = 4 * static_cast<int64_t>(hn::MaxLanes(DF())) * sizeof(WT);
      HWY_UNROLL(4)
      for (int64_t l = 0; l < kBytes; l += 64) hwy::Prefetch(p + l);
    }
    HWY_UNROLL(4)
    for (int u = 0; u < 4; ++u) {
      const VF wv = LoadW(df, wr + i + u * lanes);
      HWY_UNROLL(4)
      for (int r = 0; r < MR; ++r) {
        acc[r][u] = hn::MulAdd(hn::LoadU(df, x + r * xs + i + u * lanes), wv, acc[r][u]);
      }
    }
  }
  for (; i + lanes <= a.k; i += lanes) {
    const VF wv = LoadW(df, wr + i);
    HWY_UNROLL(4)
    for (int r = 0; r < MR; ++r) acc[r][0] = hn::MulAdd(hn::LoadU(df, x + r * xs + i), wv, acc[r][0]);
  }
  HWY_UNROLL(4)
  for (int r = 0; r < MR; ++r) {
    float s = Sum(df, hn::Add(hn::Add(acc[r][0], acc[r][1]), hn::Add(acc[r][2], acc[r][3])));
    for (int64_t t = i; t < a.k; ++t) s += x[r * xs + t] * WeightAt(wr + t);
    a.out[(r0 + r) * a.out_stride + j] = s + (a.bias ? a.bias[j] : 0.0f);
  }
}

// The GEMV of few rows of x (decode): weight rows [j_begin, j_end) one at a time, so the weights
// are read as one sequential stream (with several weight rows in flight, each a stream of its
// own, this machine's prefetchers fell to about half the read rate); every group of up to 4 x
// rows passes over a weight row while it is in L1.
template <typename WT>
HWY_INLINE void RunRowsStream(const MatMulArgs& a, const WT* w, int64_t j_begin, int64_t j_end) {
  for (int64_t j = j_begin; j < j_end; ++j) {
    const WT* wr = w + j * a.w_stride;
    int64_t r = 0;
    for (; r + 4 <= a.m; r += 4) StreamDot<4>(a, wr, j, r);
    switch (a.m - r) {
      case 3: StreamDot<3>(a, wr, j, r); break;
      case 2: StreamDot<2>(a, wr, j, r); break;
      case 1: StreamDot<1>(a, wr, j, r); break;
      default: break;
    }
  }
}

// Any number of rows of x streams the same way (CpuBackend::MatMul sends only up to
// kGemvMaxRows here; more go to the tiled GEMM, gemm.h).
template <typename WT>
void MatMulTyped(const MatMulArgs& a, int64_t n_begin, int64_t n_end) {
  RunRowsStream(a, static_cast<const WT*>(a.w), n_begin, n_end);
}

void MatMulRange(const MatMulArgs& a, int64_t n_begin, int64_t n_end) {
  switch (a.wtype) {
    case WType::kF32: return MatMulTyped<float>(a, n_begin, n_end);
    case WType::kBF16: return MatMulTyped<hwy::bfloat16_t>(a, n_begin, n_end);
    case WType::kF16: return MatMulTyped<hwy::float16_t>(a, n_begin, n_end);
  }
}

float SumOfSquares(const float* HWY_RESTRICT x, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  VF acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const VF a = hn::LoadU(df, x + i), b = hn::LoadU(df, x + i + lanes);
    acc0 = hn::MulAdd(a, a, acc0);
    acc1 = hn::MulAdd(b, b, acc1);
  }
  for (; i + lanes <= n; i += lanes) {
    const VF a = hn::LoadU(df, x + i);
    acc0 = hn::MulAdd(a, a, acc0);
  }
  float s = Sum(df, hn::Add(acc0, acc1));
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

template <typename WT>
void ScaleByWeightTyped(const float* HWY_RESTRICT x, float inv, const WT* HWY_RESTRICT w,
                        float* out, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const VF vinv = hn::Set(df, inv);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, x + i), vinv), LoadW(df, w + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] = x[i] * inv * WeightAt(w + i);
}

void ScaleByWeight(const float* x, float inv, const void* w, WType wtype, float* out, int64_t n) {
  switch (wtype) {
    case WType::kF32: return ScaleByWeightTyped(x, inv, static_cast<const float*>(w), out, n);
    case WType::kBF16:
      return ScaleByWeightTyped(x, inv, static_cast<const hwy::bfloat16_t*>(w), out, n);
    case WType::kF16:
      return ScaleByWeightTyped(x, inv, static_cast<const hwy::float16_t*>(w), out, n);
  }
}

void AddRow(const float* a, const float* b, float* out, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(df, a + i), hn::LoadU(df, b + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] = a[i] + b[i];
}

void SiluMulRow(const float* gate, const float* up, float* out, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const VF one = hn::Set(df, 1.0f);
  // Exp is valid up to +104; beyond 88 silu is 0 in f32 anyway.
  const VF limit = hn::Set(df, 88.0f);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const VF g = hn::LoadU(df, gate + i);
    const VF silu = hn::Div(g, hn::Add(one, hn::Exp(df, hn::Min(hn::Neg(g), limit))));
    hn::StoreU(hn::Mul(silu, hn::LoadU(df, up + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

template <typename WT>
void WidenRowTyped(const WT* HWY_RESTRICT src, float* HWY_RESTRICT out, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(LoadW(df, src + i), df, out + i);
  for (; i < n; ++i) out[i] = WeightAt(src + i);
}

void WidenRow(const void* src, WType wtype, float* out, int64_t n) {
  switch (wtype) {
    case WType::kF32: return WidenRowTyped(static_cast<const float*>(src), out, n);
    case WType::kBF16: return WidenRowTyped(static_cast<const hwy::bfloat16_t*>(src), out, n);
    case WType::kF16: return WidenRowTyped(static_cast<const hwy::float16_t*>(src), out, n);
  }
}

uint64_t SumWords(const uint64_t* HWY_RESTRICT p, int64_t n) {
  const hn::ScalableTag<uint64_t> du;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  auto a0 = hn::Zero(du), a1 = hn::Zero(du), a2 = hn::Zero(du), a3 = hn::Zero(du);
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    a0 = hn::Add(a0, hn::LoadU(du, p + i));
    a1 = hn::Add(a1, hn::LoadU(du, p + i + lanes));
    a2 = hn::Add(a2, hn::LoadU(du, p + i + 2 * lanes));
    a3 = hn::Add(a3, hn::LoadU(du, p + i + 3 * lanes));
  }
  uint64_t s = hn::GetLane(hn::SumOfLanes(du, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) s += p[i];
  return s;
}

uint64_t SumWordsTwoStreams(const uint64_t* HWY_RESTRICT p, int64_t n) {
  const hn::ScalableTag<uint64_t> du;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  const int64_t half = n / 2 / (2 * lanes) * (2 * lanes);
  const uint64_t* HWY_RESTRICT q = p + half;
  auto a0 = hn::Zero(du), a1 = hn::Zero(du), b0 = hn::Zero(du), b1 = hn::Zero(du);
  for (int64_t i = 0; i < half; i += 2 * lanes) {
    a0 = hn::Add(a0, hn::LoadU(du, p + i));
    b0 = hn::Add(b0, hn::LoadU(du, q + i));
    a1 = hn::Add(a1, hn::LoadU(du, p + i + lanes));
    b1 = hn::Add(b1, hn::LoadU(du, q + i + lanes));
  }
  uint64_t s = hn::GetLane(hn::SumOfLanes(du, hn::Add(hn::Add(a0, a1), hn::Add(b0, b1))));
  for (int64_t i = 2 * half; i < n; ++i) s += p[i];
  return s;
}

const char* TargetNameHere() { return hwy::TargetName(HWY_TARGET); }

bool IsAvx512Here() {
#if HWY_ARCH_X86
  return HWY_TARGET <= HWY_AVX3;  // lower bits are better targets: AVX3 and every one above it
#else
  return false;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace dh::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dh::cpu {

HWY_EXPORT(MatMulRange);
HWY_EXPORT(SumOfSquares);
HWY_EXPORT(ScaleByWeight);
HWY_EXPORT(AddRow);
HWY_EXPORT(SiluMulRow);
HWY_EXPORT(WidenRow);
HWY_EXPORT(SumWords);
HWY_EXPORT(SumWordsTwoStreams);
HWY_EXPORT(TargetNameHere);
HWY_EXPORT(IsAvx512Here);

void MatMulRange(const MatMulArgs& a, int64_t n_begin, int64_t n_end) {
  HWY_DYNAMIC_DISPATCH(MatMulRange)(a, n_begin, n_end);
}
float SumOfSquares(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(SumOfSquares)(x, n); }
void ScaleByWeight(const float* x, float inv, const void* w, WType wtype, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ScaleByWeight)(x, inv, w, wtype, out, n);
}
void AddRow(const float* a, const float* b, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddRow)(a, b, out, n);
}
void SiluMulRow(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMulRow)(gate, up, out, n);
}
void WidenRow(const void* src, WType wtype, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(WidenRow)(src, wtype, out, n);
}
uint64_t SumWords(const uint64_t* p, int64_t n) { return HWY_DYNAMIC_DISPATCH(SumWords)(p, n); }
uint64_t SumWordsTwoStreams(const uint64_t* p, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(SumWordsTwoStreams)(p, n);
}
const char* DispatchedTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameHere)(); }
bool DispatchesAvx512() { return HWY_DYNAMIC_DISPATCH(IsAvx512Here)(); }

}  // namespace dh::cpu
#endif  // HWY_ONCE
