// AVX512-BF16 GEMM (see gemm_bf16.h for the numerics and the packed layout). The intrinsics live
// in functions compiled for AVX-512 + BF16 with a target attribute, so this file builds with the
// project's baseline flags and the kernel runs only where __builtin_cpu_supports says the CPU has
// the instruction. Those functions use no standard-library templates: an inline template
// instantiated with AVX-512 enabled could be the copy the linker keeps for every caller.
#include "backend/cpu/gemm_bf16.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/quant_matmul.h"
#include "backend/cpu/row_view.h"
#include "base/check.h"

#if defined(__x86_64__)
#define DH_BF16_KERNELS 1
// GCC 12 warns about the deliberately undefined pass-through operand inside its own AVX-512
// intrinsics (false positives reported at the inlining site).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#else
#define DH_BF16_KERNELS 0
#endif

namespace dh::cpu {
namespace {

Bf16Dot ModeFromEnv() {
  // Auto unless told otherwise: x rounded to bf16 as llama.cpp and bf16 PyTorch do, in the GEMM
  // and the GEMV alike (Bf16DotRoundsX), at twice the f32 multiply rate; `off` keeps x exact.
  const char* v = std::getenv("DH_BF16_DOT");
  if (v == nullptr) return Bf16Dot::kAuto;
  const std::string_view s(v);
  if (s == "on") return Bf16Dot::kOn;
  if (s == "off") return Bf16Dot::kOff;
  if (s != "auto" && !s.empty()) {
    std::fprintf(stderr, "DH_BF16_DOT=%s: expected on, off or auto; using auto\n", v);
  }
  return Bf16Dot::kAuto;
}

std::atomic<Bf16Dot> g_mode{ModeFromEnv()};

constexpr int kMR = 8;                             // rows of x per micro-tile
constexpr int kNR = 3;                             // 16-row weight panels per micro-tile
constexpr int64_t kPanel = 16;                     // weight rows per panel (one zmm of f32)
constexpr int64_t kGroupRows = kNR * kPanel;       // 48 output features per micro-tile
constexpr int64_t kMaxBlockRows = 2 * kGroupRows;  // weight rows per packed block
constexpr int64_t kDotMaxRows = 2 * kMR;  // rows of x the unpacked dot tiles take (RunDotBlock)
// Column pairs per K block: the 8-row x tile is 32 KiB (L1), a packed block 384 KiB (L2).
constexpr int64_t kKcPairsMax = 1024;
// FP8 weights: the most weight rows of one packed block, which stays inside one block of weight
// rows (its scales): a DeepSeek block of 128 rows is one packed block of 8 panels.
constexpr int64_t kFp8MaxBlockRows = 128;
constexpr int kProbeChains = 16;  // > vdpbf16ps latency x pipes of current x86 cores

#if DH_BF16_KERNELS
#define DH_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define DH_BF16_INLINE inline __attribute__((always_inline))

// Index vectors of the 16 x 16 u32 transpose: at step s (distance d = 8 >> s) rows i and i + d
// (bit d of i clear) swap their off-diagonal d-wide blocks.
struct TransposeIdx {
  alignas(64) int32_t lo[4][16];
  alignas(64) int32_t hi[4][16];
};
constexpr TransposeIdx MakeTransposeIdx() {
  TransposeIdx t{};
  for (int s = 0; s < 4; ++s) {
    const int d = 8 >> s;
    for (int c = 0; c < 16; ++c) {
      t.lo[s][c] = (c & d) ? 16 + c - d : c;
      t.hi[s][c] = (c & d) ? 16 + c : c + d;
    }
  }
  return t;
}
constexpr TransposeIdx kTransposeIdx = MakeTransposeIdx();

// r[i][c] -> r[c][i] for 16 vectors of 16 u32.
DH_BF16_TARGET DH_BF16_INLINE void Transpose16(__m512i* r) {
#pragma GCC unroll 4
  for (int s = 0; s < 4; ++s) {
    const int d = 8 >> s;
    const __m512i lo = _mm512_load_si512(kTransposeIdx.lo[s]);
    const __m512i hi = _mm512_load_si512(kTransposeIdx.hi[s]);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (i & d) continue;
      const __m512i a = r[i], b = r[i + d];
      r[i] = _mm512_permutex2var_epi32(a, lo, b);
      r[i + d] = _mm512_permutex2var_epi32(a, hi, b);
    }
  }
}

// Columns [i, i + 16) of an x row of k floats rounded to bf16 (nearest even); *m gets the mask
// of those that exist (all 16 but in the last chunk).
DH_BF16_TARGET DH_BF16_INLINE __m256i Bf16Chunk(const float* x, int64_t k, int64_t i,
                                                __mmask16* m) {
  *m = k - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (k - i)) - 1);
  return (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(*m, x + i));
}

