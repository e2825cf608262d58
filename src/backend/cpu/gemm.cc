// Tiled GEMM (see gemm.h) and the FMA peak probe; the per-target parts are compiled once per SIMD
// target (foreach_target.h) and chosen at run time by HWY_DYNAMIC_DISPATCH.
#include "backend/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "backend/cpu/gemm_bf16.h"
#include "tensor/dtype.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/gemm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"

#include "backend/cpu/weight_load-inl.h"  // after highway.h: per-target code

HWY_BEFORE_NAMESPACE();
namespace dh::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using GDF = hn::ScalableTag<float>;
using GVF = hn::Vec<GDF>;

// Micro-tile: kMR rows of x by kNR weight rows, kMR * kNR vector accumulators. AVX3 has 32
// vector registers (24 accumulators + 8 x vectors would not all fit, but each x vector is
// loaded just before its kNR uses); the 16-register targets take 4 x 2.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr int kMR = 8;
constexpr int kNR = 3;
#else
constexpr int kMR = 4;
constexpr int kNR = 2;
#endif

// Keeps v in a register: without it GCC folds the load of an x vector into each of its kNR FMAs
// (kMR * kNR loads per step instead of kMR), and the loads, not the FMAs, set the pace.
HWY_INLINE GVF InRegister(GVF v) {
#if defined(__GNUC__) && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || \
                          HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4)
  asm("" : "+v"(v.raw));
#endif
  return v;
}

// out[r * os + c] (=, or += when accumulate) dot(x row r, w row c) over kn columns for an
// MR x NR tile; bias (indexed by c, may be null) is added when not accumulating. With
// kPrefetch, the NR weight rows after the tile (the next tile's, same columns) are prefetched,
// one cache line per row as the tile consumes one: this machine's hardware prefetchers do not
// run ahead of a stream that is consumed slowly (8 x rows per weight vector), and the core's
// own window then holds too few lines in flight (bench/README.md "Batched decode").
template <int MR, int NR, bool kPrefetch, typename WT>
HWY_INLINE void GemmTile(const float* HWY_RESTRICT x, int64_t xs, const WT* HWY_RESTRICT w,
                         int64_t ws, int64_t kn, float* HWY_RESTRICT out, int64_t os,
                         const float* HWY_RESTRICT bias, bool accumulate) {
  const GDF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  GVF acc[MR][NR];
  HWY_UNROLL(8)
  for (int r = 0; r < MR; ++r) {
    HWY_UNROLL(4)
    for (int c = 0; c < NR; ++c) acc[r][c] = hn::Zero(df);
  }
  int64_t i = 0;
  for (; i + lanes <= kn; i += lanes) {
    if (kPrefetch && (i * static_cast<int64_t>(sizeof(WT))) % 64 == 0) {
      HWY_UNROLL(4)
      for (int c = 0; c < NR; ++c) hwy::Prefetch(w + (NR + c) * ws + i);
    }
    GVF wv[NR];
    HWY_UNROLL(4)
    for (int c = 0; c < NR; ++c) wv[c] = InRegister(LoadW(df, w + c * ws + i));
    HWY_UNROLL(8)
    for (int r = 0; r < MR; ++r) {
      const GVF xv = InRegister(hn::LoadU(df, x + r * xs + i));
      HWY_UNROLL(4)
      for (int c = 0; c < NR; ++c) acc[r][c] = hn::MulAdd(xv, wv[c], acc[r][c]);
    }
  }
  HWY_UNROLL(8)
  for (int r = 0; r < MR; ++r) {
    HWY_UNROLL(4)
    for (int c = 0; c < NR; ++c) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[r][c]));
      for (int64_t j = i; j < kn; ++j) s += x[r * xs + j] * WeightAt(w + c * ws + j);
      float& o = out[r * os + c];
      o = accumulate ? o + s : s + (bias ? bias[c] : 0.0f);
    }
  }
}

