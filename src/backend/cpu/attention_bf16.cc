// Attention scores of a bf16 KV cache on AVX512-BF16 (attention.h, AttendBf16Dot), the queries
// rounded to bf16: for the row-vector tiles kept as column pairs, each key's pairs broadcast
// from the cache as they lie, one `vdpbf16ps` per pair of columns for 16 query rows
// (Bf16PairScores); for decode's few rows kept as bf16 rows, dot products along the keys' rows
// 32 columns per `vdpbf16ps` (Bf16RowScores). Intrinsics in functions compiled with a target
// attribute (as gemm_bf16.cc), called only where the CPU has the instruction.
#include <cstdint>
#include <cstring>

#include "backend/cpu/attention.h"
#include "backend/cpu/gemm_bf16.h"
#include "base/check.h"

#if defined(__x86_64__)
#define DH_ATTEND_BF16 1
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#else
#define DH_ATTEND_BF16 0
#endif

namespace dh::cpu {

#if DH_ATTEND_BF16
namespace {

#define DH_AB_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define DH_AB_INLINE inline __attribute__((always_inline))

// s[j * pitch + v * 16 + r] = scale * sum_c qp[c][v * 16 + r] . (k[j][2c], k[j][2c + 1]) for J
// keys and NV vectors of 16 rows; qp: [pairs][NV * 16] u32 bf16 pairs. Prefetches `per` of the
// lines from *next (up to end) per pair of columns.
template <int J, int NV>
DH_AB_TARGET void PairTile(const uint32_t* qp, const uint16_t* const* k, int64_t pairs,
                           float scale, float* s, int64_t pitch, const char* const** next,
                           const char* const* end, int per) {
  const char* const* pn = *next;
  __m512 acc[J][NV];
#pragma GCC unroll 12
  for (int j = 0; j < J; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_setzero_ps();
  }
  const uint32_t* kp[J];
#pragma GCC unroll 12
  for (int j = 0; j < J; ++j) kp[j] = reinterpret_cast<const uint32_t*>(k[j]);
  for (int64_t c = 0; c < pairs; ++c) {
    for (int i = 0; i < per && pn < end; ++i) _mm_prefetch(*pn++, _MM_HINT_T0);
    __m512bh q[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) q[v] = (__m512bh)_mm512_loadu_si512(qp + (c * NV + v) * 16);
#pragma GCC unroll 12
    for (int j = 0; j < J; ++j) {
      uint32_t pair;
      __builtin_memcpy(&pair, kp[j] + c, sizeof(pair));
      const __m512bh kb = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], q[v], kb);
    }
  }
  *next = pn;
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 12
  for (int j = 0; j < J; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      _mm512_storeu_ps(s + j * pitch + v * 16, _mm512_mul_ps(acc[j][v], sc));
    }
  }
}

// The last n < J keys of a block, with a tile of exactly n.
template <int J, int NV>
DH_AB_TARGET DH_AB_INLINE void PairTail(int64_t n, const uint32_t* qp, const uint16_t* const* k,
                                        int64_t pairs, float scale, float* s, int64_t pitch,
                                        const char* const** next, const char* const* end,
                                        int per) {
  if constexpr (J > 1) {
    if (n == J - 1) return PairTile<J - 1, NV>(qp, k, pairs, scale, s, pitch, next, end, per);
    PairTail<J - 1, NV>(n, qp, k, pairs, scale, s, pitch, next, end, per);
  }
}

// 12 accumulators, as the f32 outer tile: enough chains to cover vdpbf16ps's latency on two
// pipes.
template <int NV>
DH_AB_TARGET void PairScoresOf(const uint32_t* qp, const uint16_t* const* k, int64_t nk,
                               int64_t dk, float scale, float* s, int64_t pitch,
                               const char* const** next, const char* const* end, int per) {
  constexpr int kJ = 12 / NV;
  const int64_t pairs = dk / 2;
  int64_t j = 0;
  for (; j + kJ <= nk; j += kJ) {
    PairTile<kJ, NV>(qp, k + j, pairs, scale, s + j * pitch, pitch, next, end, per);
  }
  PairTail<kJ, NV>(nk - j, qp, k + j, pairs, scale, s + j * pitch, pitch, next, end, per);
}

