// Overflow-checked size arithmetic for values that come from files or clients.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace dh {

inline std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Product of all dims, or nullopt on a negative dim or when the product of the non-zero dims
// passes INT64_MAX. The second rule matters for shapes with a zero dim: their element count is
// 0, but a tensor's strides are products of its trailing dims, which must still fit in int64.
inline std::optional<uint64_t> CheckedProduct(std::span<const int64_t> dims) {
  uint64_t nonzero = 1;
  bool any_zero = false;
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      any_zero = true;
      continue;
    }
    auto next = CheckedMul(nonzero, static_cast<uint64_t>(d));
    if (!next || *next > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    nonzero = *next;
  }
  return any_zero ? 0 : nonzero;
}

}  // namespace dh
