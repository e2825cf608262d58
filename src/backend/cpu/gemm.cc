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

#include "backend/cpu/outer_tile-inl.h"   // after highway.h: per-target code
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

// Packed panels (the 16-register targets, GemmPackedMinRows+ rows of x: prefill). The tile above
// sums dot products along k within vector lanes and so loads an x vector for every kNR weight
// vectors: at 4 x 2 on a 16-register target, 8 FMAs per 6 vector loads plus the widening of the
// bf16 weights, repeated for every 4 rows of x. Here the weight block is widened once into
// panels of kPNV vectors of output features per column ([column][feature], kGemmPackKc columns of a
// panel = 16 KiB on AVX2, in L1), and the micro-tile broadcasts one x value per row and column:
// kPMR x kPNV accumulators hold outputs themselves (no horizontal sums), 12 FMAs per 2 vector
// loads and 6 broadcasts on AVX2. AVX3 keeps the tile above (not measured on an AVX-512 machine
// since this was written).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr bool kPackedPanels = false;
#else
constexpr bool kPackedPanels = true;
#endif
constexpr int kPMR = 6;           // rows of x per packed micro-tile
constexpr int kPNV = 2;           // vectors of output features per panel
constexpr int64_t kPackMc = 192;  // rows of x per pass over a block (192 KiB of x, in L2)

HWY_INLINE int64_t PanelWidth() { return kPNV * static_cast<int64_t>(hn::Lanes(GDF())); }

#if HWY_TARGET != HWY_SCALAR
// r[i][c] -> r[c][i] for L x L floats, L = 4 or 8 lanes: 4 x 4 within each 128-bit block, then
// (L = 8) the blocks' halves exchanged.
template <size_t L>
HWY_INLINE void TransposeSquare(GVF* r) {
  const GDF df;
  const hn::Repartition<uint64_t, GDF> d64;
  for (size_t q = 0; q < L; q += 4) {
    const GVF t0 = hn::InterleaveLower(df, r[q], r[q + 1]);
    const GVF t1 = hn::InterleaveLower(df, r[q + 2], r[q + 3]);
    const GVF t2 = hn::InterleaveUpper(df, r[q], r[q + 1]);
    const GVF t3 = hn::InterleaveUpper(df, r[q + 2], r[q + 3]);
    const auto u0 = hn::BitCast(d64, t0), u1 = hn::BitCast(d64, t1);
    const auto u2 = hn::BitCast(d64, t2), u3 = hn::BitCast(d64, t3);
    r[q] = hn::BitCast(df, hn::InterleaveLower(d64, u0, u1));
    r[q + 1] = hn::BitCast(df, hn::InterleaveUpper(d64, u0, u1));
    r[q + 2] = hn::BitCast(df, hn::InterleaveLower(d64, u2, u3));
    r[q + 3] = hn::BitCast(df, hn::InterleaveUpper(d64, u2, u3));
  }
  if constexpr (L == 8) {
    for (size_t t = 0; t < 4; ++t) {
      const GVF lo = hn::ConcatLowerLower(df, r[4 + t], r[t]);
      const GVF hi = hn::ConcatUpperUpper(df, r[4 + t], r[t]);
      r[t] = lo;
      r[4 + t] = hi;
    }
  }
}
#endif

// Weight rows [0, nb) of w (ws elements apart), columns [0, kn), as f32 panels: dst[(p * kn + c)
// * pw + j] = w[p * pw + j][c], zero past row nb. Squares of L x L weights are widened and
// transposed in registers (L = 4 or 8 lanes); the ragged edges go one weight at a time.
template <typename WT>
void PackPanels(const WT* HWY_RESTRICT w, int64_t ws, int64_t nb, int64_t kn,
                float* HWY_RESTRICT dst) {
  const int64_t pw = PanelWidth();
  int64_t full_rows = 0, full_cols = 0;
#if HWY_TARGET != HWY_SCALAR
  constexpr size_t L = hn::MaxLanes(GDF());
  if constexpr (L == 4 || L == 8) {
    const GDF df;
    constexpr int64_t l = static_cast<int64_t>(L);
    full_rows = nb / l * l;
    full_cols = kn / l * l;
    for (int64_t j = 0; j < full_rows; j += l) {
      float* panel = dst + (j / pw) * kn * pw + j % pw;
      for (int64_t c = 0; c < full_cols; c += l) {
        GVF r[L];
        HWY_UNROLL(8)
        for (size_t i = 0; i < L; ++i) r[i] = LoadW(df, w + (j + i) * ws + c);
        TransposeSquare<L>(r);
        HWY_UNROLL(8)
        for (size_t t = 0; t < L; ++t) hn::StoreU(r[t], df, panel + (c + t) * pw);
      }
    }
  }
#endif
  const int64_t padded = (nb + pw - 1) / pw * pw;
  for (int64_t j = 0; j < padded; ++j) {
    float* panel = dst + (j / pw) * kn * pw + j % pw;
    for (int64_t c = j < full_rows ? full_cols : 0; c < kn; ++c) {
      panel[c * pw] = j < nb ? WeightAt(w + j * ws + c) : 0.0f;
    }
  }
}