// x row (k floats) -> bf16, pairs u32 of two columns; an odd k leaves the last pair's high half 0.
DH_BF16_TARGET void ConvertRow(const float* x, int64_t k, uint16_t* out) {
  for (int64_t i = 0; i < k; i += 16) {
    __mmask16 m;
    const __m256i b = Bf16Chunk(x, k, i, &m);
    _mm256_mask_storeu_epi16(out + i, m, b);
  }
  if (k % 2 != 0) out[k] = 0;
}

// x row (k floats) -> bf16 (as ConvertRow) -> f32, into out (k floats).
DH_BF16_TARGET void RoundRow(const float* x, int64_t k, float* out) {
  for (int64_t i = 0; i < k; i += 16) {
    __mmask16 m;
    const __m256i b = Bf16Chunk(x, k, i, &m);
    _mm512_mask_storeu_epi32(out + i, m, _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
}

// 32 columns of one bf16 weight row as they lie (column c0 on; mask: those that exist), and the
// prefetch of the cache line they come from (one line per 32 columns).
struct Bf16RowLoader {
  const uint16_t* w;
  int64_t ws;  // elements between rows
  DH_BF16_TARGET DH_BF16_INLINE __m512i Load(int64_t row, int64_t c0, __mmask32 m) const {
    return _mm512_maskz_loadu_epi16(m, w + row * ws + c0);
  }
  DH_BF16_TARGET DH_BF16_INLINE __m512i Load(int64_t row, int64_t c0) const {
    return _mm512_loadu_si512(w + row * ws + c0);
  }
  DH_BF16_TARGET DH_BF16_INLINE void Prefetch(int64_t row, int64_t c0) const {
    _mm_prefetch(reinterpret_cast<const char*>(w + row * ws + c0), _MM_HINT_T0);
  }
};

// e4m3 codes decode to bf16 times 2^8 (kFp8Bf16Scale), exactly (an e4m3 value has 3 mantissa
// bits, bf16 keeps 7). Sign-extended to 16 bits and shifted left 4, a code's exponent and mantissa
// bits land on bf16's low exponent bits and top mantissa bits, its sign on the sign; setting the
// exponent's top bit makes that 2^(E + 1) (1 + M / 8) = value * 2^8 for every normal code
// (E >= 1). Subnormal codes (E = 0: value M * 2^-9, times 2^8 M / 2) take their bf16 from a
// table of 8 (vpermw, indexed by the code's low bits), the sign put back by a bit select.
constexpr float kFp8Bf16Scale = 0x1p8f;
struct Fp8SubnormalTable {
  alignas(64) uint16_t v[32];
};
constexpr Fp8SubnormalTable kFp8Subnormals = {
    {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4020, 0x4040, 0x4060}};  // M / 2, M = 0..7

DH_BF16_TARGET DH_BF16_INLINE __m512bh Fp8ToBf16(__m256i codes) {
  const __m512i w = _mm512_cvtepi8_epi16(codes);
  const __m512i normal = _mm512_ternarylogic_epi32(  // (w << 4) & 0x87F0 | 0x4000
      _mm512_slli_epi16(w, 4), _mm512_set1_epi16(static_cast<short>(0x87F0)),
      _mm512_set1_epi16(0x4000), 0xEA);
  const __mmask32 sub = _mm512_testn_epi16_mask(w, _mm512_set1_epi16(0x0078));
  const __m512i mag =
      _mm512_mask_permutexvar_epi16(normal, sub, w, _mm512_load_si512(kFp8Subnormals.v));
  // Sign bit from w, the rest from mag: C ? B : A with A = mag, B = w, C = 0x8000.
  return (__m512bh)_mm512_ternarylogic_epi32(mag, w, _mm512_set1_epi16(static_cast<short>(0x8000)),
                                             0xD8);
}
// 32 codes at p (mask: those to read, the rest 0).
DH_BF16_TARGET DH_BF16_INLINE __m512bh Fp8ToBf16x32(const uint8_t* p, __mmask32 m) {
  return Fp8ToBf16(_mm256_maskz_loadu_epi8(m, p));
}
DH_BF16_TARGET DH_BF16_INLINE __m512bh Fp8ToBf16x32(const uint8_t* p) {
  return Fp8ToBf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 32 columns of one FP8 weight row decoded to bf16 (the values without their block scale), and
// the prefetch of their cache line (one line per 64 columns: at every other call).
struct Fp8RowLoader {
  const uint8_t* q;
  int64_t qs;  // bytes between rows
  DH_BF16_TARGET DH_BF16_INLINE __m512i Load(int64_t row, int64_t c0, __mmask32 m) const {
    return (__m512i)Fp8ToBf16x32(q + row * qs + c0, m);
  }
  DH_BF16_TARGET DH_BF16_INLINE __m512i Load(int64_t row, int64_t c0) const {
    return (__m512i)Fp8ToBf16x32(q + row * qs + c0);
  }
  DH_BF16_TARGET DH_BF16_INLINE void Prefetch(int64_t row, int64_t c0) const {
    if ((c0 & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(q + row * qs + c0), _MM_HINT_T0);
  }
};

// Weight rows [0, rows) (k columns, as `rows` loads them), column pairs [p0, p0 + pn), into dst
// as panels of 16 rows: dst[(panel * pn + t) * 16 + i] = pair p0 + t of row 16 panel + i (0 past
// the last row or column).
template <class Rows>
DH_BF16_TARGET void PackBlock(const Rows& src, int64_t rows, int64_t k, int64_t p0, int64_t pn,
                              uint32_t* dst) {
  const int64_t panels = (rows + kPanel - 1) / kPanel;
  for (int64_t p = 0; p < panels; ++p) {
    uint32_t* panel = dst + p * pn * kPanel;
    for (int64_t t0 = 0; t0 < pn; t0 += 16) {
      const int64_t c0 = 2 * (p0 + t0);  // first column of this chunk
      const int64_t cols = k - c0;
      const __mmask32 cm = cols >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << cols) - 1);
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const int64_t row = p * kPanel + i;
        r[i] = row < rows ? src.Load(row, c0, cm) : _mm512_setzero_si512();
      }
      Transpose16(r);
      const int64_t tn = pn - t0 < 16 ? pn - t0 : 16;
      if (tn == 16) {
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t) _mm512_storeu_si512(panel + (t0 + t) * kPanel, r[t]);
      } else {
        for (int t = 0; t < tn; ++t) _mm512_storeu_si512(panel + (t0 + t) * kPanel, r[t]);
      }
    }
  }
}

