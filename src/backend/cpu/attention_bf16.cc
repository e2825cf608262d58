// Attention scores of a bf16 KV cache on AVX512-BF16 (attention.h, AttendBf16Dot): the queries
// rounded to bf16 and kept as column pairs, each key's pairs broadcast from the cache as they
// lie, one `vdpbf16ps` per pair of columns for 16 query rows. Intrinsics in functions compiled
// with a target attribute (as gemm_bf16.cc), called only where the CPU has the instruction.
#include <cstdint>

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
// keys and NV vectors of 16 rows; qp: [pairs][NV * 16] u32 bf16 pairs. Prefetches the lines
// from *next (up to end) one per pair of columns.
template <int J, int NV>
DH_AB_TARGET void PairTile(const uint32_t* qp, const uint16_t* const* k, int64_t pairs,
                           float scale, float* s, int64_t pitch, const char* const** next,
                           const char* const* end) {
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
    if (pn < end) _mm_prefetch(*pn++, _MM_HINT_T0);
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
                                        const char* const** next, const char* const* end) {
  if constexpr (J > 1) {
    if (n == J - 1) return PairTile<J - 1, NV>(qp, k, pairs, scale, s, pitch, next, end);
    PairTail<J - 1, NV>(n, qp, k, pairs, scale, s, pitch, next, end);
  }
}

// 12 accumulators, as the f32 outer tile: enough chains to cover vdpbf16ps's latency on two
// pipes.
template <int NV>
DH_AB_TARGET void PairScoresOf(const uint32_t* qp, const uint16_t* const* k, int64_t nk,
                               int64_t dk, float scale, float* s, int64_t pitch,
                               const char* const** next, const char* const* end) {
  constexpr int kJ = 12 / NV;
  const int64_t pairs = dk / 2;
  int64_t j = 0;
  for (; j + kJ <= nk; j += kJ) {
    PairTile<kJ, NV>(qp, k + j, pairs, scale, s + j * pitch, pitch, next, end);
  }
  PairTail<kJ, NV>(nk - j, qp, k + j, pairs, scale, s + j * pitch, pitch, next, end);
}

// qp[(c * nv + v) * 16 + r] = (bf16(q[row][2c]), bf16(q[row][2c + 1])), row = v * 16 + r, rows
// past `rows` copying row 0; nearest even (`vcvtne2ps2bf16`), as RoundRowsToBf16.
DH_AB_TARGET void PackPairs(const float* const* q, int rows, int64_t nv, int64_t dk,
                            uint32_t* qp) {
  const int64_t pitch = nv * 16;
  const int64_t pairs = dk / 2;
  for (int64_t row = 0; row < pitch; ++row) {
    const float* src = q[row < rows ? row : 0];
    const int64_t v = row / 16, r = row % 16;
    int64_t c = 0;
    // 16 pairs (32 columns) at a time: the even and odd columns' bf16, interleaved as u32.
    for (; c + 16 <= pairs; c += 16) {
      const __m512 lo = _mm512_loadu_ps(src + 2 * c);
      const __m512 hi = _mm512_loadu_ps(src + 2 * c + 16);
      // cvtne2ps2bf16(b, a): a's 16 values in the low half, b's in the high half, in order:
      // the 32 columns as bf16, column 2i and 2i + 1 adjacent, i.e. pair i as u32 i.
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      alignas(64) uint32_t tmp[16];
      _mm512_store_si512(tmp, both);
      for (int i = 0; i < 16; ++i) qp[((c + i) * nv + v) * 16 + r] = tmp[i];
    }
    for (; c < pairs; ++c) {
      const __m128 two = _mm_setr_ps(src[2 * c], src[2 * c + 1], 0.0f, 0.0f);
      const __m128i b = (__m128i)_mm_cvtneps_pbh(two);
      qp[(c * nv + v) * 16 + r] = static_cast<uint32_t>(_mm_cvtsi128_si32(b));
    }
  }
}

}  // namespace
#endif  // DH_ATTEND_BF16

bool AttendBf16Dot() { return Bf16DotRoundsX(); }

void PackQueryPairs(const float* const* q, int rows, int64_t nv, int64_t dk, uint32_t* qp) {
#if DH_ATTEND_BF16
  DH_CHECK(AttendBf16Dot() && dk % 2 == 0 && (nv == 1 || nv == 2),
           "bf16 query pairs where the bf16 scores do not run");
  PackPairs(q, rows, nv, dk, qp);
#else
  (void)q;
  (void)rows;
  (void)nv;
  (void)dk;
  (void)qp;
  DH_CHECK(false, "bf16 attention scores are x86 only");
#endif
}

void Bf16PairScores(const uint32_t* qp, int64_t nv, const uint16_t* const* k, int64_t nk,
                    int64_t dk, float scale, float* s, int64_t pitch, LinePrefetch* pf) {
#if DH_ATTEND_BF16
  LinePrefetch none;
  LinePrefetch& p = pf != nullptr ? *pf : none;
  if (nv == 1) return PairScoresOf<1>(qp, k, nk, dk, scale, s, pitch, &p.next, p.end);
  DH_CHECK(nv == 2, "bf16 attention scores take one or two vectors of rows");
  PairScoresOf<2>(qp, k, nk, dk, scale, s, pitch, &p.next, p.end);
#else
  (void)pf;
  (void)qp;
  (void)nv;
  (void)k;
  (void)nk;
  (void)dk;
  (void)scale;
  (void)s;
  (void)pitch;
  DH_CHECK(false, "bf16 attention scores are x86 only");
#endif
}

}  // namespace dh::cpu

#if DH_ATTEND_BF16
#pragma GCC diagnostic pop
#endif