// out[r * os + j] (=, or += when accumulate) sum over c of x[r * xs + c] * panel[c * pw + j]
// for MR rows and the first `valid` of the panel's pw features; bias (per feature, may be null)
// is added when not accumulating.
template <int MR>
HWY_INLINE void PanelTile(const float* HWY_RESTRICT x, int64_t xs, const float* HWY_RESTRICT panel,
                          int64_t kn, float* HWY_RESTRICT out, int64_t os, int64_t valid,
                          const float* HWY_RESTRICT bias, bool accumulate) {
  const GDF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t pw = kPNV * lanes;
  const float* xr[MR];
  HWY_UNROLL(6)
  for (int r = 0; r < MR; ++r) xr[r] = x + r * xs;
  GVF acc[MR][kPNV];
  OuterTile<MR, kPNV>(df, xr, panel, pw, kn, acc);
  HWY_UNROLL(2)
  for (int v = 0; v < kPNV; ++v) {
    const int64_t n = std::min(lanes, valid - v * lanes);
    if (n <= 0) break;
    if (n == lanes) {
      const GVF b = !accumulate && bias != nullptr ? hn::LoadU(df, bias + v * lanes) : hn::Zero(df);
      HWY_UNROLL(6)
      for (int r = 0; r < MR; ++r) {
        float* o = out + r * os + v * lanes;
        hn::StoreU(hn::Add(acc[r][v], accumulate ? hn::LoadU(df, o) : b), df, o);
      }
      continue;
    }
    // A partial vector (the block's last features): through a buffer, touching only n floats of
    // out (Highway 1.0's masked loads and stores may access the whole vector on some targets).
    HWY_ALIGN float part[hn::MaxLanes(df)];
    HWY_UNROLL(6)
    for (int r = 0; r < MR; ++r) {
      hn::Store(acc[r][v], df, part);
      float* o = out + r * os + v * lanes;
      for (int64_t j = 0; j < n; ++j) {
        const float b = bias != nullptr ? bias[v * lanes + j] : 0.0f;
        o[j] = accumulate ? o[j] + part[j] : part[j] + b;
      }
    }
  }
}

// PanelTile for mr (1..MR) rows.
template <int MR>
HWY_INLINE void PanelTileUpTo(int64_t mr, const float* x, int64_t xs, const float* panel,
                              int64_t kn, float* out, int64_t os, int64_t valid,
                              const float* bias, bool accumulate) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      return PanelTileUpTo<MR - 1>(mr, x, xs, panel, kn, out, os, valid, bias, accumulate);
    }
  }
  PanelTile<MR>(x, xs, panel, kn, out, os, valid, bias, accumulate);
}

