// Per-SIMD-target blocked attention (attention.h), compiled once per target via foreach_target.h.
// Vectors run along the block's query rows: the queries are kept transposed, [dk][rows], so a
// score tile is a row vector times one broadcast key element per multiply-add, the running max,
// sum and rescale of the online softmax are plain vector ops, and the value product accumulates
// the output transposed, [dv][rows], the same way. Decode's few rows (at most half a vector)
// instead run row by row with vectors along dk and the keys (KeyBlockRows). All arithmetic is
// f32.
#include "backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cpu/gemm_bf16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

#include "backend/cpu/outer_tile-inl.h"   // after highway.h: per-target code
#include "backend/cpu/weight_load-inl.h"  // after highway.h: per-target code

HWY_BEFORE_NAMESPACE();
namespace dh::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// A score below every real one: masked keys, and the running max before the first key. It
// stays finite (Highway's Exp is defined on finite inputs) and exp of it minus a real score is 0.
constexpr float kMasked = -1e30f;
// Keys per score tile and value columns per output tile for NV row vectors: 12 accumulators
// (within AVX2's 16 registers), enough independent multiply-add chains to cover the FMA
// latency at two per cycle.
template <int NV>
constexpr int kTile = 12 / NV;

// One KV cache element type as f32 vectors and scalars (the quantized ones before their
// scale). fp8 e4m3: LoadE4M3Over2To120 (weight_load-inl.h) times 2^120, the value exactly.
template <class D>
HWY_INLINE hn::Vec<D> LoadKv(D df, const hwy::bfloat16_t* HWY_RESTRICT p) {
  return LoadW(df, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadKv(D df, const float* HWY_RESTRICT p) {
  return hn::LoadU(df, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadKv(D df, const uint8_t* HWY_RESTRICT p) {
  return hn::Mul(LoadE4M3Over2To120(df, p), hn::Set(df, 0x1p120f));
}
template <class D>
HWY_INLINE hn::Vec<D> LoadKv(D df, const int8_t* HWY_RESTRICT p) {
  const hn::Rebind<int8_t, D> d8;
  const hn::RebindToSigned<D> di;
  return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, p)));
}
HWY_INLINE float KvToF32(float v) { return v; }
HWY_INLINE float KvToF32(hwy::bfloat16_t v) { return ToF32(v); }
HWY_INLINE float KvToF32(uint8_t v) { return F8E4M3ToF32(v); }
HWY_INLINE float KvToF32(int8_t v) { return static_cast<float>(v); }

// dst[0, n) = src[0, n) as f32, each group of `group` elements times its scale (if scales).
template <typename T>
HWY_INLINE void WidenKvRow(const T* HWY_RESTRICT src, const float* HWY_RESTRICT scales,
                           int64_t group, int64_t n, float* HWY_RESTRICT dst) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t step = scales ? group : n;
  for (int64_t g0 = 0; g0 < n; g0 += step) {
    const int64_t end = std::min(n, g0 + step);
    const float s = scales ? scales[g0 / group] : 1.0f;
    const VF sv = hn::Set(df, s);
    int64_t i = g0;
    for (; i + lanes <= end; i += lanes) {
      const VF x = LoadKv(df, src + i);
      hn::StoreU(scales ? hn::Mul(x, sv) : x, df, dst + i);
    }
    for (; i < end; ++i) dst[i] = scales ? KvToF32(src[i]) * s : KvToF32(src[i]);
  }
}

// s[j][rows] = sum_d qt[d][rows] * k[j][d] for J keys and NV row vectors (pitch: floats
// between the rows of qt and of s).
template <int NV, int J, class Step>
HWY_INLINE void ScoreTile(const float* HWY_RESTRICT qt, int64_t pitch, const float* const* k,
                          int64_t dk, float* HWY_RESTRICT s, Step& step) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF acc[J][NV];
  OuterTile<J, NV>(df, k, qt, pitch, dk, acc, step);
  HWY_UNROLL(12)
  for (int j = 0; j < J; ++j) {
    HWY_UNROLL(2)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[j][v], df, s + j * pitch + v * lanes);
  }
}

// o[d][rows] = o[d][rows] * alpha[rows] + sum_j p[j][rows] * val[j][d] for the D value columns
// from d0, over nk keys (no alpha: the first key block, o starts from 0).
template <int NV, int D>
HWY_INLINE void ValueTile(const float* HWY_RESTRICT p, int64_t pitch, const float* const* val,
                          int64_t nk, int64_t d0, const float* HWY_RESTRICT alpha,
                          float* HWY_RESTRICT o) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF acc[D][NV];
  HWY_UNROLL(12)
  for (int i = 0; i < D; ++i) {
    HWY_UNROLL(2)
    for (int v = 0; v < NV; ++v) {
      acc[i][v] = alpha ? hn::Mul(hn::LoadU(df, o + (d0 + i) * pitch + v * lanes),
                                  hn::LoadU(df, alpha + v * lanes))
                        : hn::Zero(df);
    }
  }
  for (int64_t j = 0; j < nk; ++j) {
    const float* HWY_RESTRICT vr = val[j] + d0;
    VF pv[NV];
    HWY_UNROLL(2)
    for (int v = 0; v < NV; ++v) pv[v] = hn::LoadU(df, p + j * pitch + v * lanes);
    HWY_UNROLL(12)
    for (int i = 0; i < D; ++i) {
      const VF vb = hn::Set(df, vr[i]);
      HWY_UNROLL(2)
      for (int v = 0; v < NV; ++v) acc[i][v] = hn::MulAdd(pv[v], vb, acc[i][v]);
    }
  }
  HWY_UNROLL(12)
  for (int i = 0; i < D; ++i) {
    HWY_UNROLL(2)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[i][v], df, o + (d0 + i) * pitch + v * lanes);
  }
}

