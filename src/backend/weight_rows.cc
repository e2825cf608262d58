// Weight rows to f32 (weight_rows.h).
#include "backend/weight_rows.h"

#include "base/check.h"

namespace dh {
namespace {

float Get(const Tensor& t, int64_t offset) { return LoadElementF32(t.data, t.dtype, offset); }

}  // namespace

void DecodeWeightRow(const Weight& w, int64_t row, float* out) {
  DH_CHECK(row >= 0 && row < w.rows, "weight row {} of {}", row, w.rows);
  const Tensor& d = w.data;
  switch (w.format) {
    case WeightFormat::kDense: {
      const int64_t base = row * d.stride[0];
      const int64_t cs = d.ndim > 1 ? d.stride[1] : 1;
      for (int64_t c = 0; c < w.cols; ++c) out[c] = Get(d, base + c * cs);
      return;
    }
    case WeightFormat::kFp8Block: {
      DH_CHECK(d.dtype == DType::kF8E4M3 && w.block_rows > 0 && w.block_cols > 0,
               "fp8 block weight needs f8e4m3 data and block sizes");
      const uint8_t* q = d.as<const uint8_t>() + row * d.stride[0];
      const int64_t srow = (row / w.block_rows) * w.scales.stride[0];
      for (int64_t c = 0; c < w.cols; ++c) {
        out[c] = F8E4M3ToF32(q[c]) * Get(w.scales, srow + c / w.block_cols);
      }
      return;
    }
    case WeightFormat::kInt8: {
      DH_CHECK(d.dtype == DType::kI8 && w.group_size > 0, "int8 weight needs i8 data and groups");
      const int8_t* q = d.as<const int8_t>() + row * d.stride[0];
      const int64_t srow = row * w.scales.stride[0];
      for (int64_t c = 0; c < w.cols; ++c) {
        out[c] = static_cast<float>(q[c]) * Get(w.scales, srow + c / w.group_size);
      }
      return;
    }
    case WeightFormat::kInt4: {
      DH_CHECK(d.dtype == DType::kU8 && w.group_size > 0, "int4 weight needs u8 data and groups");
      DH_CHECK(w.zeros.dtype == DType::kU8, "int4 weight needs u8 zero points");
      const uint8_t* q = d.as<const uint8_t>() + row * d.stride[0];
      const uint8_t* z = w.zeros.as<const uint8_t>() + row * w.zeros.stride[0];
      const int64_t srow = row * w.scales.stride[0];
      for (int64_t c = 0; c < w.cols; ++c) {
        const int nibble = (c % 2 == 0) ? (q[c / 2] & 0xf) : (q[c / 2] >> 4);
        const int64_t g = c / w.group_size;
        const int zero = ZeroNibble(z, g) + w.zero_offset;
        out[c] = static_cast<float>(nibble - zero) * Get(w.scales, srow + g);
      }
      return;
    }
  }
  DH_CHECK(false, "unknown weight format");
}

}  // namespace dh
