// NumPy .npy (format version 1.0) for logits dumps and test fixtures: little-endian f32 / i32 /
// i64, C order.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"

namespace dh {

Status WriteNpy(const std::string& path, DType dtype, const void* data,
                std::span<const int64_t> shape);

struct NpyArray {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};

Result<NpyArray> ReadNpy(const std::string& path);

}  // namespace dh