// The last n < J keys (value columns) of a pass, with a tile of exactly n.
template <int NV, int J, class Step>
HWY_INLINE void ScoreTail(int64_t n, const float* qt, int64_t pitch, const float* const* k,
                          int64_t dk, float* s, Step& step) {
  if constexpr (J > 1) {
    if (n == J - 1) return ScoreTile<NV, J - 1>(qt, pitch, k, dk, s, step);
    ScoreTail<NV, J - 1>(n, qt, pitch, k, dk, s, step);
  }
}
template <int NV, int D>
HWY_INLINE void ValueTail(int64_t n, const float* p, int64_t pitch, const float* const* val,
                          int64_t nk, int64_t d0, const float* alpha, float* o) {
  if constexpr (D > 1) {
    if (n == D - 1) return ValueTile<NV, D - 1>(p, pitch, val, nk, d0, alpha, o);
    ValueTail<NV, D - 1>(n, p, pitch, val, nk, d0, alpha, o);
  }
}

// Scores of nk (<= kAttendKeyBlock) keys for NV row vectors, kTile<NV> keys at a time.
template <int NV, class Step>
HWY_INLINE void Scores(const float* qt, int64_t pitch, const float* const* k, int64_t nk,
                       int64_t dk, float* s, Step& step) {
  constexpr int kJ = kTile<NV>;
  int64_t j = 0;
  for (; j + kJ <= nk; j += kJ) ScoreTile<NV, kJ>(qt, pitch, k + j, dk, s + j * pitch, step);
  ScoreTail<NV, kJ>(nk - j, qt, pitch, k + j, dk, s + j * pitch, step);
}

template <int NV>
HWY_INLINE void Values(const float* p, int64_t pitch, const float* const* val, int64_t nk,
                       int64_t dv, const float* alpha, float* o) {
  constexpr int kD = kTile<NV>;
  int64_t d = 0;
  for (; d + kD <= dv; d += kD) ValueTile<NV, kD>(p, pitch, val, nk, d, alpha, o);
  ValueTail<NV, kD>(dv - d, p, pitch, val, nk, d, alpha, o);
}

// Decode's few query rows (at most half a vector: GQA's 4-8 query heads of a kv head on 16
// lanes, MHA's one): a score tile with the rows along the vector (OuterTile) runs dk
// multiply-adds per key however few lanes hold rows, so here each score is a dot product along
// dk instead, rows x dk / lanes multiply-adds per key, the sums of kDotKeys keys formed at once.
// (Not on HWY_SCALAR, whose one lane has no blocks to interleave.)
constexpr int kDotKeys = 4;
HWY_INLINE bool DotScoresFit(int64_t rows, int64_t dk) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DF()));
  return HWY_TARGET != HWY_SCALAR && HWY_HAVE_SCALABLE == 0 && lanes >= 4 && dk % lanes == 0 &&
         2 * rows <= lanes;
}
#if HWY_TARGET != HWY_SCALAR

// Lane i of each 128-bit block: the sum of that block's lanes of the i-th of a, b, c, e.
HWY_INLINE VF BlockSumsOf4(VF a, VF b, VF c, VF e) {
  const DF df;
  const hn::Repartition<uint64_t, DF> d64;
  const VF ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));
  const VF ce = hn::Add(hn::InterleaveLower(df, c, e), hn::InterleaveUpper(df, c, e));
  const auto ab64 = hn::BitCast(d64, ab), ce64 = hn::BitCast(d64, ce);
  return hn::Add(hn::BitCast(df, hn::InterleaveLower(d64, ab64, ce64)),
                 hn::BitCast(df, hn::InterleaveUpper(d64, ab64, ce64)));
}

// out[0, 4) = the sums over v's 128-bit blocks of their lanes 0-3.
template <class D>
HWY_INLINE void StoreBlockTotals(D d, hn::Vec<D> v, float* HWY_RESTRICT out) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    StoreBlockTotals(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out);
  } else {
    hn::StoreU(v, d, out);
  }
}