// out[r][c] (=, or += when accumulate) sum over pairs t of x pair (r, t) . weight pair (c, t)
// for MR rows of x and NR panels (16 output features each); cols_left output features exist
// from out's first column on (the last panel may be partial).
template <int MR, int NR>
DH_BF16_TARGET DH_BF16_INLINE void Micro(const uint32_t* xb, int64_t xps, const uint32_t* wp,
                                         int64_t pstride, int64_t pn, float* out, int64_t os,
                                         int64_t cols_left, const float* bias, bool accumulate) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 3
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t t = 0; t < pn; ++t) {
    __m512bh wv[NR];
#pragma GCC unroll 3
    for (int c = 0; c < NR; ++c)
      wv[c] = (__m512bh)_mm512_loadu_si512(wp + c * pstride + t * kPanel);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xb[r * xps + t]));
#pragma GCC unroll 3
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
#pragma GCC unroll 3
  for (int c = 0; c < NR; ++c) {
    const int64_t valid = cols_left - c * kPanel;
    if (valid <= 0) break;
    const __mmask16 m =
        valid >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
    const __m512 b = !accumulate && bias != nullptr ? _mm512_maskz_loadu_ps(m, bias + c * kPanel)
                                                    : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      float* o = out + r * os + c * kPanel;
      const __m512 prev = accumulate ? _mm512_maskz_loadu_ps(m, o) : b;
      _mm512_mask_storeu_ps(o, m, _mm512_add_ps(acc[r][c], prev));
    }
  }
}

template <int NR>
DH_BF16_TARGET DH_BF16_INLINE void RowTile(int mr, const uint32_t* xb, int64_t xps,
                                           const uint32_t* wp, int64_t pstride, int64_t pn,
                                           float* out, int64_t os, int64_t cols_left,
                                           const float* bias, bool accumulate) {
  switch (mr) {
#define DH_BF16_CASE(MR) \
  case MR:               \
    return Micro<MR, NR>(xb, xps, wp, pstride, pn, out, os, cols_left, bias, accumulate);
    DH_BF16_CASE(1)
    DH_BF16_CASE(2)
    DH_BF16_CASE(3)
    DH_BF16_CASE(4)
    DH_BF16_CASE(5)
    DH_BF16_CASE(6)
    DH_BF16_CASE(7)
    DH_BF16_CASE(8)
#undef DH_BF16_CASE
    default:
      return;
  }
}

