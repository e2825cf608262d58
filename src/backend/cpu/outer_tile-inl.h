// Per-SIMD-target register tile of broadcast outer products, shared by the attention score tile
// (attention.cc) and the f32 GEMM's packed panels (gemm.cc). Included by files compiled once per
// target (foreach_target.h), so it uses Highway's per-target include guard instead of #pragma once.
#if defined(DH_BACKEND_CPU_OUTER_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DH_BACKEND_CPU_OUTER_TILE_INL_H_
#undef DH_BACKEND_CPU_OUTER_TILE_INL_H_
#else
#define DH_BACKEND_CPU_OUTER_TILE_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace dh::cpu {
namespace HWY_NAMESPACE {

// acc[j][v] = sum over c in [0, n) of rows[j][c] * panel[c * pitch + v * Lanes(df) ...]: J scalar
// rows, each value broadcast against the NV vectors of one column of a column-major panel (pitch
// floats between its columns). Every accumulator sums along c in order, one FMA per column.
// step() runs once per column: a caller's work spread over the tile's columns (attention's
// prefetches, whose cursor it advances); NoStep does nothing.
struct NoStep {
  HWY_INLINE void operator()() const {}
};
template <int J, int NV, class DF, class Step = NoStep>
HWY_INLINE void OuterTile(DF df, const float* const* rows, const float* HWY_RESTRICT panel,
                          int64_t pitch, int64_t n, hwy::HWY_NAMESPACE::Vec<DF> (&acc)[J][NV],
                          Step&& step = Step()) {
  namespace hn = hwy::HWY_NAMESPACE;
  using V = hn::Vec<DF>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const float* HWY_RESTRICT r[J];
  HWY_UNROLL(12)
  for (int j = 0; j < J; ++j) {
    r[j] = rows[j];
    HWY_UNROLL(2)
    for (int v = 0; v < NV; ++v) acc[j][v] = hn::Zero(df);
  }
  for (int64_t c = 0; c < n; ++c) {
    step();
    V pv[NV];
    HWY_UNROLL(2)
    for (int v = 0; v < NV; ++v) pv[v] = hn::LoadU(df, panel + c * pitch + v * lanes);
    HWY_UNROLL(12)
    for (int j = 0; j < J; ++j) {
      const V b = hn::Set(df, r[j][c]);
      HWY_UNROLL(2)
      for (int v = 0; v < NV; ++v) acc[j][v] = hn::MulAdd(pv[v], b, acc[j][v]);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dh::cpu
HWY_AFTER_NAMESPACE();

#endif  // include guard
