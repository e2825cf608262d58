// Element types: every safetensors dtype plus our quantized weight formats' element types.
// Scalar conversions here are the reference definitions every SIMD kernel is tested against.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace dh {

enum class DType : uint8_t {
  kF64, kF32, kF16, kBF16, kF8E4M3, kF8E5M2, kI64, kI32, kI16, kI8, kU8, kBool,
};

// Bytes per element.
size_t DTypeSize(DType t);
// Our name ("bf16"); ParseDType accepts it and the safetensors spelling ("BF16", "F8_E4M3").
std::string_view DTypeName(DType t);
std::string_view SafetensorsDTypeName(DType t);
std::optional<DType> ParseSafetensorsDType(std::string_view s);
bool IsFloat(DType t);

inline float BF16ToF32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN.
inline uint16_t F32ToBF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// e4m3fn: bias 7, no infinities, NaN = 0x7f/0xff, max 448.
float F8E4M3ToF32(uint8_t v);
// e5m2: IEEE-like, bias 15.
float F8E5M2ToF32(uint8_t v);
// Round to nearest even with saturation to ±448 (as torch's float8_e4m3fn cast of finite values).
uint8_t F32ToF8E4M3(float f);

}  // namespace dh