// One x tile (mr <= kMR rows, xps pairs apart, starting at the block's first pair) against every
// 48-row group of a packed block of nbb weight rows: out rows from orow, output features from
// the block's first; bias (null or the block's first feature's) only when not accumulating.
DH_BF16_TARGET void TileOverBlock(int mr, const uint32_t* xr, int64_t xps, const uint32_t* pack,
                                  int64_t pn, int64_t nbb, float* orow, int64_t os,
                                  const float* bias, bool accumulate) {
  const int64_t pstride = pn * kPanel;
  for (int64_t g = 0; g < nbb; g += kGroupRows) {
    const int64_t cols = nbb - g;
    const uint32_t* wp = pack + (g / kPanel) * pstride;
    const float* b = bias != nullptr ? bias + g : nullptr;
    if (cols > 2 * kPanel) {
      RowTile<3>(mr, xr, xps, wp, pstride, pn, orow + g, os, cols, b, accumulate);
    } else if (cols > kPanel) {
      RowTile<2>(mr, xr, xps, wp, pstride, pn, orow + g, os, cols, b, accumulate);
    } else {
      RowTile<1>(mr, xr, xps, wp, pstride, pn, orow + g, os, cols, b, accumulate);
    }
  }
}

// Weight rows [j0, j0 + nbb) x column pairs [p0, p0 + pn) for every row of x: pack, then every
// 8-row x tile over every 48-row group of the packed block.
DH_BF16_TARGET void RunBlock(const GemmArgs& a, const uint32_t* xb, int64_t kp, int64_t j0,
                             int64_t nbb, int64_t p0, int64_t pn, uint32_t* pack) {
  PackBlock(Bf16RowLoader{static_cast<const uint16_t*>(a.w) + j0 * a.w_stride, a.w_stride}, nbb,
            a.k, p0, pn, pack);
  const float* bias = a.bias != nullptr ? a.bias + j0 : nullptr;
  for (int64_t r = 0; r < a.m; r += kMR) {
    const int mr = a.m - r < kMR ? static_cast<int>(a.m - r) : kMR;
    TileOverBlock(mr, xb + r * kp + p0, kp, pack, pn, nbb, a.out + r * a.out_stride + j0,
                  a.out_stride, bias, p0 > 0);
  }
}

// Few rows of x (batched decode): no packing, the weight rows are read once, as they lie. out[r][c]
// (= sum + bias) for MR rows of x (bf16, xs elements apart) by NR weight rows (as `w` loads them:
// bf16 rows, or FP8 codes decoded in registers) over all k columns: 32 columns per vdpbf16ps, a
// horizontal sum per output at the end. With kPrefetch the NR rows after the tile (the next
// tile's, same columns) are prefetched a cache line per row as the tile reads one, as the f32
// GEMM's tiles do (gemm.cc, GemmTile): the hardware prefetchers do not run ahead of weight rows
// read this slowly. Each output is one chain whatever MR and NR, so a row gives the same bits in
// any tile.
template <int MR, int NR, bool kPrefetch, class Rows>
DH_BF16_TARGET DH_BF16_INLINE void DotTile(const uint16_t* xb, int64_t xs, const Rows& w,
                                           int64_t k, float* out, int64_t os, const float* bias) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 3
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    if (kPrefetch) {
#pragma GCC unroll 3
      for (int c = 0; c < NR; ++c) w.Prefetch(NR + c, i);
    }
    __m512bh wv[NR];
#pragma GCC unroll 3
    for (int c = 0; c < NR; ++c) wv[c] = (__m512bh)w.Load(c, i);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + r * xs + i);
#pragma GCC unroll 3
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  if (i < k) {
    const __mmask32 m = static_cast<__mmask32>((1u << (k - i)) - 1);
    __m512bh wv[NR];
#pragma GCC unroll 3
    for (int c = 0; c < NR; ++c) wv[c] = (__m512bh)w.Load(c, i, m);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, xb + r * xs + i);
#pragma GCC unroll 3
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 3
    for (int c = 0; c < NR; ++c) {
      out[r * os + c] = _mm512_reduce_add_ps(acc[r][c]) + (bias != nullptr ? bias[c] : 0.0f);
    }
  }
}

// Weight rows [0, rows) of w; with prefetch each tile prefetches the next tile's rows while they
// lie within the rows.
template <int MR>
DH_BF16_TARGET void DotRows(const uint16_t* xb, int64_t xs, const uint16_t* w, int64_t ws,
                            int64_t k, int64_t rows, bool prefetch, float* out, int64_t os,
                            const float* bias) {
  int64_t c = 0;
  for (; c + 3 <= rows; c += 3) {
    const float* b = bias != nullptr ? bias + c : nullptr;
    const Bf16RowLoader tile{w + c * ws, ws};
    if (prefetch && c + 6 <= rows) {
      DotTile<MR, 3, true>(xb, xs, tile, k, out + c, os, b);
    } else {
      DotTile<MR, 3, false>(xb, xs, tile, k, out + c, os, b);
    }
  }
  for (; c < rows; ++c) {
    DotTile<MR, 1, false>(xb, xs, Bf16RowLoader{w + c * ws, ws}, k, out + c, os,
                          bias != nullptr ? bias + c : nullptr);
  }
}

