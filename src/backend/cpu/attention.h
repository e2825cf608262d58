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
// [kAttendKeyBlock][dv], three per-row arrays [pitch], and the scaled query rows
// [kAttendMaxRows][dk] (decode's dot-product scores). The pitch is the rows rounded up to
// whole vectors: at most kAttendMaxRows, or one vector where a vector holds more (SVE at 2048
// bits: 64 floats).
struct AttendScratchLayout {
  static constexpr int64_t kPitchMax = 64;
  static constexpr int64_t Round(int64_t n) { return (n + 15) / 16 * 16; }
  int64_t qt = 0, o, s, kf, vf, rows, qr, total;
  constexpr AttendScratchLayout(int64_t dk, int64_t dv)
      : o(Round(dk * kPitchMax)),
        s(o + Round(dv * kPitchMax)),
        kf(s + Round(kAttendKeyBlock * kPitchMax)),
        vf(kf + Round(kAttendKeyBlock * dk)),
        rows(vf + Round(kAttendKeyBlock * dv)),
        qr(rows + Round(3 * kPitchMax)),
        total(qr + Round(kAttendMaxRows * dk)) {}
};

void AttendBlock(const AttendBlockArgs& a);

}  // namespace dh::cpu
