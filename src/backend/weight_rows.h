// The one decoder from any weight format (backend/weight.h) to f32 rows, on host memory: used by
// the reference backend (the oracle and every backend's fallback), by the quantizers' round-trip
// checks and by the loader when an architecture rearranges a quantized checkpoint tensor.
#pragma once

#include <cstdint>

#include "backend/weight.h"
#include "base/check.h"
#include "tensor/dtype.h"

namespace dh {

// Element i (in elements from base) of a host array of `dtype` as f32: every float type and the
// integer types. Aborts on a dtype that has no float value (bool). Inline: the reference ops call
// it per element.
inline float LoadElementF32(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16: return BF16ToF32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF64: return static_cast<float>(static_cast<const double*>(base)[i]);
    case DType::kF8E4M3: return F8E4M3ToF32(static_cast<const uint8_t*>(base)[i]);
    case DType::kF8E5M2: return F8E5M2ToF32(static_cast<const uint8_t*>(base)[i]);
    case DType::kI32: return static_cast<float>(static_cast<const int32_t*>(base)[i]);
    case DType::kI8: return static_cast<float>(static_cast<const int8_t*>(base)[i]);
    case DType::kU8: return static_cast<float>(static_cast<const uint8_t*>(base)[i]);
    default: break;
  }
  DH_CHECK(false, "no float load for dtype {}", DTypeName(dtype));
  return 0;
}

// Writes row `row` of `w` (w.cols values, dequantized per its format; scales of any float dtype,
// strided rows allowed) to out.
void DecodeWeightRow(const Weight& w, int64_t row, float* out);

}  // namespace dh