// Weight rows [j0, j0 + rows) for rows [r0, r0 + mr) of x (mr <= kMR); with prefetch the tiles
// prefetch ahead within these rows only (the next block may be another thread's).
DH_BF16_TARGET void RunDotBlock(const GemmArgs& a, const uint32_t* xb, int64_t kp, int64_t r0,
                                int64_t mr, int64_t j0, int64_t rows, bool prefetch) {
  const uint16_t* x16 = reinterpret_cast<const uint16_t*>(xb + r0 * kp);
  const uint16_t* w = static_cast<const uint16_t*>(a.w) + j0 * a.w_stride;
  float* out = a.out + r0 * a.out_stride + j0;
  const float* bias = a.bias != nullptr ? a.bias + j0 : nullptr;
  const int64_t xs = 2 * kp;
  switch (mr) {
#define DH_BF16_CASE(MR) \
  case MR:               \
    return DotRows<MR>(x16, xs, w, a.w_stride, a.k, rows, prefetch, out, a.out_stride, bias);
    DH_BF16_CASE(1)
    DH_BF16_CASE(2)
    DH_BF16_CASE(3)
    DH_BF16_CASE(4)
    DH_BF16_CASE(5)
    DH_BF16_CASE(6)
    DH_BF16_CASE(7)
    DH_BF16_CASE(8)
#undef DH_BF16_CASE
    default:
      return;
  }
}

// FP8 weights (e4m3 codes, one f32 scale per block_rows x block_cols block). Every weight row of
// one block of rows shares the scales of its column blocks, so x is multiplied by them once per
// block of rows and rounded to bf16, and the codes are decoded to bf16 exactly (Fp8ToBf16): each
// product bf16(x * scale) * value is exact in f32, the sums are f32.

// Columns [c0, c1) of one x row times the scale of their column block / 2^8 (s: the scales of one
// block of weight rows, bc columns per block; the codes decode to value * 2^8), rounded to bf16
// (nearest even) into out[0, c1 - c0). A power of two commutes with the rounding, so the products
// are bf16(x * scale) * value.
DH_BF16_TARGET void ScaleRowToBf16(const float* x, int64_t c0, int64_t c1, const float* s,
                                   int64_t bc, uint16_t* out) {
  for (int64_t c = c0; c < c1;) {
    const int64_t bi = c / bc;
    const int64_t e = c1 < (bi + 1) * bc ? c1 : (bi + 1) * bc;
    const __m512 scale = _mm512_set1_ps(s[bi] / kFp8Bf16Scale);
    for (; c < e; c += 16) {
      const __mmask16 m = e - c >= 16 ? static_cast<__mmask16>(0xFFFF)
                                      : static_cast<__mmask16>((1u << (e - c)) - 1);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + c), scale);
      _mm256_mask_storeu_epi16(out + (c - c0), m, (__m256i)_mm512_cvtneps_pbh(v));
    }
    c = e;
  }
}

// Tiles of up to kFp8TileAccs accumulators: 8 rows of x by 3 weight rows, or 4 by 4 for calls
// of up to 4 rows (four weight rows in flight, as the f32 FP8 tiles stream one row of x).
constexpr int kFp8TileAccs = 24;
constexpr int64_t kFp8WideTileMaxRows = 4;
// The tile shapes Fp8DotRange uses fit, so Fp8DotTiles' skipped shapes are never asked for.
static_assert(kMR * kNR <= kFp8TileAccs && kFp8WideTileMaxRows * 4 <= kFp8TileAccs);

template <int NR, bool kPrefetch>
DH_BF16_TARGET void Fp8DotTiles(int mr, const uint16_t* xb, int64_t xs, const uint8_t* q,
                                int64_t qs, int64_t k, float* out, int64_t os, const float* bias) {
  switch (mr) {
#define DH_BF16_CASE(MR)                                                              \
  case MR:                                                                            \
    if constexpr (MR * NR <= kFp8TileAccs) {                                          \
      return DotTile<MR, NR, kPrefetch>(xb, xs, Fp8RowLoader{q, qs}, k, out, os, bias); \
    }                                                                                 \
    return;
    DH_BF16_CASE(1)
    DH_BF16_CASE(2)
    DH_BF16_CASE(3)
    DH_BF16_CASE(4)
    DH_BF16_CASE(5)
    DH_BF16_CASE(6)
    DH_BF16_CASE(7)
    DH_BF16_CASE(8)
#undef DH_BF16_CASE
    default:
      return;
  }
}

