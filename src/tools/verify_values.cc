#include "tools/verify_values.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/dtype.h"

namespace dh {

float ElementAt(const uint8_t* data, DType dtype, uint64_t i) {
  switch (dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, data + 4 * i, 4);
      return v;
    }
    case DType::kF16: {
      uint16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      return F16ToF32(v);
    }
    case DType::kBF16: {
      uint16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      return BF16ToF32(v);
    }
    case DType::kF8E4M3: return F8E4M3ToF32(data[i]);
    case DType::kF8E5M2: return F8E5M2ToF32(data[i]);
    default: return 0;
  }
}

namespace {

// Statistics on the raw bits. With the sign bit cleared, the finite values of every float
// format here order like their magnitudes, so max |x| and "|x| > limit" are integer compares, a
// value is zero exactly when its magnitude bits are, and NaN/Inf are the patterns at and above
// the format's first non-finite one. The loop below is branch-free integer code the compiler
// vectorizes, so the check keeps up with the disk instead of decoding every element to float.
struct BitFormat {
  uint64_t magnitude;    // mask clearing the sign bit
  uint64_t nonfinite;    // smallest non-finite magnitude (Inf where the format has one, else NaN)
  bool has_inf;          // nonfinite itself is Inf (e4m3 has no Inf: nonfinite is its NaN)
};

BitFormat FormatOf(DType dtype) {
  switch (dtype) {
    case DType::kF64: return {0x7fffffffffffffffu, 0x7ff0000000000000u, true};
    case DType::kF32: return {0x7fffffffu, 0x7f800000u, true};
    case DType::kF16: return {0x7fffu, 0x7c00u, true};
    case DType::kBF16: return {0x7fffu, 0x7f80u, true};
    case DType::kF8E4M3: return {0x7fu, 0x7fu, false};
    case DType::kF8E5M2: return {0x7fu, 0x7cu, true};
    default: return {0, 0, false};
  }
}

double MagnitudeValue(DType dtype, uint64_t bits) {
  if (dtype == DType::kF64) {
    double v;
    std::memcpy(&v, &bits, 8);
    return std::fabs(v);
  }
  uint8_t raw[8];
  std::memcpy(raw, &bits, 8);  // little-endian: the low bytes are the element
  return std::fabs(static_cast<double>(ElementAt(raw, dtype, 0)));
}

}  // namespace

uint64_t LimitBits(DType dtype, double limit) {
  const BitFormat f = FormatOf(dtype);
  uint64_t lo = 0, hi = f.nonfinite;  // invariant: value(lo) <= limit (0 <= limit), hi is past
  if (limit < 0) return 0;
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (MagnitudeValue(dtype, mid) <= limit) lo = mid; else hi = mid;
  }
  return lo;
}

namespace {

// One run of elements of one row (or of a 1-D tensor): counts and the max finite magnitude bits.
struct BitCounts {
  uint64_t nan = 0, inf = 0, absurd = 0;
  uint64_t max_bits = 0, any_bits = 0;  // any_bits: OR of all magnitudes (0 = an all-zero run)
};

#if defined(__GNUC__)
#define DH_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define DH_ALWAYS_INLINE inline
#endif

// Counters in the element's own width, for a block short enough not to overflow them.
template <typename T>
struct BitTally {
  T nonfinite = 0, inf = 0, absurd = 0, max_bits = 0, any = 0;
};

// n elements into t. Branch-free, the finite test a bit mask: the shape GCC vectorizes, at -O2
// too when n is a constant after inlining (the 64-element groups below).
template <typename T>
DH_ALWAYS_INLINE void Tally(const uint8_t* bytes, uint64_t n, T mask, T nonfinite, T limit,
                            BitTally<T>& t) {
  T nonfin = t.nonfinite, inf = t.inf, absurd = t.absurd, max_bits = t.max_bits, any = t.any;
  for (uint64_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, bytes + i * sizeof(T), sizeof(T));
    const T a = static_cast<T>(x & mask);
    const T finite = static_cast<T>(a & static_cast<T>(-static_cast<T>(a < nonfinite)));
    nonfin += static_cast<T>(a >= nonfinite);
    inf += static_cast<T>(a == nonfinite);
    absurd += static_cast<T>(finite > limit);
    max_bits = std::max(max_bits, finite);
    any |= a;
  }
  t = {nonfin, inf, absurd, max_bits, any};
}

