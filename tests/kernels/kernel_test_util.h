// Helpers for the kernel tests: seeded random tensors that own their memory, conversions of
// random f32 data to the weight dtypes, and a closeness check with a stated tolerance.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "hwy/targets.h"

#include "backend/backend.h"
#include "tensor/tensor.h"

namespace dh::test {

// A host tensor with its own storage (bytes), contiguous unless a test restrides it.
struct Owned {
  std::vector<uint8_t> bytes;
  Tensor t;
  Owned() = default;
  Owned(DType dtype, std::initializer_list<int64_t> dims) {
    t = Tensor(nullptr, dtype, dims);
    bytes.resize(std::max<size_t>(t.nbytes(), 1));
    t.data = bytes.data();
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  float* f32() { return reinterpret_cast<float*>(bytes.data()); }
  int32_t* i32() { return reinterpret_cast<int32_t*>(bytes.data()); }
  std::vector<float> ToVector() const {
    const float* p = reinterpret_cast<const float*>(bytes.data());
    return std::vector<float>(p, p + t.numel());
  }
};

// Every value of an f32 tensor rounded to bf16 (nearest even) in place: queries against a bf16
// KV cache, which a backend may score on bf16 queries (backend/cpu/attention.h, AttendBf16Dot).
inline void RoundToBf16(Owned& o) {
  for (int64_t i = 0; i < o.t.numel(); ++i) o.f32()[i] = BF16ToF32(F32ToBF16(o.f32()[i]));
}

class Rng {
 public:
  explicit Rng(uint32_t seed) : gen_(seed) {}
  float Uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen_); }
  // Fills a f32, bf16 or f16 tensor (contiguous storage) with uniform values in [lo, hi).
  void Fill(Owned& o, float lo = -1.0f, float hi = 1.0f) {
    const int64_t n = static_cast<int64_t>(o.bytes.size() / DTypeSize(o.t.dtype));
    for (int64_t i = 0; i < n; ++i) {
      const float v = Uniform(lo, hi);
      switch (o.t.dtype) {
        case DType::kF32: reinterpret_cast<float*>(o.bytes.data())[i] = v; break;
        case DType::kBF16: reinterpret_cast<uint16_t*>(o.bytes.data())[i] = F32ToBF16(v); break;
        case DType::kF16: reinterpret_cast<uint16_t*>(o.bytes.data())[i] = F32ToF16(v); break;
        case DType::kI8:
          reinterpret_cast<int8_t*>(o.bytes.data())[i] = static_cast<int8_t>(Int(-127, 127));
          break;
        case DType::kU8:
        case DType::kF8E4M3: {
          uint8_t b = static_cast<uint8_t>(Int(0, 255));
          if (o.t.dtype == DType::kF8E4M3 && (b & 0x7f) == 0x7f) b ^= 1;  // avoid NaN
          o.bytes[i] = b;
          break;
        }
        default: FAIL() << "no random fill for " << DTypeName(o.t.dtype);
      }
    }
  }

 private:
  std::mt19937 gen_;
};

// Every element satisfies |got - want| <= tol * max(1, max|want|): the error is measured against
// the output's own scale, because f32 sums of many terms lose absolute (not relative) precision
// when they cancel.
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float tol,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float scale = 1.0f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::fabs(got[i] - want[i]) <= tol * scale ||
                    (std::isnan(got[i]) && std::isnan(want[i]));
    if (!ok && ++bad <= 5) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i]
                    << " (tolerance " << tol * scale << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// Runs body once per SIMD target compiled in that the CPU supports, with Highway's dispatch
// forced onto it (a SCOPED_TRACE names it; body gets its id); stops after a fatal failure;
// restores dispatch.
template <typename Body>
void ForEachTarget(Body body) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    body(target);
    if (::testing::Test::HasFatalFailure()) break;
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The KV cache element types the attention tests cover, and which of them carry scales.
inline constexpr DType kKvCacheTypes[] = {DType::kF32, DType::kBF16, DType::kF8E4M3, DType::kI8};
inline bool QuantizedCache(DType t) { return t == DType::kF8E4M3 || t == DType::kI8; }

}  // namespace dh::test