// MR rows of x against nb weight rows, NR at a time (when prefetch, each tile prefetching the
// next, within the block).
template <int MR, typename WT>
HWY_INLINE void GemmRows(const float* x, int64_t xs, const WT* w, int64_t ws, int64_t nb,
                         int64_t kn, float* out, int64_t os, const float* bias, bool accumulate,
                         bool prefetch) {
  int64_t c = 0;
  for (; c + kNR <= nb; c += kNR) {
    const float* b = bias ? bias + c : nullptr;
    if (prefetch && c + 2 * kNR <= nb) {
      GemmTile<MR, kNR, true>(x, xs, w + c * ws, ws, kn, out + c, os, b, accumulate);
    } else {
      GemmTile<MR, kNR, false>(x, xs, w + c * ws, ws, kn, out + c, os, b, accumulate);
    }
  }
  for (; c < nb; ++c) {
    GemmTile<MR, 1, false>(x, xs, w + c * ws, ws, kn, out + c, os, bias ? bias + c : nullptr,
                           accumulate);
  }
}

// GemmRows for mr (1..MR) rows.
template <int MR, typename WT>
HWY_INLINE void GemmRowsUpTo(int64_t mr, const float* x, int64_t xs, const WT* w, int64_t ws,
                             int64_t nb, int64_t kn, float* out, int64_t os, const float* bias,
                             bool accumulate, bool prefetch) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      return GemmRowsUpTo<MR - 1>(mr, x, xs, w, ws, nb, kn, out, os, bias, accumulate, prefetch);
    }
  }
  GemmRows<MR>(x, xs, w, ws, nb, kn, out, os, bias, accumulate, prefetch);
}

// x rows per pass over a block of weight rows: kMR, unless their kn columns overflow
// kXTileBytes (~2/3 of L1, the rest for the weights passing through) while half as many fit:
// then each half passes over the block in turn, the block staying in L2 after the first pass.
// (Decode of 5-8 sequences with 1536 columns: +20-30 % in bench_ops, bench/README.md "Batched
// decode"; with more columns than that even half a tile overflows L1, and one pass is faster.)
constexpr int64_t kXTileBytes = 32 * 1024;
int64_t GemmTileRows(int64_t kn) {
  const int64_t row_bytes = kn * static_cast<int64_t>(sizeof(float));
  if (kMR * row_bytes > kXTileBytes && kMR / 2 * row_bytes <= kXTileBytes) return kMR / 2;
  return kMR;
}

// Every row of x against weight rows [j0, j0 + nb), columns [k0, k0 + kn); w points at (j0, k0).
// Only the first pass prefetches: the block is in L2 for the later ones (prefetching there made
// prefill, 512 rows, 10-20 % slower).
template <typename WT>
void GemmPass(const GemmArgs& a, const WT* w, int64_t ws, int64_t j0, int64_t nb, int64_t k0,
              int64_t kn) {
  const bool accumulate = k0 > 0;
  const float* bias = a.bias ? a.bias + j0 : nullptr;
  const int64_t tile_rows = GemmTileRows(kn);
  for (int64_t r = 0; r < a.m; r += tile_rows) {
    GemmRowsUpTo<kMR>(std::min<int64_t>(tile_rows, a.m - r), a.x + r * a.x_stride + k0,
                      a.x_stride, w, ws, nb, kn, a.out + r * a.out_stride + j0, a.out_stride, bias,
                      accumulate, r == 0);
  }
}

// Output features [j0, j0 + nb) for all rows; buf holds nb x kGemmKc floats when a.rows_fn is set.
void GemmBlock(const GemmArgs& a, int64_t j0, int64_t nb, int64_t kc, float* buf) {
  if (a.k == 0) {
    for (int64_t r = 0; r < a.m; ++r) {
      for (int64_t c = 0; c < nb; ++c) a.out[r * a.out_stride + j0 + c] = a.bias ? a.bias[j0 + c] : 0;
    }
    return;
  }
  for (int64_t k0 = 0; k0 < a.k; k0 += kc) {
    const int64_t kn = std::min<int64_t>(kc, a.k - k0);
    if (a.rows_fn != nullptr) {
      (*a.rows_fn)(j0, nb, k0, kn, buf);
      GemmPass(a, static_cast<const float*>(buf), kn, j0, nb, k0, kn);
      continue;
    }
    const int64_t off = j0 * a.w_stride + k0;
    switch (a.wtype) {
      case WType::kF32:
        GemmPass(a, static_cast<const float*>(a.w) + off, a.w_stride, j0, nb, k0, kn);
        break;
      case WType::kBF16:
        GemmPass(a, static_cast<const hwy::bfloat16_t*>(a.w) + off, a.w_stride, j0, nb, k0, kn);
        break;
      case WType::kF16:
        GemmPass(a, static_cast<const hwy::float16_t*>(a.w) + off, a.w_stride, j0, nb, k0, kn);
        break;
    }
  }
}