// Every row of x against weight rows [j0, j0 + nb), columns [k0, k0 + kn) (w points at (j0, k0)),
// kGemmPackKc columns at a time: pack them, then pass kPackMc rows of x at a time (their columns
// stay in L2) over each panel (in L1).
template <typename WT>
void PackedPass(const GemmArgs& a, const WT* w, int64_t ws, int64_t j0, int64_t nb, int64_t k0,
                int64_t kn, float* pack) {
  const int64_t pw = PanelWidth();
  const float* bias = a.bias ? a.bias + j0 : nullptr;
  for (int64_t kk = 0; kk < kn; kk += kGemmPackKc) {
    const int64_t kb = std::min(kGemmPackKc, kn - kk);
    PackPanels(w + kk, ws, nb, kb, pack);
    const bool accumulate = k0 + kk > 0;
    for (int64_t r0 = 0; r0 < a.m; r0 += kPackMc) {
      const int64_t r1 = std::min(a.m, r0 + kPackMc);
      for (int64_t p = 0; p * pw < nb; ++p) {
        const float* pb = bias ? bias + p * pw : nullptr;
        for (int64_t r = r0; r < r1; r += kPMR) {
          PanelTileUpTo<kPMR>(std::min<int64_t>(kPMR, r1 - r), a.x + r * a.x_stride + k0 + kk,
                              a.x_stride, pack + p * kb * pw, kb,
                              a.out + r * a.out_stride + j0 + p * pw, a.out_stride,
                              std::min(pw, nb - p * pw), pb, accumulate);
        }
      }
    }
  }
}

// Weight rows [j0, j0 + nb), columns [k0, k0 + kn), w pointing at (j0, k0): on the packed panels
// when the caller gave them a buffer (GemmUsesPanels), else on the tile.
template <typename WT>
void BlockPass(const GemmArgs& a, const WT* w, int64_t ws, int64_t j0, int64_t nb, int64_t k0,
               int64_t kn, float* pack) {
  if (pack != nullptr) return PackedPass(a, w, ws, j0, nb, k0, kn, pack);
  GemmPass(a, w, ws, j0, nb, k0, kn);
}

// Output features [j0, j0 + nb) for all rows, K blocks of kc columns; buf holds nb x kc floats
// when a.rows_fn is set; pack, kMaxBlockRows x kGemmPackKc floats, is null unless the packed
// panels take the call.
void GemmBlock(const GemmArgs& a, int64_t j0, int64_t nb, int64_t kc, float* buf, float* pack) {
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
      BlockPass(a, static_cast<const float*>(buf), kn, j0, nb, k0, kn, pack);
      continue;
    }
    const int64_t off = j0 * a.w_stride + k0;
    switch (a.wtype) {
      case WType::kF32:
        BlockPass(a, static_cast<const float*>(a.w) + off, a.w_stride, j0, nb, k0, kn, pack);
        break;
      case WType::kBF16:
        BlockPass(a, static_cast<const hwy::bfloat16_t*>(a.w) + off, a.w_stride, j0, nb, k0, kn,
                  pack);
        break;
      case WType::kF16:
        BlockPass(a, static_cast<const hwy::float16_t*>(a.w) + off, a.w_stride, j0, nb, k0, kn,
                  pack);
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

bool HasPackedPanels() { return kPackedPanels; }

}  // namespace HWY_NAMESPACE
}  // namespace dh::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dh::cpu {

HWY_EXPORT(GemmBlock);
HWY_EXPORT(FmaProbe);
HWY_EXPORT(FmaProbeFlops);
HWY_EXPORT(HasPackedPanels);

namespace {
constexpr int64_t kMaxBlockRows = 96;  // a multiple of every target's kNR (2, 3)
constexpr int64_t kBlockRowsUnit = 6;
constexpr int64_t kPackedRowsUnit = 48;  // whole panels of 16 or 8 features, whole AVX3 tiles
}  // namespace

int64_t GemmMaxBlockRows() { return kMaxBlockRows; }

namespace {
// Whether every call has the first one's shape and weight type (GemmBatched's shared plan).
bool SameGemmShape(std::span<const GemmArgs> calls) {
  const GemmArgs& a = calls[0];
  for (const GemmArgs& c : calls) {
    if (c.m != a.m || c.n != a.n || c.k != a.k || c.wtype != a.wtype ||
        (c.rows_fn == nullptr) != (a.rows_fn == nullptr) || UseBf16Dot(c)) {
      return false;
    }
  }
  return true;
}
}  // namespace

int64_t GemmKc(int64_t m, int64_t k, bool rows_fn) {
  // One x tile (m <= 8): whole rows, so the weight is read as long sequential streams.
  if (m <= 8 && !rows_fn) return std::max<int64_t>(k, 1);
  // Else equal blocks of at most kGemmKcMax columns, rounded up to kGemmKcUnit.
  const int64_t blocks = std::max<int64_t>(1, (k + kGemmKcMax - 1) / kGemmKcMax);
  const int64_t kc = (k + blocks - 1) / blocks;
  return (kc + kGemmKcUnit - 1) / kGemmKcUnit * kGemmKcUnit;
}