// s[r][j] (rp floats between rows) = sum_d qr[r][d] * k[j][d] for R rows from qr (dk floats
// apart) and the kDotKeys keys kp: four sums stored together (rp >= j + kDotKeys).
template <int R, class Step>
HWY_INLINE void DotScoreTile(const float* HWY_RESTRICT qr, const float* const* kp, int64_t dk,
                             int64_t rp, float* HWY_RESTRICT s, Step& step) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  VF acc[R][kDotKeys];
  HWY_UNROLL(2)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (int j = 0; j < kDotKeys; ++j) acc[r][j] = hn::Zero(df);
  }
  for (int64_t d = 0; d < dk; d += lanes) {
    step();
    VF q[R];
    HWY_UNROLL(2)
    for (int r = 0; r < R; ++r) q[r] = hn::LoadU(df, qr + r * dk + d);
    HWY_UNROLL(4)
    for (int j = 0; j < kDotKeys; ++j) {
      const VF kv = hn::LoadU(df, kp[j] + d);
      HWY_UNROLL(2)
      for (int r = 0; r < R; ++r) acc[r][j] = hn::MulAdd(q[r], kv, acc[r][j]);
    }
  }
  HWY_UNROLL(2)
  for (int r = 0; r < R; ++r) {
    StoreBlockTotals(df, BlockSumsOf4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), s + r * rp);
  }
}

// s[r][j] for nk keys and `rows` rows (DotScoresFit), two rows at a time, rows kAttendKeyBlock
// floats apart; the scores past nk (to the next multiple of kDotKeys) are not meaningful.
template <class Step>
HWY_INLINE void DotScores(const float* HWY_RESTRICT qr, int64_t rows, const float* const* k,
                          int64_t nk, int64_t dk, float* HWY_RESTRICT s, Step& step) {
  static_assert(kDotKeys == 4 && kAttendKeyBlock % kDotKeys == 0, "BlockSumsOf4 sums four keys");
  constexpr int64_t rp = kAttendKeyBlock;
  for (int64_t j = 0; j < nk; j += kDotKeys) {
    const int64_t n = std::min<int64_t>(kDotKeys, nk - j);
    const float* kp[kDotKeys];
    for (int i = 0; i < kDotKeys; ++i) kp[i] = k[j + std::min<int64_t>(i, n - 1)];
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) DotScoreTile<2>(qr + r * dk, kp, dk, rp, s + r * rp + j, step);
    if (r < rows) DotScoreTile<1>(qr + r * dk, kp, dk, rp, s + r * rp + j, step);
  }
}
#endif  // HWY_TARGET != HWY_SCALAR

// For one vector of rows (decode: GQA's few query heads of a kv head), the output is kept row
// by row, o[r][dv], with vectors along the value columns: a value vector then serves R rows and
// each weight is one broadcast, R x dv / lanes multiply-adds per key instead of dv for the whole
// (mostly empty) row vector.
// o[r][d] = o[r][d] * alpha[r] + sum_j p[j][r] * val[j][d] for rows [r0, r0 + R) and C vectors
// of columns from d0 (no alpha: the first key block); p[j][r] at p + j * kp + r * rp (the score
// tile's [keys][rows], kp = pitch, rp = 1, or DotScores' [rows][keys], kp = 1,
// rp = kAttendKeyBlock).
template <int R, int C>
HWY_INLINE void ValueRowsTile(const float* HWY_RESTRICT p, int64_t kp, int64_t rp,
                              const float* const* val, int64_t nk, int64_t r0, int64_t d0,
                              int64_t dv, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF acc[R][C];
  HWY_UNROLL(4)
  for (int i = 0; i < R; ++i) {
    HWY_UNROLL(4)
    for (int c = 0; c < C; ++c) {
      float* oc = o + (r0 + i) * dv + d0 + c * lanes;
      acc[i][c] = alpha ? hn::Mul(hn::LoadU(df, oc), hn::Set(df, alpha[r0 + i])) : hn::Zero(df);
    }
  }
  for (int64_t j = 0; j < nk; ++j) {
    const float* HWY_RESTRICT vr = val[j] + d0;
    VF vv[C];
    HWY_UNROLL(4)
    for (int c = 0; c < C; ++c) vv[c] = hn::LoadU(df, vr + c * lanes);
    HWY_UNROLL(4)
    for (int i = 0; i < R; ++i) {
      const VF pb = hn::Set(df, p[j * kp + (r0 + i) * rp]);
      HWY_UNROLL(4)
      for (int c = 0; c < C; ++c) acc[i][c] = hn::MulAdd(vv[c], pb, acc[i][c]);
    }
  }
  HWY_UNROLL(4)
  for (int i = 0; i < R; ++i) {
    HWY_UNROLL(4)
    for (int c = 0; c < C; ++c) hn::StoreU(acc[i][c], df, o + (r0 + i) * dv + d0 + c * lanes);
  }
}

// Columns [d0, d0 + C vectors) of all `rows` rows, three rows at a time (3 x 4 vectors: 12
// accumulators).
template <int C>
HWY_INLINE void ValueRowsColumns(const float* p, int64_t kp, int64_t rp, const float* const* val,
                                 int64_t nk, int64_t rows, int64_t d0, int64_t dv,
                                 const float* alpha, float* o) {
  int64_t r = 0;
  for (; r + 3 <= rows; r += 3) ValueRowsTile<3, C>(p, kp, rp, val, nk, r, d0, dv, alpha, o);
  if (rows - r == 2) ValueRowsTile<2, C>(p, kp, rp, val, nk, r, d0, dv, alpha, o);
  if (rows - r == 1) ValueRowsTile<1, C>(p, kp, rp, val, nk, r, d0, dv, alpha, o);
}