// One tile of nr (1-4) weight rows against mr rows of x; only full-width tiles (3 or 4 rows)
// prefetch the next tile's rows.
DH_BF16_TARGET void Fp8Tile(int mr, int64_t nr, bool prefetch, const uint16_t* xb, int64_t xs,
                            const uint8_t* q, int64_t qs, int64_t k, float* out, int64_t os,
                            const float* bias) {
  switch (nr) {
    case 4:
      return prefetch ? Fp8DotTiles<4, true>(mr, xb, xs, q, qs, k, out, os, bias)
                      : Fp8DotTiles<4, false>(mr, xb, xs, q, qs, k, out, os, bias);
    case 3:
      return prefetch ? Fp8DotTiles<3, true>(mr, xb, xs, q, qs, k, out, os, bias)
                      : Fp8DotTiles<3, false>(mr, xb, xs, q, qs, k, out, os, bias);
    case 2:
      return Fp8DotTiles<2, false>(mr, xb, xs, q, qs, k, out, os, bias);
    default:
      return Fp8DotTiles<1, false>(mr, xb, xs, q, qs, k, out, os, bias);
  }
}

// Weight rows [n_begin, n_end) for every row of x: per block of weight rows, x scaled by its
// scales into xb (m rows of k), then tiles of 3 weight rows (4 for up to 4 rows of x; fewer at a
// block's end) against kMR rows of x at a time, the tile's first pass prefetching the next tile's
// rows (the later passes find the tile in L1).
DH_BF16_TARGET void Fp8DotRange(const Fp8MatMulArgs& a, int64_t n_begin, int64_t n_end,
                                uint16_t* xb) {
  const int64_t k = a.k, br = a.block_rows;
  const int64_t width = a.m <= kFp8WideTileMaxRows ? 4 : kNR;
  for (int64_t b0 = n_begin / br * br; b0 < n_end; b0 += br) {
    const float* s = a.scales + (b0 / br) * a.scale_stride;
    for (int64_t r = 0; r < a.m; ++r) {
      ScaleRowToBf16(a.x + r * a.x_stride, 0, k, s, a.block_cols, xb + r * k);
    }
    const int64_t j_end = n_end < b0 + br ? n_end : b0 + br;
    for (int64_t j = n_begin > b0 ? n_begin : b0; j < j_end; j += width) {
      const int64_t nr = j_end - j < width ? j_end - j : width;
      const uint8_t* q = a.q + j * a.q_stride;
      const float* bias = a.bias != nullptr ? a.bias + j : nullptr;
      for (int64_t r = 0; r < a.m; r += kMR) {
        const int mr = a.m - r < kMR ? static_cast<int>(a.m - r) : kMR;
        const uint16_t* x = xb + r * k;
        float* out = a.out + r * a.out_stride + j;
        const bool prefetch = nr == width && r == 0 && j + width < n_end;
        Fp8Tile(mr, nr, prefetch, x, k, q, a.q_stride, k, out, a.out_stride, bias);
      }
    }
  }
}

// Weight rows [j0, j0 + nbb) of one block of weight rows (whose scales are s) x column pairs
// [p0, p0 + pn) for every row of x: the codes decoded into packed panels, then per 8-row x tile
// its columns scaled and rounded into xt (kMR rows of pn pairs) and run over the block.
DH_BF16_TARGET void RunFp8Block(const Fp8MatMulArgs& a, const float* s, int64_t j0, int64_t nbb,
                                int64_t p0, int64_t pn, uint32_t* pack, uint32_t* xt) {
  PackBlock(Fp8RowLoader{a.q + j0 * a.q_stride, a.q_stride}, nbb, a.k, p0, pn, pack);
  const int64_t c0 = 2 * p0, c1 = a.k < 2 * (p0 + pn) ? a.k : 2 * (p0 + pn);
  const float* bias = a.bias != nullptr ? a.bias + j0 : nullptr;
  for (int64_t r = 0; r < a.m; r += kMR) {
    const int mr = a.m - r < kMR ? static_cast<int>(a.m - r) : kMR;
    for (int i = 0; i < mr; ++i) {
      uint16_t* row = reinterpret_cast<uint16_t*>(xt + i * pn);
      ScaleRowToBf16(a.x + (r + i) * a.x_stride, c0, c1, s, a.block_cols, row);
      if (c1 - c0 < 2 * pn) row[c1 - c0] = 0;  // odd k: the last pair's high half
    }
    TileOverBlock(mr, xt, pn, pack, pn, nbb, a.out + r * a.out_stride + j0, a.out_stride, bias,
                  p0 > 0);
  }
}

DH_BF16_TARGET float ProbeImpl(int64_t iters) {
  __m512 acc[kProbeChains];
#pragma GCC unroll 16
  for (int c = 0; c < kProbeChains; ++c) acc[c] = _mm512_set1_ps(1.0f + 0.001f * c);
  // bf16 pairs (1.0, 1.0) and (2^-24, 2^-24): the sums grow slowly and stay normal.
  const __m512bh ones = (__m512bh)_mm512_set1_epi32(0x3F803F80);
  const __m512bh tiny = (__m512bh)_mm512_set1_epi32(0x33803380);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kProbeChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], ones, tiny);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kProbeChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return _mm512_reduce_add_ps(s);
}
#endif  // DH_BF16_KERNELS

}  // namespace