// Lane i of each 128-bit block: the sum of that block's lanes of the i-th of a, b, c, e; then
// the four blocks added: out[i] = the sum of all lanes of the i-th.
DH_AB_TARGET DH_AB_INLINE __m128 SumsOf4(__m512 a, __m512 b, __m512 c, __m512 e) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 ce = _mm512_add_ps(_mm512_unpacklo_ps(c, e), _mm512_unpackhi_ps(c, e));
  const __m512d ab64 = _mm512_castps_pd(ab), ce64 = _mm512_castps_pd(ce);
  const __m512 v = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ab64, ce64)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(ab64, ce64)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// s[r * rp + j] = scale * sum_d qb[r][d] * k[j][d] for R rows of bf16 queries (dk apart) and
// 4 keys: 32 columns per vdpbf16ps, the four keys' sums reduced together.
template <int R>
DH_AB_TARGET void RowTile(const uint16_t* qb, const uint16_t* const* k, int64_t dk, float scale,
                          float* s, int64_t rp, const char* const** next,
                          const char* const* end, int per) {
  const char* const* pn = *next;
  __m512 acc[R][4];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < dk; d += 32) {
    for (int i = 0; i < per && pn < end; ++i) _mm_prefetch(*pn++, _MM_HINT_T0);
    __m512bh q[R];
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) q[r] = (__m512bh)_mm512_loadu_si512(qb + r * dk + d);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(k[j] + d);
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], q[r], kv);
    }
  }
  *next = pn;
  const __m128 sc = _mm_set1_ps(scale);
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) {
    _mm_storeu_ps(s + r * rp, _mm_mul_ps(SumsOf4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), sc));
  }
}

}  // namespace
#endif  // DH_ATTEND_BF16

bool AttendBf16Dot() { return Bf16DotRoundsX(); }

void PackQueryPairs(const float* const* q, int rows, int64_t nv, int64_t dk, uint16_t* stage,
                    uint32_t* qp) {
  DH_CHECK(dk % 2 == 0 && (nv == 1 || nv == 2), "bf16 query pairs: dk odd or too many rows");
  const int64_t pairs = dk / 2;
  for (int r = 0; r < rows; ++r) ConvertRowToBf16(q[r], dk, stage + r * dk);
  for (int64_t row = 0; row < nv * 16; ++row) {  // rows past `rows` copy row 0
    uint32_t pair;
    const uint16_t* src = stage + (row < rows ? row : 0) * dk;
    for (int64_t c = 0; c < pairs; ++c) {
      std::memcpy(&pair, src + 2 * c, sizeof(pair));
      qp[(c * nv + row / 16) * 16 + row % 16] = pair;
    }
  }
}

#if DH_ATTEND_BF16
void Bf16PairScores(const uint32_t* qp, int64_t nv, const uint16_t* const* k, int64_t nk,
                    int64_t dk, float scale, float* s, int64_t pitch, LinePrefetch* pf) {
  LinePrefetch none;
  LinePrefetch& p = pf != nullptr ? *pf : none;
  if (nv == 1) return PairScoresOf<1>(qp, k, nk, dk, scale, s, pitch, &p.next, p.end, p.per);
  DH_CHECK(nv == 2, "bf16 attention scores take one or two vectors of rows");
  PairScoresOf<2>(qp, k, nk, dk, scale, s, pitch, &p.next, p.end, p.per);
}

void Bf16RowScores(const uint16_t* qb, int64_t rows, const uint16_t* const* k, int64_t nk,
                   int64_t dk, float scale, float* s, int64_t rp, LinePrefetch* pf) {
  LinePrefetch none;
  LinePrefetch& p = pf != nullptr ? *pf : none;
  for (int64_t j = 0; j < nk; j += 4) {
    const int64_t n = nk - j < 4 ? nk - j : 4;
    const uint16_t* kp[4];
    for (int i = 0; i < 4; ++i) kp[i] = k[j + (i < n ? i : n - 1)];
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
      RowTile<2>(qb + r * dk, kp, dk, scale, s + r * rp + j, rp, &p.next, p.end, p.per);
    }
    if (r < rows) RowTile<1>(qb + r * dk, kp, dk, scale, s + r * rp + j, rp, &p.next, p.end, p.per);
  }
}
#else  // no x86: AttendBf16Dot() is false and AttendBlock never calls these
void Bf16PairScores(const uint32_t*, int64_t, const uint16_t* const*, int64_t, int64_t, float,
                    float*, int64_t, LinePrefetch*) {
  DH_CHECK(false, "bf16 attention scores are x86 only");
}
void Bf16RowScores(const uint16_t*, int64_t, const uint16_t* const*, int64_t, int64_t, float,
                   float*, int64_t, LinePrefetch*) {
  DH_CHECK(false, "bf16 attention scores are x86 only");
}
#endif  // DH_ATTEND_BF16

}  // namespace dh::cpu

#if DH_ATTEND_BF16
#pragma GCC diagnostic pop
#endif