void Gemm(const GemmArgs& a, ThreadPool& pool) {
  GemmBatched(std::span<const GemmArgs>(&a, 1), pool);
}

void GemmBatched(std::span<const GemmArgs> calls, ThreadPool& pool) {
  if (calls.empty()) return;
  const GemmArgs& a = calls[0];
  if (a.m <= 0 || a.n <= 0) return;
  if (UseBf16Dot(a) || (calls.size() > 1 && !SameGemmShape(calls))) {
    // bf16 weights on AVX512-BF16 (gemm_bf16.h), and calls of different shapes: one by one.
    for (const GemmArgs& c : calls) {
      if (UseBf16Dot(c)) {
        Bf16DotGemm(c, pool);
      } else {
        GemmBatched(std::span<const GemmArgs>(&c, 1), pool);
      }
    }
    return;
  }
  const int64_t threads = pool.num_threads();
  const bool panels = GemmUsesPanels(a.m, a.wtype, a.rows_fn != nullptr);
  // Blocks of output features: at most kMaxBlockRows (the weight block, kMaxBlockRows x kGemmKc,
  // stays in L2), and at least ~4 per thread so the dynamic hand-out can balance; multiples of
  // kBlockRowsUnit, or of kPackedRowsUnit (whole panels) for the packed kernel. Set per call, as
  // if it ran alone, so a call gives the same bits in a batch as by itself.
  const int64_t unit = panels ? kPackedRowsUnit : kBlockRowsUnit;
  int64_t nb = (a.n + 4 * threads - 1) / (4 * threads);
  nb = std::clamp<int64_t>((nb + unit - 1) / unit * unit, unit, kMaxBlockRows);
  const int64_t blocks = (a.n + nb - 1) / nb;
  const int64_t all_blocks = blocks * static_cast<int64_t>(calls.size());
  // Rows from a callback come whole to the panels (decoded once; packed 256 columns at a time).
  const int64_t kc = panels && a.rows_fn != nullptr ? std::max<int64_t>(a.k, 1)
                                                    : GemmKc(a.m, a.k, a.rows_fn != nullptr);
  std::atomic<int64_t> next{0};
  auto work = [&](int) {
    // This thread's buffers, grown once per shape: the callback's f32 rows, and the packed
    // panels of one block (at most kMaxBlockRows rows, a multiple of every panel width).
    thread_local std::vector<float> tl_buf, tl_pack;
    if (a.rows_fn != nullptr && tl_buf.size() < static_cast<size_t>(nb * kc)) {
      tl_buf.resize(nb * kc);
    }
    if (panels) tl_pack.resize(kMaxBlockRows * kGemmPackKc);
    // Blocks call after call, so consecutive blocks read consecutive weight rows.
    for (int64_t i = next.fetch_add(1); i < all_blocks; i = next.fetch_add(1)) {
      const GemmArgs& c = calls[static_cast<size_t>(i / blocks)];
      const int64_t j0 = i % blocks * nb;
      HWY_DYNAMIC_DISPATCH(GemmBlock)(c, j0, std::min(nb, c.n - j0), kc, tl_buf.data(),
                                      panels ? tl_pack.data() : nullptr);
    }
  };
  const int64_t work_total = a.m * a.n * a.k * static_cast<int64_t>(calls.size());
  if (threads <= 1 || all_blocks == 1 || work_total < kGemmMinParallelWork) return work(0);
  pool.RunOnAll(work);
}

bool GemmUsesPanels(int64_t m, WType wtype, bool rows_fn) {
  return m >= GemmPackedMinRows(wtype, rows_fn) && HWY_DYNAMIC_DISPATCH(HasPackedPanels)();
}

float FmaProbe(int64_t iters) { return HWY_DYNAMIC_DISPATCH(FmaProbe)(iters); }
int64_t FmaProbeFlops(int64_t iters) { return HWY_DYNAMIC_DISPATCH(FmaProbeFlops)(iters); }

}  // namespace dh::cpu
#endif  // HWY_ONCE