// All `rows` rows over every column: tiles of 4 vectors, then 1-3, then the scalar columns.
// Columns outside, rows inside: a tile's values (kAttendKeyBlock keys x 4 vectors) stay in L1
// for every band of rows where the block's whole values may not (MLA's 512 f32 columns: 64 KiB
// per block).
HWY_INLINE void ValueRows(const float* p, int64_t kp, int64_t rp, const float* const* val,
                          int64_t nk, int64_t rows, int64_t dv, const float* alpha, float* o) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t d = 0;
  for (; d + 4 * lanes <= dv; d += 4 * lanes) {
    ValueRowsColumns<4>(p, kp, rp, val, nk, rows, d, dv, alpha, o);
  }
  switch ((dv - d) / lanes) {
    case 3: ValueRowsColumns<3>(p, kp, rp, val, nk, rows, d, dv, alpha, o); break;
    case 2: ValueRowsColumns<2>(p, kp, rp, val, nk, rows, d, dv, alpha, o); break;
    case 1: ValueRowsColumns<1>(p, kp, rp, val, nk, rows, d, dv, alpha, o); break;
    default: break;
  }
  d += (dv - d) / lanes * lanes;
  for (; d < dv; ++d) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc = alpha ? o[r * dv + d] * alpha[r] : 0.0f;
      for (int64_t j = 0; j < nk; ++j) acc += p[j * kp + r * rp] * val[j][d];
      o[r * dv + d] = acc;
    }
  }
}

// Prefetches of the next key block's cache rows a line at a time, a few per score step of this
// block (PrefetchStep), where one burst of them at the block's start had the core wait for the
// lines with nothing to compute, then compute with nothing in flight. The lines are listed once
// per block, so that a step only advances a cursor (kept in registers through the block's
// score tiles); Rest issues what the steps did not.
class RowPrefetcher {
 public:
  void Reset() { n_ = 0; }
  void Add(const void* p, size_t bytes) {
    const char* c = static_cast<const char*>(p);
    for (size_t b = 0; b < bytes; b += 64) lines_[n_++] = c + b;
  }
  const char* const* begin() const { return lines_; }
  const char* const* end() const { return lines_ + n_; }
  static void Rest(const char* const* from, const char* const* to) {
    for (; from < to; ++from) hwy::Prefetch(*from);
  }

 private:
  // A block's rows take at most kAttendSpreadMaxBytes (spread) or kAttendPairSpreadMaxBytes
  // (pair scores), each row one line more than its whole lines at most.
  const char* lines_[std::max(kAttendSpreadMaxBytes, kAttendPairSpreadMaxBytes) / 64 +
                     2 * kAttendKeyBlock];
  int64_t n_ = 0;
};
// `per` lines from the cursor per score step (the f32 tiles call it; the bf16 score kernels
// take it as the LinePrefetch it is).
struct PrefetchStep : LinePrefetch {
  PrefetchStep() { per = 2; }
  HWY_INLINE void operator()() {
    for (int i = 0; i < per && next != end; ++i) hwy::Prefetch(*next++);
  }
};

// A block's scores on vdpbf16ps (AttendBf16Dot) from the key rows as they lie in a bf16 cache:
// the row-vector tiles' query pairs (KeyBlock) or decode's few rows in bf16 (KeyBlockRows).
struct Bf16ScoreArgs {
  const uint32_t* qp = nullptr;  // the row-vector tiles' query pairs
  const uint16_t* qb = nullptr;  // decode's few rows, bf16 (KeyBlockRows)
  const uint16_t* const* k = nullptr;
  float scale = 1.0f;
  LinePrefetch* pf = nullptr;  // the next block's lines (decode), or none
};