void SetBf16DotForTest(Bf16Dot mode) { g_mode.store(mode); }

Bf16Dot Bf16DotMode() { return g_mode.load(); }

bool Bf16DotAvailable() {
#if DH_BF16_KERNELS
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16");
  }();
  return ok;
#else
  return false;
#endif
}

bool Bf16DotRoundsX() {
  if (g_mode.load(std::memory_order_relaxed) == Bf16Dot::kOff || !Bf16DotAvailable()) return false;
  // Not hwy::SupportedTargets(): it would reset the dispatch to the CPU's best target on every
  // call (cpu_kernels.h, DispatchesAvx512).
  return DispatchesAvx512();
}

bool UseBf16Dot(const GemmArgs& a) {
  return a.wtype == WType::kBF16 && a.rows_fn == nullptr && !a.exact_x && a.k > 0 &&
         Bf16DotRoundsX();
}

void RoundRowsToBf16(const float* x, int64_t x_stride, int64_t m, int64_t k, float* out) {
#if DH_BF16_KERNELS
  DH_CHECK(Bf16DotAvailable(), "bf16 rounding on a CPU without AVX512-BF16");
  for (int64_t r = 0; r < m; ++r) RoundRow(x + r * x_stride, k, out + r * k);
#else
  (void)x;
  (void)x_stride;
  (void)m;
  (void)k;
  (void)out;
  DH_CHECK(false, "bf16 rounding is x86 only");
#endif
}

void ConvertRowToBf16(const float* x, int64_t k, uint16_t* out) {
#if DH_BF16_KERNELS
  DH_CHECK(Bf16DotAvailable(), "bf16 rounding on a CPU without AVX512-BF16");
  ConvertRow(x, k, out);
#else
  (void)x;
  (void)k;
  (void)out;
  DH_CHECK(false, "bf16 rounding is x86 only");
#endif
}

void Bf16DotGemm(const GemmArgs& a, ThreadPool& pool) {
#if DH_BF16_KERNELS
  if (a.m <= 0 || a.n <= 0) return;
  DH_CHECK(UseBf16Dot(a), "bf16 dot GEMM called for a call it does not take");
  const int64_t kp = (a.k + 1) / 2;  // column pairs
  // x as bf16 pairs, this thread's buffer reused across calls (grows once per shape).
  thread_local std::vector<uint32_t> tl_x;
  std::vector<uint32_t>& xbuf = tl_x;
  xbuf.resize(static_cast<size_t>(a.m * kp));
  uint32_t* xb = xbuf.data();
  pool.ParallelFor(a.m, GrainFor(a.k), [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      ConvertRow(a.x + r * a.x_stride, a.k, reinterpret_cast<uint16_t*>(xb + r * kp));
    }
  });
  const int64_t threads = pool.num_threads();
  const bool small = a.m * a.n * a.k < kGemmMinParallelWork;  // one thread (gemm.h)
  if (a.m <= kDotMaxRows) {
    // One or two x tiles: the weight rows stream once from memory, unpacked, in blocks handed out
    // dynamically; a second tile of x re-reads its block from L2 (blocks of at most 192 KiB then).
    const bool two = a.m > kMR;
    const int64_t fit = std::max<int64_t>(1, (int64_t{192} << 10) / (2 * a.k) / kNR) * kNR;
    const int64_t block_rows = two ? std::min(kGroupRows, fit) : kGroupRows;
    const int64_t blocks = (a.n + block_rows - 1) / block_rows;
    std::atomic<int64_t> next{0};
    auto work = [&](int) {
      for (int64_t b = next.fetch_add(1); b < blocks; b = next.fetch_add(1)) {
        const int64_t j0 = b * block_rows, rows = std::min(block_rows, a.n - j0);
        RunDotBlock(a, xb, kp, 0, std::min<int64_t>(a.m, kMR), j0, rows, true);
        if (two) RunDotBlock(a, xb, kp, kMR, a.m - kMR, j0, rows, false);  // block in L2
      }
    };
    if (threads <= 1 || blocks == 1 || small) return work(0);
    return pool.RunOnAll(work);
  }
  // Equal K blocks of at most kKcPairsMax pairs, multiples of 16 pairs (one transpose).
  const int64_t kblocks = (kp + kKcPairsMax - 1) / kKcPairsMax;
  const int64_t kcp = ((kp + kblocks - 1) / kblocks + 15) / 16 * 16;
  // Blocks of output features: 48 or 96 rows, at least ~4 per thread where n allows.
  const int64_t per = (a.n + 4 * threads - 1) / (4 * threads);
  const int64_t nb = per <= kGroupRows ? kGroupRows : kMaxBlockRows;
  const int64_t blocks = (a.n + nb - 1) / nb;
  std::atomic<int64_t> next{0};
  auto work = [&](int) {
    thread_local std::vector<uint32_t> tl_pack;
    tl_pack.resize(static_cast<size_t>(nb * std::min(kcp, kp)));
    for (int64_t b = next.fetch_add(1); b < blocks; b = next.fetch_add(1)) {
      const int64_t j0 = b * nb, nbb = std::min(nb, a.n - j0);
      for (int64_t p0 = 0; p0 < kp; p0 += kcp) {
        RunBlock(a, xb, kp, j0, nbb, p0, std::min(kcp, kp - p0), tl_pack.data());
      }
    }
  };
  if (threads <= 1 || blocks == 1 || small) return work(0);
  pool.RunOnAll(work);
