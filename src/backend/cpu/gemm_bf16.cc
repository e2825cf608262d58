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

// Weight rows [0, rows) of w (bf16, ws elements apart, k columns), column pairs [p0, p0 + pn),
// into dst as panels of 16 rows: dst[(panel * pn + t) * 16 + i] = pair p0 + t of row 16 panel + i
// (0 past the last row or column).
DH_BF16_TARGET void PackBlock(const uint16_t* w, int64_t ws, int64_t rows, int64_t k, int64_t p0,
                              int64_t pn, uint32_t* dst) {
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
        r[i] =
            row < rows ? _mm512_maskz_loadu_epi16(cm, w + row * ws + c0) : _mm512_setzero_si512();
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

// Weight rows [j0, j0 + nbb) x column pairs [p0, p0 + pn) for every row of x: pack, then every
// 8-row x tile over every 48-row group of the packed block.
DH_BF16_TARGET void RunBlock(const GemmArgs& a, const uint32_t* xb, int64_t kp, int64_t j0,
                             int64_t nbb, int64_t p0, int64_t pn, uint32_t* pack) {
  PackBlock(static_cast<const uint16_t*>(a.w) + j0 * a.w_stride, a.w_stride, nbb, a.k, p0, pn,
            pack);
  const bool accumulate = p0 > 0;
  const int64_t pstride = pn * kPanel;
  for (int64_t r = 0; r < a.m; r += kMR) {
    const int mr = a.m - r < kMR ? static_cast<int>(a.m - r) : kMR;
    const uint32_t* xr = xb + r * kp + p0;
    float* orow = a.out + r * a.out_stride + j0;
    for (int64_t g = 0; g < nbb; g += kGroupRows) {
      const int64_t cols = nbb - g;
      const uint32_t* wp = pack + (g / kPanel) * pstride;
      const float* bias = a.bias != nullptr ? a.bias + j0 + g : nullptr;
      if (cols > 2 * kPanel) {
        RowTile<3>(mr, xr, kp, wp, pstride, pn, orow + g, a.out_stride, cols, bias, accumulate);
      } else if (cols > kPanel) {
        RowTile<2>(mr, xr, kp, wp, pstride, pn, orow + g, a.out_stride, cols, bias, accumulate);
      } else {
        RowTile<1>(mr, xr, kp, wp, pstride, pn, orow + g, a.out_stride, cols, bias, accumulate);
      }
    }
  }
}

// Few rows of x (batched decode): no packing, the weight rows are read once, as they lie. out[r][c]
// (= sum + bias) for MR rows of x (bf16, xs elements apart) by NR weight rows over all k columns:
// 32 columns per vdpbf16ps, a horizontal sum per output at the end. With kPrefetch the NR rows
// after the tile (the next tile's, same columns) are prefetched a cache line per row as the tile
// reads one, as the f32 GEMM's tiles do (gemm.cc, GemmTile): the hardware prefetchers do not run
// ahead of weight rows read this slowly.
template <int MR, int NR, bool kPrefetch>
DH_BF16_TARGET DH_BF16_INLINE void DotTile(const uint16_t* xb, int64_t xs, const uint16_t* w,
                                           int64_t ws, int64_t k, float* out, int64_t os,
                                           const float* bias) {
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
      for (int c = 0; c < NR; ++c) {
        _mm_prefetch(reinterpret_cast<const char*>(w + (NR + c) * ws + i), _MM_HINT_T0);
      }
    }
    __m512bh wv[NR];
#pragma GCC unroll 3
    for (int c = 0; c < NR; ++c) wv[c] = (__m512bh)_mm512_loadu_si512(w + c * ws + i);
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
    for (int c = 0; c < NR; ++c) wv[c] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + c * ws + i);
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
    if (prefetch && c + 6 <= rows) {
      DotTile<MR, 3, true>(xb, xs, w + c * ws, ws, k, out + c, os, b);
    } else {
      DotTile<MR, 3, false>(xb, xs, w + c * ws, ws, k, out + c, os, b);
    }
  }
  for (; c < rows; ++c) {
    DotTile<MR, 1, false>(xb, xs, w + c * ws, ws, k, out + c, os,
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