// One key block for the NV row vectors at the start of every [rows] array passed: scores (from
// qt and the f32 keys k, or from the bf16 keys with bf16), causal mask, online softmax update
// (max m, sum l, weights in place of the scores, rescale factors in alpha), then the value
// product into o: transposed, o[dv][pitch], or with rows_major > 0 (one row vector) row by
// row, o[rows_major][dv].
template <int NV, class Step>
void KeyBlock(const float* qt, int64_t pitch, const float* const* k,
              const float* const* val, int64_t j0, int64_t nk, int64_t first_masked, int64_t dk,
              int64_t dv, const int32_t* npos, float* s, float* m, float* l, float* alpha,
              float* o, int64_t rows_major, bool first, Step& step,
              const Bf16ScoreArgs* bf16 = nullptr) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  if (bf16 != nullptr) {
    Bf16PairScores(bf16->qp, NV, bf16->k, nk, dk, bf16->scale, s, pitch, bf16->pf);
  } else {
    Step local = step;  // a local copy, which the inlined tiles keep in registers
    Scores<NV>(qt, pitch, k, nk, dk, s, local);
    step = local;
  }
  // Causal mask: key j0 + j is past row r when j0 + j >= npos[r]; only keys from the block's
  // smallest num_positions on can be.
  const hn::RebindToSigned<DF> di;
  for (int64_t j = std::max<int64_t>(0, first_masked - j0); j < nk; ++j) {
    const auto pos = hn::Set(di, static_cast<int32_t>(j0 + j));
    for (int v = 0; v < NV; ++v) {
      float* sj = s + j * pitch + v * lanes;
      const auto live = hn::RebindMask(df, hn::Lt(pos, hn::LoadU(di, npos + v * lanes)));
      hn::StoreU(hn::IfThenElse(live, hn::LoadU(df, sj), hn::Set(df, kMasked)), df, sj);
    }
  }
  for (int v = 0; v < NV; ++v) {
    const size_t off = v * lanes;
    VF mx = hn::LoadU(df, m + off);
    const VF m_old = mx;
    for (int64_t j = 0; j < nk; ++j) mx = hn::Max(mx, hn::LoadU(df, s + j * pitch + off));
    VF sum = hn::Zero(df);
    for (int64_t j = 0; j < nk; ++j) {
      float* sj = s + j * pitch + off;
      const VF e = hn::Exp(df, hn::Sub(hn::LoadU(df, sj), mx));
      hn::StoreU(e, df, sj);
      sum = hn::Add(sum, e);
    }
    const VF a = hn::Exp(df, hn::Sub(m_old, mx));
    hn::StoreU(a, df, alpha + off);
    hn::StoreU(hn::MulAdd(hn::LoadU(df, l + off), a, sum), df, l + off);
    hn::StoreU(mx, df, m + off);
  }
  if (rows_major > 0) {
    ValueRows(s, pitch, 1, val, nk, rows_major, dv, first ? nullptr : alpha, o);
  } else {
    Values<NV>(s, pitch, val, nk, dv, first ? nullptr : alpha, o);
  }
}

#if HWY_TARGET != HWY_SCALAR
// One key block for decode's few rows (DotScoresFit) kept row by row: scores s[r][j] as dot
// products of the scaled query rows qr ([rows][dk]) with the keys (DotScores), the causal mask
// and online softmax along each row's keys (m, l, alpha per row), the value product into
// o[rows][dv] (ValueRows). The same f32 steps per score as KeyBlock's, summed in another order.
template <class Step>
void KeyBlockRows(const float* qr, int64_t rows, const float* const* k, const float* const* val,
                  int64_t j0, int64_t nk, int64_t dk, int64_t dv, const int32_t* npos, float* s,
                  float* m, float* l, float* alpha, float* o, bool first, Step& step,
                  const Bf16ScoreArgs* bf16 = nullptr) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t rp = kAttendKeyBlock;
  if (bf16 != nullptr) {
    Bf16RowScores(bf16->qb, rows, bf16->k, nk, dk, bf16->scale, s, rp, bf16->pf);
  } else {
    Step local = step;  // a local copy, which the inlined tiles keep in registers
    DotScores(qr, rows, k, nk, dk, s, local);
    step = local;
  }
  const VF masked = hn::Set(df, kMasked);
  for (int64_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT sr = s + r * rp;
    // Keys past the row's position score kMasked, as in KeyBlock; those past nk take no part.
    const int64_t live = std::clamp<int64_t>(npos[r] - j0, 0, nk);
    VF mx = hn::Set(df, m[r]);
    for (int64_t j = 0; j < nk; j += lanes) {
      const auto idx = hn::Iota(di, static_cast<int32_t>(j));
      const auto seen = hn::RebindMask(df, hn::Lt(idx, hn::Set(di, static_cast<int32_t>(live))));
      const VF v = hn::IfThenElse(seen, hn::LoadU(df, sr + j), masked);
      hn::StoreU(v, df, sr + j);
      mx = hn::Max(mx, v);
    }
    const float m_new = hn::GetLane(hn::MaxOfLanes(df, mx));
    const VF mv = hn::Set(df, m_new);
    VF sum = hn::Zero(df);
    for (int64_t j = 0; j < nk; j += lanes) {
      const auto idx = hn::Iota(di, static_cast<int32_t>(j));
      const auto in = hn::RebindMask(df, hn::Lt(idx, hn::Set(di, static_cast<int32_t>(nk))));
      const VF e = hn::IfThenElseZero(in, hn::Exp(df, hn::Sub(hn::LoadU(df, sr + j), mv)));
      hn::StoreU(e, df, sr + j);
      sum = hn::Add(sum, e);
    }
    const float a = hn::GetLane(hn::Exp(df, hn::Set(df, m[r] - m_new)));
    alpha[r] = a;
    l[r] = l[r] * a + hn::GetLane(hn::SumOfLanes(df, sum));
    m[r] = m_new;
  }
  ValueRows(s, 1, rp, val, nk, rows, dv, first ? nullptr : alpha, o);
}
#endif  // HWY_TARGET != HWY_SCALAR

