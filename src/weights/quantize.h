// Host-side quantizers from f32 rows to the kInt8 / kInt4 / kFp8Block weight formats of
// backend/weight.h, the matching dequantizers (for tests and checks), and parsing of the --quant
// names.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/weight.h"
#include "base/status.h"

namespace dh {

// How a load quantizes projection weights. group_size 0 means one group per row.
struct QuantSpec {
  bool enabled = false;  // false for "none"
  WeightFormat format = WeightFormat::kDense;
  int group_size = 0;
  int block_rows = 0, block_cols = 0;  // kFp8Block (128 x 128)
};

// Parses a --quant value: none | int8 (group 32) | int8-g32 | int8-row | int4 (group 32) |
// int4-g32 | int4-g128 | fp8 (e4m3, 128x128 blocks). Errors list the accepted names.
Result<QuantSpec> ParseQuantSpec(std::string_view name);
// The accepted --quant names, for help texts.
std::string_view QuantSpecNames();

// int8 symmetric: per group of `group` columns (the last one may be shorter),
// scale = f16(max|x| / 127), q = round(x / scale) in [-127, 127]; value = q * scale.
// q: [cols] ; scales: [ceil(cols / group)] f16 bits. Error: scale is a false result when
// max|x| / 127 overflows f16 (the caller reports it).
bool QuantizeInt8Row(const float* x, int64_t cols, int64_t group, int8_t* q, uint16_t* scales);

// int4 asymmetric with a 4-bit zero point (GPTQ's and AWQ's arithmetic): per group, the range
// [lo, hi] = [min(x, 0), max(x, 0)] (it holds 0, so the zero point fits in 0..15); z in 0..15
// and scale = f16(s) with the smallest s whose grid [-z * s, (15 - z) * s] holds [lo, hi]
// (at most ~1.07 x (hi - lo) / 15); q = clamp(round(x / scale) + z, 0, 15); value =
// (q - z) * scale, off by at most scale / 2 (plus f32 rounding), and 0 stays exactly 0. Two codes
// per byte, low nibble first: q: [ceil(cols / 2)] ; scales: [ceil(cols / group)] f16 bits ; zeros:
// [ceil(groups / 2)], two per byte, low nibble first. `group` must be even unless it covers the
// whole row (so that no byte straddles two groups). False when a scale overflows f16.
bool QuantizeInt4Row(const float* x, int64_t cols, int64_t group, uint8_t* q, uint16_t* scales,
                     uint8_t* zeros);

// FP8 e4m3 with block scales: per block of block_rows x block_cols (edge blocks may be smaller),
// scale = max|x| / 448 and code = e4m3(x / scale), rounded to nearest even and saturating at
// +-448; value = fp8 * scale. q: [rows, cols] ; scales: [ceil(rows / br), ceil(cols / bc)].
void QuantizeFp8Block(const float* x, int64_t rows, int64_t cols, int block_rows,
                      int block_cols, uint8_t* q, float* scales);

// A quantized [rows, cols] matrix in host memory, laid out exactly as weight.h describes.
struct QuantizedMatrix {
  WeightFormat format = WeightFormat::kInt8;
  int64_t rows = 0;
  int64_t cols = 0;
  int group_size = 0;          // effective (cols for per-row); 0 for fp8
  int64_t groups_per_row = 0;  // ceil(cols / group_size); fp8: ceil(cols / block_cols)
  int64_t bytes_per_row = 0;   // cols (int8, fp8) or ceil(cols / 2) (int4)
  int64_t zero_bytes_per_row = 0;      // int4: ceil(groups_per_row / 2)
  int block_rows = 0, block_cols = 0;  // fp8 only
  std::vector<uint8_t> data;           // [rows, bytes_per_row]
  std::vector<uint16_t> scales_f16;    // int8, int4: [rows, groups_per_row] f16 bits
  std::vector<uint8_t> zeros;          // int4: [rows, zero_bytes_per_row]
  std::vector<float> scales;           // fp8: [ceil(rows / block_rows), groups_per_row]

  // A host Weight viewing this matrix's storage (valid while *this lives, unmoved).
  Weight View();
};

// Quantizes row-major f32 `values` [rows, cols]. `what` names the tensor in errors (a value that
// is not finite or too large for an f16 scale, a shape or group the format cannot hold).
Result<QuantizedMatrix> QuantizeMatrix(std::span<const float> values, int64_t rows, int64_t cols,
                                       const QuantSpec& spec, const std::string& what);

// Dequantizes row r of a kInt8/kInt4/kFp8Block host Weight into out[cols].
void DequantizeRow(const Weight& w, int64_t r, float* out);

}  // namespace dh