// Inlined into the per-CPU clones below (an out-of-line copy would be the baseline build).
template <typename T>
DH_ALWAYS_INLINE BitCounts CountRun(const uint8_t* bytes, uint64_t n, BitFormat f,
                                    uint64_t limit_bits) {
  constexpr uint64_t kGroup = 64;
  constexpr uint64_t kBlock = sizeof(T) == 1 ? 3 * kGroup : 512 * kGroup;  // < max of T
  const T mask = static_cast<T>(f.magnitude), nonfinite = static_cast<T>(f.nonfinite);
  const T limit = static_cast<T>(limit_bits);
  BitCounts c;
  for (uint64_t start = 0; start < n; start += kBlock) {
    const uint64_t end = std::min(n, start + kBlock);
    BitTally<T> t;
    uint64_t i = start;
    for (; i + kGroup <= end; i += kGroup)
      Tally<T>(bytes + i * sizeof(T), kGroup, mask, nonfinite, limit, t);
    Tally<T>(bytes + i * sizeof(T), end - i, mask, nonfinite, limit, t);
    c.inf += f.has_inf ? t.inf : 0;
    c.nan += f.has_inf ? t.nonfinite - t.inf : t.nonfinite;
    c.absurd += t.absurd;
    c.max_bits = std::max<uint64_t>(c.max_bits, t.max_bits);
    c.any_bits |= t.any;
  }
  return c;
}
#undef DH_ALWAYS_INLINE

// One instantiation per element width, each compiled for AVX-512, AVX2 and baseline x86-64 and
// picked at load time by the CPU (GCC's function multiversioning), so the vectorized loop uses
// the widest registers the machine has. Not under ThreadSanitizer: GCC instruments the ifunc
// resolver, which the dynamic loader runs before the TSan runtime exists (the binary crashes at
// start-up).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DH_VERIFY_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DH_VERIFY_CLONES
#endif
DH_VERIFY_CLONES BitCounts CountRun8(const uint8_t* b, uint64_t n, BitFormat f, uint64_t l) {
  return CountRun<uint8_t>(b, n, f, l);
}
DH_VERIFY_CLONES BitCounts CountRun16(const uint8_t* b, uint64_t n, BitFormat f, uint64_t l) {
  return CountRun<uint16_t>(b, n, f, l);
}
DH_VERIFY_CLONES BitCounts CountRun32(const uint8_t* b, uint64_t n, BitFormat f, uint64_t l) {
  return CountRun<uint32_t>(b, n, f, l);
}
DH_VERIFY_CLONES BitCounts CountRun64(const uint8_t* b, uint64_t n, BitFormat f, uint64_t l) {
  return CountRun<uint64_t>(b, n, f, l);
}
#undef DH_VERIFY_CLONES

template <typename T>
BitCounts CountRunFor(const uint8_t* b, uint64_t n, BitFormat f, uint64_t l) {
  if constexpr (sizeof(T) == 1) return CountRun8(b, n, f, l);
  if constexpr (sizeof(T) == 2) return CountRun16(b, n, f, l);
  if constexpr (sizeof(T) == 4) return CountRun32(b, n, f, l);
  if constexpr (sizeof(T) == 8) return CountRun64(b, n, f, l);
}

// One chunk of a tensor (whole rows of 2-D tensors): NaN, Inf, |x| > max_abs (as limit_bits)
// and, with cols > 0, all-zero rows. Counts add up and max_abs maxes over chunks.
template <typename T>
void AccumulateStatsOf(const uint8_t* data, DType dtype, uint64_t n, uint64_t cols,
                       uint64_t limit_bits, TensorStats* s) {
  const BitFormat f = FormatOf(dtype);
  const uint64_t run = cols > 0 ? cols : n;
  uint64_t max_bits = 0;
  for (uint64_t r = 0; r < n; r += run) {
    const BitCounts c = CountRunFor<T>(data + r * sizeof(T), std::min(run, n - r), f, limit_bits);
    s->nan += c.nan;
    s->inf += c.inf;
    s->absurd += c.absurd;
    max_bits = std::max(max_bits, c.max_bits);
    if (cols > 0 && c.any_bits == 0) ++s->zero_rows;
  }
  s->max_abs = std::max(s->max_abs, MagnitudeValue(dtype, max_bits));
}

}  // namespace

void AccumulateStats(const uint8_t* data, DType dtype, uint64_t n, uint64_t cols,
                     uint64_t limit_bits, TensorStats* s) {
  switch (DTypeSize(dtype)) {
    case 8: return AccumulateStatsOf<uint64_t>(data, dtype, n, cols, limit_bits, s);
    case 4: return AccumulateStatsOf<uint32_t>(data, dtype, n, cols, limit_bits, s);
    case 2: return AccumulateStatsOf<uint16_t>(data, dtype, n, cols, limit_bits, s);
    case 1: return AccumulateStatsOf<uint8_t>(data, dtype, n, cols, limit_bits, s);
    default: return;
  }
}

}  // namespace dh