// qt[d][r] = q[r][d] * scale for the block's rows, padding rows (up to pitch) copying row 0:
// the rows are first copied, scaled, into `rows` ([a.rows][dk], read as sequential streams the
// prefetchers follow), then each vector of qt is gathered from there (in L1). Without qt, the
// scaled rows alone. bf16_q: each q[r][d] rounded to bf16 before the scale (a bf16 cache under
// AttendBf16Dot, rounded as the bf16 scores round it: RoundRowsToBf16).
HWY_INLINE void TransposeQueries(const AttendBlockArgs& a, int64_t pitch, bool bf16_q,
                                 float* HWY_RESTRICT rows, float* HWY_RESTRICT qt) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const VF scale = hn::Set(df, a.scale);
  for (int r = 0; r < a.rows; ++r) {
    float* dst = rows + r * a.dk;
    const float* q = a.q[r];
    if (bf16_q) {  // rounded into dst, then scaled in place
      RoundRowsToBf16(q, a.dk, 1, a.dk, dst);
      q = dst;
    }
    int64_t d = 0;
    for (; d + lanes <= a.dk; d += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(df, q + d), scale), df, dst + d);
    }
    for (; d < a.dk; ++d) dst[d] = q[d] * a.scale;
  }
  if (qt == nullptr) return;
  int32_t offset[AttendScratchLayout::kPitchMax];
  for (int64_t r = 0; r < pitch; ++r) offset[r] = static_cast<int32_t>(r < a.rows ? r * a.dk : 0);
  for (int64_t v = 0; v < pitch; v += lanes) {
    const auto idx = hn::LoadU(di, offset + v);
    for (int64_t d = 0; d < a.dk; ++d) {
      hn::StoreU(hn::GatherIndex(df, rows + d, idx), df, qt + d * pitch + v);
    }
  }
}

