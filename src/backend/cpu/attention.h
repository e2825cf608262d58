// The blocked attention kernel of CpuBackend::Attention (per SIMD target in attention.cc, chosen
// at run time like cpu_kernels.h): a block of query rows that share one sequence and one kv head
// (GQA's query heads of that kv head, at one or more positions) passes once over the sequence's
// keys, so each key and value row is read and widened to f32 once per block rather than once
// per query row. Scores and the output accumulate in f32 with an online softmax per row
// (docs/kernels.md "Attention").
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_kernels.h"

namespace dh::cpu {

// Query rows per block: two AVX-512 vectors of rows.
inline constexpr int kAttendMaxRows = 32;
// Keys per block of the online softmax (their f32 rows, scores and weights stay in L1/L2). The
// widened keys' space [kAttendKeyBlock][dk] also stages the block's query rows.
inline constexpr int64_t kAttendKeyBlock = 32;
static_assert(kAttendMaxRows <= kAttendKeyBlock);
// Decode with several kv heads (at most kAttendChunkMaxRows query rows per head and sequence):
// keys in chunks of kAttendHeadChunk, every head of a chunk run by one thread in turn
// (CpuBackend::Attention).
inline constexpr int64_t kAttendHeadChunk = 256;
inline constexpr int64_t kAttendChunkMaxRows = 16;
static_assert(kAttendHeadChunk % kAttendKeyBlock == 0);
// Decode (one vector of query rows): a key block's rows of up to this many bytes are prefetched
// over the score columns of the block before (attention.cc RowPrefetcher), f32 rows read in
// place; longer ones as that block starts, every row copied.
inline constexpr int64_t kAttendSpreadMaxBytes = 32 * 1024;
// Decode on the bf16 scores (AttendBf16Dot: pair or row scores): a key block's rows of up to
// this many bytes (MLA's 576-wide bf16 latent: 36 KiB) are prefetched over the score steps of
// the block before.
inline constexpr int64_t kAttendPairSpreadMaxBytes = 64 * 1024;

struct AttendBlockArgs {
  KvType kv_type = KvType::kF32;
  const void* k_base = nullptr;  // k_cache data, offset to this kv head
  int64_t k_slot_stride = 0;     // elements between cache slots
  const void* v_base = nullptr;  // v_cache data, offset to this kv head
  int64_t v_slot_stride = 0;
  // Quantized types: scales of this kv head, scales between slots, elements per scale. K and V
  // share the element type and group size (they are one cache dtype).
  const float* k_scales = nullptr;
  int64_t k_scale_stride = 0;
  const float* v_scales = nullptr;
  int64_t v_scale_stride = 0;
  int64_t group = 0;
  int64_t dk = 0;
  int64_t dv = 0;
  const int64_t* slots = nullptr;  // cache slot of each position of the sequence
  float scale = 1.0f;
  // Row r (r < rows <= kAttendMaxRows) attends to positions [0, num_positions[r]), >= 1, of
  // which this call sees those in [key_begin, key_end) (key_begin a multiple of
  // kAttendKeyBlock).
  int rows = 0;
  const float* q[kAttendMaxRows] = {};  // [dk] each
  float* out[kAttendMaxRows] = {};      // [dv] each
  int64_t num_positions[kAttendMaxRows] = {};
  int64_t key_begin = 0;
  int64_t key_end = INT64_MAX;
  // With row_max and row_sum ([rows] each), out gets the weighted sum of the values before the
  // division by the weights' sum, with each row's max score and weights' sum, so that parts of
  // a key range can be merged: out = sum_i e^(max_i - M) out_i / sum_i e^(max_i - M) sum_i.
  // A row that saw no key of the range has a max below every real score (weight 0).
  float* row_max = nullptr;
  float* row_sum = nullptr;
  float* scratch = nullptr;  // AttendScratchLayout(dk, dv).total floats, 64-byte aligned
};

// AttendBlock's scratch, in floats from its start, each part a multiple of 16 floats: the
// queries transposed [dk][pitch], the output transposed [dv][pitch], the scores of a key block
// [kAttendKeyBlock][pitch], its widened keys [kAttendKeyBlock][dk] and values
// [kAttendKeyBlock][ValuePitch(dv)], three per-row arrays [pitch], and the scaled query rows
// [kAttendMaxRows][dk] (decode's dot-product scores). The pitch is the rows rounded up to
// whole vectors: at most kAttendMaxRows, or one vector where a vector holds more (SVE at 2048
// bits: 64 floats).
struct AttendScratchLayout {
  static constexpr int64_t kPitchMax = 64;
  static constexpr int64_t Round(int64_t n) { return (n + 15) / 16 * 16; }
  // Floats between the widened value rows: dv, one line more where dv is a multiple of 256
  // (1 KiB), so that a column tile's lines over a block's rows do not all fall in the few L1
  // sets that rows a multiple of 1 KiB apart share (MLA's 512 values: 2 KiB apart, a tile's 32
  // x 4 lines in 8 sets of 12 ways).
  static constexpr int64_t ValuePitch(int64_t dv) { return dv % 256 == 0 ? dv + 16 : dv; }
  int64_t qt = 0, o, s, kf, vf, rows, qr, total;
  constexpr AttendScratchLayout(int64_t dk, int64_t dv)
      : o(Round(dk * kPitchMax)),
        s(o + Round(dv * kPitchMax)),
        kf(s + Round(kAttendKeyBlock * kPitchMax)),
        vf(kf + Round(kAttendKeyBlock * dk)),
        rows(vf + Round(kAttendKeyBlock * ValuePitch(dv))),
        qr(rows + Round(3 * kPitchMax)),
        total(qr + Round(kAttendMaxRows * dk)) {}
};

void AttendBlock(const AttendBlockArgs& a);

// Scores of a plain bf16 cache on AVX512-BF16 (attention_bf16.cc). Where AttendBf16Dot() holds
// (Bf16DotRoundsX: DH_BF16_DOT not off, the CPU has `vdpbf16ps`, Highway dispatches to
// AVX-512), AttendBlock takes every query row of a plain bf16 cache rounded to bf16 (nearest
// even, as bf16 weights round x) before the softmax scale, on every path, so a row's scores do
// not depend on the rows beside it: the row-vector tiles (prefill; decode's 9-32 rows of a kv
// head, MLA's 16 heads) score on vdpbf16ps from the keys as they lie (Bf16PairScores), and so
// do decode's few rows (DotScoresFit) where dk is a multiple of 32 (Bf16RowScores; other dk:
// the rounded rows times the widened keys in f32). Each product of two bf16 values is exact in
// f32, the sums are f32, the scale is applied to the sums: a score differs from the exact f32
// one by at most 2^-8 * scale * sum_d |q_d * k_d| plus the f32 rounding of the sums. Other
// cache types keep f32 queries.
bool AttendBf16Dot();
// qp[(c * nv + v) * 16 + r] = query row v * 16 + r's columns 2c and 2c + 1 as a pair of bf16
// (u32; ConvertRowToBf16 into stage, rows x dk values, first), rows from `rows` on copying row
// 0; dk even, nv 1 or 2 (16 or 32 rows).
void PackQueryPairs(const float* const* q, int rows, int64_t nv, int64_t dk, uint16_t* stage,
                    uint32_t* qp);
// Cache lines to prefetch, `per` at a time from next (advanced) up to end (attention.cc's
// PrefetchStep is one).
struct LinePrefetch {
  const char* const* next = nullptr;
  const char* const* end = nullptr;
  int per = 1;
};
// s[j * pitch + v * 16 + r] = scale * the dot product of those rows' pairs with key j's bf16
// row (k[j], dk elements as they lie in the cache) for nk keys; pf->per lines of pf (if any)
// are prefetched per pair of columns of each tile of keys.
void Bf16PairScores(const uint32_t* qp, int64_t nv, const uint16_t* const* k, int64_t nk,
                    int64_t dk, float scale, float* s, int64_t pitch, LinePrefetch* pf);
// Decode's few rows (DotScoresFit) with dk a multiple of 32, qb[r * dk + d] = bf16(q[r][d])
// (ConvertRowToBf16): s[r * rp + j] = scale * sum_d qb[r][d] * k[j][d] for nk keys (bf16 rows as
// they lie), 2 rows x 4 keys per tile on vdpbf16ps (32 columns each); the scores past nk (to
// the next multiple of 4) are not meaningful. pf->per lines of pf (if any) are prefetched per
// 32 columns of each tile.
void Bf16RowScores(const uint16_t* qb, int64_t rows, const uint16_t* const* k, int64_t nk,
                   int64_t dk, float scale, float* s, int64_t rp, LinePrefetch* pf);

}  // namespace dh::cpu
