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

// Product of all dims, or nullopt on overflow or a negative dim.
inline std::optional<uint64_t> CheckedProduct(std::span<const int64_t> dims) {
  uint64_t r = 1;
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
    auto next = CheckedMul(r, static_cast<uint64_t>(d));
    if (!next) return std::nullopt;
    r = *next;
  }
  return r;
}

}  // namespace dh
