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
// scale = max|x| / 127, q = round(x / scale) in [-127, 127]; value = q * scale.
// q: [cols] ; scales: [ceil(cols / group)].
void QuantizeInt8Row(const float* x, int64_t cols, int64_t group, int8_t* q, float* scales);
void DequantizeInt8Row(const int8_t* q, const float* scales, int64_t cols, int64_t group,
                       float* out);

// int4 asymmetric: per group, min = min(x), scale = (max(x) - min) / 15,
// q = round((x - min) / scale) in [0, 15]; value = q * scale + min. Two values per byte, low
// nibble first: q: [ceil(cols / 2)] ; scales, mins: [ceil(cols / group)]. `group` must be even
// unless it covers the whole row (so that no byte straddles two groups).
void QuantizeInt4Row(const float* x, int64_t cols, int64_t group, uint8_t* q, float* scales,
                     float* mins);
void DequantizeInt4Row(const uint8_t* q, const float* scales, const float* mins, int64_t cols,
                       int64_t group, float* out);

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
  int block_rows = 0, block_cols = 0;  // fp8 only
  std::vector<uint8_t> data;   // [rows, bytes_per_row]
  std::vector<float> scales;   // [rows, groups_per_row]; fp8: [ceil(rows / block_rows), groups_per_row]
  std::vector<float> mins;     // [rows, groups_per_row], int4 only

  // A host Weight viewing this matrix's storage (valid while *this lives, unmoved).
  Weight View();
};

// Quantizes row-major f32 `values` [rows, cols]. `what` names the tensor in errors (a value that
// is not finite, a shape or group the format cannot hold).
Result<QuantizedMatrix> QuantizeMatrix(std::span<const float> values, int64_t rows, int64_t cols,
                                       const QuantSpec& spec, const std::string& what);

// Dequantizes row r of a kInt8/kInt4/kFp8Block host Weight (f32 scales) into out[cols].
void DequantizeRow(const Weight& w, int64_t r, float* out);

}  // namespace dh