#else
  (void)a;
  (void)pool;
  DH_CHECK(false, "bf16 dot GEMM is x86 only");
#endif
}

bool UseFp8Bf16Dot(bool exact_x) { return !exact_x && Bf16DotRoundsX(); }

void Fp8Bf16DotMatMul(const Fp8MatMulArgs& a, int64_t n, ThreadPool& pool) {
#if DH_BF16_KERNELS
  DH_CHECK(a.block_rows > 0 && a.block_cols > 0 && a.k > 0, "fp8 matmul: k={} block {}x{}", a.k,
           a.block_rows, a.block_cols);
  DH_CHECK(Bf16DotRoundsX(), "fp8 bf16 dot called with x exact");
  if (a.m <= 0 || n <= 0) return;
  if (a.m <= kFp8DotTileMaxRows) {
    pool.ParallelFor(n, GrainFor(a.m * a.k), [&](size_t b, size_t e) {
      thread_local std::vector<uint16_t> tl_x;  // this thread's scaled x, grown once per shape
      tl_x.resize(static_cast<size_t>(a.m * a.k));
      Fp8DotRange(a, static_cast<int64_t>(b), static_cast<int64_t>(e), tl_x.data());
    });
    return;
  }
  // Packed panels: blocks of output features inside one block of weight rows (its scales), so a
  // block of 128 rows is one block of 8 panels; equal K blocks of at most kKcPairsMax pairs, the
  // outer loop (every block of a K block before the next K block), so that the K block's slice
  // of x, which each block scales again, stays in cache (K = 8960, M = 512: 35 against 22 ms
  // with all K blocks of one block in turn, when x is 18 MB of f32).
  const int64_t br = a.block_rows;
  const int64_t piece = br <= kFp8MaxBlockRows ? br : kMaxBlockRows;
  const int64_t per_block = (br + piece - 1) / piece;
  const int64_t items = (n + br - 1) / br * per_block;
  const int64_t kp = (a.k + 1) / 2;
  const int64_t kblocks = (kp + kKcPairsMax - 1) / kKcPairsMax;
  const int64_t kcp = ((kp + kblocks - 1) / kblocks + 15) / 16 * 16;
  const bool one_thread =
      pool.num_threads() <= 1 || items == 1 || a.m * n * a.k < kGemmMinParallelWork;
  for (int64_t p0 = 0; p0 < kp; p0 += kcp) {
    std::atomic<int64_t> next{0};
    auto work = [&](int) {
      thread_local std::vector<uint32_t> tl_pack, tl_xt;
      tl_pack.resize(static_cast<size_t>(piece * std::min(kcp, kp)));
      tl_xt.resize(static_cast<size_t>(kMR * std::min(kcp, kp)));
      for (int64_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) {
        const int64_t rb = i / per_block, in_block = (i % per_block) * piece;
        const int64_t j0 = rb * br + in_block;
        if (j0 >= n) continue;
        const int64_t nbb = std::min({piece, br - in_block, n - j0});
        RunFp8Block(a, a.scales + rb * a.scale_stride, j0, nbb, p0, std::min(kcp, kp - p0),
                    tl_pack.data(), tl_xt.data());
      }
    };
    if (one_thread) {
      work(0);
    } else {
      pool.RunOnAll(work);
    }
  }
#else
  (void)a;
  (void)n;
  (void)pool;
  DH_CHECK(false, "fp8 bf16 dot is x86 only");
#endif
}

int64_t Bf16DotProbeFlops(int64_t iters) {
  return Bf16DotAvailable() ? iters * kProbeChains * 32 * 2 : 0;
}

float Bf16DotProbe(int64_t iters) {
#if DH_BF16_KERNELS
  DH_CHECK(Bf16DotAvailable(), "bf16 probe on a CPU without AVX512-BF16");
  return ProbeImpl(iters);
#else
  (void)iters;
  return 0.0f;
#endif
}

}  // namespace dh::cpu

#if DH_BF16_KERNELS
#pragma GCC diagnostic pop
#endif
