// Helpers the CpuBackend ops share (cpu_backend.cc, cpu_matmul.cc): a tensor seen as rows of
// contiguous f32 (or weight-typed) elements, the weight element types the kernels take, and the
// thread pool's chunk size.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "backend/cpu/cpu_kernels.h"
#include "tensor/tensor.h"

namespace dh::cpu {

// A tensor seen as `rows` rows of `cols` contiguous elements, `stride` elements apart.
struct RowView {
  char* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
  bool contiguous = false;  // rows are back to back
  float* row(int64_t r) const { return reinterpret_cast<float*>(data) + r * stride; }
};

// Nullopt when the last dim is strided or the leading dims do not collapse into one stride.
inline std::optional<RowView> AsRows(const Tensor& t, DType dtype = DType::kF32) {
  if (t.dtype != dtype || t.ndim < 1 || t.empty()) return std::nullopt;
  const int last = t.ndim - 1;
  if (t.shape[last] != 1 && t.stride[last] != 1) return std::nullopt;
  RowView v;
  v.data = static_cast<char*>(t.data);
  v.cols = t.shape[last];
  v.rows = 1;
  for (int i = 0; i < last; ++i) v.rows *= t.shape[i];
  v.stride = t.ndim >= 2 ? t.stride[last - 1] : v.cols;
  // Leading dims must collapse into one stride.
  for (int i = 0; i + 1 < last; ++i) {
    if (t.shape[i] != 1 && t.stride[i] != t.stride[i + 1] * t.shape[i + 1]) return std::nullopt;
  }
  if (v.rows == 1) v.stride = v.cols;
  v.contiguous = v.stride == v.cols;
  return v;
}

inline std::optional<WType> WTypeOf(DType t) {
  switch (t) {
    case DType::kF32: return WType::kF32;
    case DType::kBF16: return WType::kBF16;
    case DType::kF16: return WType::kF16;
    default: return std::nullopt;
  }
}

// A vector of n weights (norm weight) usable by the kernels.
inline bool IsPlainVector(const Tensor& t, int64_t n) {
  return !t.empty() && WTypeOf(t.dtype) && t.numel() == n && (t.ndim <= 1 || t.contiguous()) &&
         (t.ndim != 1 || t.stride[0] == 1 || n == 1);
}

inline bool SameRows(const RowView& a, const RowView& b) {
  return a.rows == b.rows && a.cols == b.cols;
}

// Chunk size (in units of `work_per_item`) that gives each thread at least ~32K operations.
inline size_t GrainFor(int64_t work_per_item) {
  return static_cast<size_t>(std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_item)));
}

}  // namespace dh::cpu