template <typename T>
void AttendBlockTyped(const AttendBlockArgs& a) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t nvec = (a.rows + lanes - 1) / lanes;
  const int64_t pitch = nvec * lanes;
  const int64_t kb = kAttendKeyBlock;
  const AttendScratchLayout layout(a.dk, a.dv);
  float* qt = a.scratch + layout.qt;
  float* o = a.scratch + layout.o;
  float* s = a.scratch + layout.s;
  float* kf = a.scratch + layout.kf;
  float* vf = a.scratch + layout.vf;
  const int64_t vpitch = AttendScratchLayout::ValuePitch(a.dv);
  HWY_ALIGN int32_t npos[AttendScratchLayout::kPitchMax];  // keys each row sees
  float* m = a.scratch + layout.rows;
  float* l = m + AttendScratchLayout::kPitchMax;
  float* alpha = l + AttendScratchLayout::kPitchMax;

  // Positions: padding rows copy row 0's query and limit so they compute harmless values.
  int64_t n_max = 0, n_min = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < a.rows; ++r) {
    n_max = std::max(n_max, a.num_positions[r]);
    n_min = std::min(n_min, a.num_positions[r]);
  }
  for (int64_t r = 0; r < pitch; ++r) {
    npos[r] = static_cast<int32_t>(a.num_positions[r < a.rows ? r : 0]);
    m[r] = kMasked;
    l[r] = 0.0f;
  }
  // Decode's few rows run row by row (KeyBlockRows) from their scaled rows in qr; the others
  // from the transposed queries qt, their rows staged in kf (free until the first key block).
  const bool few_rows = nvec == 1;
  float* qr = few_rows && DotScoresFit(a.rows, a.dk) ? a.scratch + layout.qr : nullptr;

  const T* kbase = static_cast<const T*>(a.k_base);
  const T* vbase = static_cast<const T*>(a.v_base);
  const bool quantized = a.k_scales != nullptr;
  // With many rows (prefill) the keys are in L2 and f32 rows are read in place; other types are
  // widened once per block of keys. With one vector of rows (decode) the keys come from memory
  // and the next block's rows are prefetched while this one is computed (bench/README.md
  // "Attention", "Zen 5, session 40"): where they take at most kAttendSpreadMaxBytes (GQA's
  // rows of up to 128 f32), two lines per score column of this block (RowPrefetcher), f32 rows
  // read in place; longer ones (MLA's 576-wide latent), as each row of this block is copied,
  // every row copied as one sequential read. MLA's values are the first dv elements of its key rows: then
  // the widened keys serve as values too.
  const bool v_in_k = a.v_base == a.k_base && a.v_slot_stride == a.k_slot_stride &&
                      a.v_scales == a.k_scales && a.v_scale_stride == a.k_scale_stride &&
                      a.dv <= a.dk;
  const int64_t next_bytes = kb * (a.dk + (v_in_k ? 0 : a.dv)) * static_cast<int64_t>(sizeof(T));
  // A plain bf16 cache under AttendBf16Dot: every path takes the queries rounded to bf16. The
  // row-vector tiles score on vdpbf16ps from the bf16 query pairs (in qt's space), decode's few
  // rows with dk a multiple of 32 from the bf16 query rows (in qr's space), both from the keys
  // as they lie (raw_keys); only the values are widened.
  bool bf16_q = false;
  if constexpr (std::is_same_v<T, hwy::bfloat16_t>) bf16_q = !quantized && AttendBf16Dot();
  const bool pair_scores = bf16_q && qr == nullptr && lanes == 16 && nvec <= 2 && a.dk % 2 == 0;
  const bool row_scores = bf16_q && qr != nullptr && lanes == 16 && a.dk % 32 == 0;
  const bool raw_keys = pair_scores || row_scores;
  const bool spread = few_rows && !raw_keys && next_bytes <= kAttendSpreadMaxBytes;
  uint32_t* qp = reinterpret_cast<uint32_t*>(qt);
  uint16_t* qb = reinterpret_cast<uint16_t*>(qr);
  // Decode on them: the next block's rows prefetched over this block's steps.
  const bool raw_spread = raw_keys && few_rows && next_bytes <= kAttendPairSpreadMaxBytes;
  if (pair_scores) {  // staged as bf16 rows in qr's space
    PackQueryPairs(a.q, a.rows, nvec, a.dk, reinterpret_cast<uint16_t*>(a.scratch + layout.qr),
                   qp);
  } else if (row_scores) {
    for (int r = 0; r < a.rows; ++r) ConvertRowToBf16(a.q[r], a.dk, qb + r * a.dk);
  } else {
    TransposeQueries(a, pitch, bf16_q, qr != nullptr ? qr : kf, qr != nullptr ? nullptr : qt);
  }

  // Prefetches per score step: two per score column of the outer tile (kTile<1> keys x dk
  // steps per tile); for DotScores and the bf16 scores as many as spread the next block's
  // listed lines over its steps: key groups x row pairs x dk / lanes (DotScores) or / 32
  // (Bf16RowScores), tiles of 12 / nvec keys x dk / 2 pairs (Bf16PairScores).
  PrefetchStep step;
  const int64_t key_groups = (kb + kDotKeys - 1) / kDotKeys, row_pairs = (a.rows + 1) / 2;
  const int64_t block_steps =
      pair_scores  ? (kb + 12 / nvec - 1) / (12 / nvec) * (a.dk / 2)
      : row_scores ? key_groups * row_pairs * (a.dk / 32)
      : qr != nullptr ? key_groups * row_pairs * (a.dk / lanes)
                      : 0;
  const bool widen = !std::is_same_v<T, float> || quantized || (few_rows && !spread);
  const float* krow[kAttendKeyBlock];
  const float* vrow[kAttendKeyBlock];
  const uint16_t* kraw[kAttendKeyBlock];  // raw_keys: the bf16 key rows
  Bf16ScoreArgs bf16_args;
  bf16_args.qp = qp;
  bf16_args.qb = qb;
  bf16_args.k = kraw;
  bf16_args.scale = a.scale;
  if (raw_spread) bf16_args.pf = &step;
  RowPrefetcher pf;
  NoStep no_step;
  const int64_t key_end = std::min(n_max, a.key_end);
  for (int64_t j0 = a.key_begin; j0 < key_end; j0 += kb) {
    const int64_t nk = std::min(kb, key_end - j0);
    const bool first = j0 == a.key_begin;
    if (spread || raw_spread) {
      pf.Reset();
      for (int64_t j = j0 + kb; j < std::min(key_end, j0 + 2 * kb); ++j) {
        const int64_t next = a.slots[j];
        pf.Add(kbase + next * a.k_slot_stride, a.dk * sizeof(T));
        if (!v_in_k) pf.Add(vbase + next * a.v_slot_stride, a.dv * sizeof(T));
      }
      step.next = pf.begin();
      step.end = pf.end();
      if (block_steps > 0) {
        step.per = static_cast<int>((pf.end() - pf.begin() + block_steps - 1) / block_steps);
      }
    }
    for (int64_t j = 0; j < nk; ++j) {
      const int64_t slot = a.slots[j0 + j];
      const T* kr = kbase + slot * a.k_slot_stride;
      const T* vr = vbase + slot * a.v_slot_stride;
      if (few_rows && !spread && !raw_spread && j0 + kb + j < key_end) {
        const int64_t next = a.slots[j0 + kb + j];
        const char* kn = reinterpret_cast<const char*>(kbase + next * a.k_slot_stride);
        const char* vn = reinterpret_cast<const char*>(vbase + next * a.v_slot_stride);
        for (size_t b = 0; b < a.dk * sizeof(T); b += 64) hwy::Prefetch(kn + b);
        for (size_t b = 0; b < a.dv * sizeof(T); b += 64) hwy::Prefetch(vn + b);
      }
      if (!widen) {
        krow[j] = reinterpret_cast<const float*>(kr);
        vrow[j] = reinterpret_cast<const float*>(vr);
        continue;
      }
      if (raw_keys) {  // the keys as they lie, the values widened (not quantized here)
        kraw[j] = reinterpret_cast<const uint16_t*>(kr);
        krow[j] = nullptr;
        WidenKvRow(vr, nullptr, a.group, a.dv, vf + j * vpitch);
        vrow[j] = vf + j * vpitch;
        continue;
      }
      const float* ks = quantized ? a.k_scales + slot * a.k_scale_stride : nullptr;
      WidenKvRow(kr, ks, a.group, a.dk, kf + j * a.dk);
      krow[j] = kf + j * a.dk;
      if (v_in_k) {
        vrow[j] = krow[j];
        continue;
      }
      const float* vs = quantized ? a.v_scales + slot * a.v_scale_stride : nullptr;
      WidenKvRow(vr, vs, a.group, a.dv, vf + j * vpitch);
      vrow[j] = vf + j * vpitch;
    }
    int64_t v = 0;
    for (; v + 2 <= nvec; v += 2) {
      const int64_t off = v * lanes;
      KeyBlock<2>(qt + off, pitch, krow, vrow, j0, nk, n_min, a.dk, a.dv, npos + off, s + off,
                  m + off, l + off, alpha + off, o + off, 0, first, no_step,
                  pair_scores ? &bf16_args : nullptr);
    }
#if HWY_TARGET != HWY_SCALAR
    if (qr != nullptr) {
      if (spread) {
        KeyBlockRows(qr, a.rows, krow, vrow, j0, nk, a.dk, a.dv, npos, s, m, l, alpha, o, first,
                     step);
        RowPrefetcher::Rest(step.next, step.end);
      } else {
        KeyBlockRows(qr, a.rows, krow, vrow, j0, nk, a.dk, a.dv, npos, s, m, l, alpha, o, first,
                     no_step, row_scores ? &bf16_args : nullptr);
        if (raw_spread) RowPrefetcher::Rest(step.next, step.end);
      }
      continue;
    }
#endif
    if (v < nvec && spread) {
      KeyBlock<1>(qt, pitch, krow, vrow, j0, nk, n_min, a.dk, a.dv, npos, s, m, l, alpha, o,
                  a.rows, first, step);
      RowPrefetcher::Rest(step.next, step.end);
    } else if (v < nvec) {
      const int64_t off = v * lanes;
      KeyBlock<1>(qt + off, pitch, krow, vrow, j0, nk, n_min, a.dk, a.dv, npos + off, s + off,
                  m + off, l + off, alpha + off, o + off, few_rows ? a.rows : 0, first, no_step,
                  pair_scores ? &bf16_args : nullptr);
      if (raw_spread) RowPrefetcher::Rest(step.next, step.end);
    }
  }
  if (a.key_begin >= key_end) {  // an empty key range: nothing seen, weight 0 in a merge
    for (int r = 0; r < a.rows; ++r) std::fill(a.out[r], a.out[r] + a.dv, 0.0f);
  }
  // A part of a key range: the sums as they are, with each row's max and sum for the merge.
  const bool partial = a.row_max != nullptr;
  if (partial) {
    for (int r = 0; r < a.rows; ++r) {
      a.row_max[r] = m[r];
      a.row_sum[r] = l[r];
    }
  }
  if (a.key_begin >= key_end) return;
  if (few_rows) {
    for (int r = 0; r < a.rows; ++r) {
      const float inv = partial ? 1.0f : 1.0f / l[r];
      const VF vinv = hn::Set(df, inv);
      const float* HWY_RESTRICT orow = o + r * a.dv;
      float* HWY_RESTRICT out = a.out[r];
      int64_t d = 0;
      for (; d + lanes <= a.dv; d += lanes) {
        hn::StoreU(hn::Mul(hn::LoadU(df, orow + d), vinv), df, out + d);
      }
      for (; d < a.dv; ++d) out[d] = orow[d] * inv;
    }
    return;
  }
  // Each row's output, gathered from its column of o, over its sum.
  const hn::RebindToSigned<DF> di;
  const auto column = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(pitch)));
  for (int r = 0; r < a.rows; ++r) {
    const float inv = partial ? 1.0f : 1.0f / l[r];
    const VF vinv = hn::Set(df, inv);
    float* HWY_RESTRICT out = a.out[r];
    int64_t d = 0;
    for (; d + lanes <= a.dv; d += lanes) {
      hn::StoreU(hn::Mul(hn::GatherIndex(df, o + d * pitch + r, column), vinv), df, out + d);
    }
    for (; d < a.dv; ++d) out[d] = o[d * pitch + r] * inv;
  }
}

void AttendBlock(const AttendBlockArgs& a) {
  switch (a.kv_type) {
    case KvType::kF32: return AttendBlockTyped<float>(a);
    case KvType::kBF16: return AttendBlockTyped<hwy::bfloat16_t>(a);
    case KvType::kF8E4M3: return AttendBlockTyped<uint8_t>(a);
    case KvType::kI8: return AttendBlockTyped<int8_t>(a);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dh::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dh::cpu {

HWY_EXPORT(AttendBlock);

void AttendBlock(const AttendBlockArgs& a) { HWY_DYNAMIC_DISPATCH(AttendBlock)(a); }

}  // namespace dh::cpu
#endif  // HWY_ONCE
