// DType tables and scalar conversions (the reference for every vectorised conversion).
#include "tensor/dtype.h"

#include <array>

namespace dh {
namespace {
struct DTypeInfo {
  DType type;
  size_t size;
  std::string_view name;
  std::string_view st_name;
  bool is_float;
};
constexpr std::array<DTypeInfo, 12> kInfo = {{
    {DType::kF64, 8, "f64", "F64", true},
    {DType::kF32, 4, "f32", "F32", true},
    {DType::kF16, 2, "f16", "F16", true},
    {DType::kBF16, 2, "bf16", "BF16", true},
    {DType::kF8E4M3, 1, "f8e4m3", "F8_E4M3", true},
    {DType::kF8E5M2, 1, "f8e5m2", "F8_E5M2", true},
    {DType::kI64, 8, "i64", "I64", false},
    {DType::kI32, 4, "i32", "I32", false},
    {DType::kI16, 2, "i16", "I16", false},
    {DType::kI8, 1, "i8", "I8", false},
    {DType::kU8, 1, "u8", "U8", false},
    {DType::kBool, 1, "bool", "BOOL", false},
}};
const DTypeInfo& Info(DType t) { return kInfo[static_cast<size_t>(t)]; }
}  // namespace

size_t DTypeSize(DType t) { return Info(t).size; }
std::string_view DTypeName(DType t) { return Info(t).name; }
std::string_view SafetensorsDTypeName(DType t) { return Info(t).st_name; }
bool IsFloat(DType t) { return Info(t).is_float; }

std::optional<DType> ParseSafetensorsDType(std::string_view s) {
  for (const auto& i : kInfo) {
    if (i.st_name == s || i.name == s) return i.type;
  }
  return std::nullopt;
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24.
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t F32ToF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < 6.103515625e-05f) {
    // Subnormal: round a / 2^-24 to nearest even.
    float scaled = a * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t bits = std::bit_cast<uint32_t>(a);
  bits += 0xfffu + ((bits >> 13) & 1u);
  const uint32_t exp = (bits >> 23) - 112;
  return sign | static_cast<uint16_t>((exp << 10) | ((bits >> 13) & 0x3ffu));
}

float F8E4M3ToF32(uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  float r;
  if (exp == 0xf && mant == 0x7) {
    r = std::nanf("");
  } else if (exp == 0) {
    r = std::ldexp(static_cast<float>(mant), -9);  // m/8 * 2^-6
  } else {
    r = std::ldexp(1.0f + mant / 8.0f, exp - 7);
  }
  return neg ? -r : r;
}

float F8E5M2ToF32(uint8_t v) { return F16ToF32(static_cast<uint16_t>(v) << 8); }

uint8_t F32ToF8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  // Find the nearest representable value by rounding the mantissa at the right exponent.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;    // a = 1.x * 2^exp
  if (exp < -6) exp = -6;  // subnormal range shares the 2^-6 scale with 3 mantissa bits
  const float step = std::ldexp(1.0f, exp - 3);
  float q = std::nearbyint(a / step) * step;  // ties to even in the default rounding mode
  if (q >= 448.0f) return sign | 0x7e;
  if (q == 0.0f) return sign;
  int qe;
  std::frexp(q, &qe);
  int qexp = qe - 1;
  if (qexp < -6) {
    return sign | static_cast<uint8_t>(std::lround(q / std::ldexp(1.0f, -9)));
  }
  const int mant = static_cast<int>(std::lround((q / std::ldexp(1.0f, qexp) - 1.0f) * 8.0f));
  return sign | static_cast<uint8_t>(((qexp + 7) << 3) | mant);
}

}  // namespace dh