constexpr int kProbeChains = 12;  // > FMA latency x FMA pipes of current x86 cores

float FmaProbe(int64_t iters) {
  const GDF df;
  GVF acc[kProbeChains];
  HWY_UNROLL(12)
  for (int c = 0; c < kProbeChains; ++c) acc[c] = hn::Set(df, 1.0f + 0.001f * c);
  const GVF mul = hn::Set(df, 0.999999f), add = hn::Set(df, 1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    HWY_UNROLL(12)
    for (int c = 0; c < kProbeChains; ++c) acc[c] = hn::MulAdd(acc[c], mul, add);
  }
  GVF s = acc[0];
  for (int c = 1; c < kProbeChains; ++c) s = hn::Add(s, acc[c]);
  return hn::GetLane(hn::SumOfLanes(df, s));
}

int64_t FmaProbeFlops(int64_t iters) {
  return iters * kProbeChains * 2 * static_cast<int64_t>(hn::Lanes(GDF()));
}

}  // namespace HWY_NAMESPACE
}  // namespace dh::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dh::cpu {

HWY_EXPORT(GemmBlock);
HWY_EXPORT(FmaProbe);
HWY_EXPORT(FmaProbeFlops);

namespace {
constexpr int64_t kMaxBlockRows = 96;  // a multiple of every target's kNR (2, 3)
constexpr int64_t kBlockRowsUnit = 6;
}  // namespace

int64_t GemmMaxBlockRows() { return kMaxBlockRows; }

int64_t GemmKc(int64_t m, int64_t k, bool rows_fn) {
  // One x tile (m <= 8): whole rows, so the weight is read as long sequential streams.
  if (m <= 8 && !rows_fn) return std::max<int64_t>(k, 1);
  // Else equal blocks of at most kGemmKcMax columns, rounded up to kGemmKcUnit.
  const int64_t blocks = std::max<int64_t>(1, (k + kGemmKcMax - 1) / kGemmKcMax);
  const int64_t kc = (k + blocks - 1) / blocks;
  return (kc + kGemmKcUnit - 1) / kGemmKcUnit * kGemmKcUnit;
}

void Gemm(const GemmArgs& a, ThreadPool& pool) {
  if (a.m <= 0 || a.n <= 0) return;
  if (UseBf16Dot(a)) return Bf16DotGemm(a, pool);  // bf16 weights on AVX512-BF16 (gemm_bf16.h)
  const int64_t threads = pool.num_threads();
  // Blocks of output features: at most kMaxBlockRows (the weight block, kMaxBlockRows x kGemmKc,
  // stays in L2), and at least ~4 per thread so the dynamic hand-out can balance.
  int64_t nb = (a.n + 4 * threads - 1) / (4 * threads);
  nb = std::clamp<int64_t>((nb + kBlockRowsUnit - 1) / kBlockRowsUnit * kBlockRowsUnit,
                           kBlockRowsUnit, kMaxBlockRows);
  const int64_t blocks = (a.n + nb - 1) / nb;
  const int64_t kc = GemmKc(a.m, a.k, a.rows_fn != nullptr);
  std::atomic<int64_t> next{0};
  auto work = [&](int) {
    std::vector<float> buf(a.rows_fn != nullptr ? nb * kc : 0);
    for (int64_t b = next.fetch_add(1); b < blocks; b = next.fetch_add(1)) {
      const int64_t j0 = b * nb;
      HWY_DYNAMIC_DISPATCH(GemmBlock)(a, j0, std::min(nb, a.n - j0), kc, buf.data());
    }
  };
  if (threads <= 1 || blocks == 1 || a.m * a.n * a.k < kGemmMinParallelWork) return work(0);
  pool.RunOnAll(work);
}

float FmaProbe(int64_t iters) { return HWY_DYNAMIC_DISPATCH(FmaProbe)(iters); }
int64_t FmaProbeFlops(int64_t iters) { return HWY_DYNAMIC_DISPATCH(FmaProbeFlops)(iters); }

}  // namespace dh::cpu
#endif  // HWY_ONCE
