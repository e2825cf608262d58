// Weight: a matrix [rows = output features, cols = input features] in one of the formats a
// backend's MatMul understands. The format travels with the tensor so model code never branches
// on it (docs/DESIGN.md "Numbers and formats").
#pragma once

#include <cstdint>
#include <string_view>

#include "tensor/tensor.h"

namespace dh {

enum class WeightFormat : uint8_t {
  kDense,     // data: [rows, cols] f32 | f16 | bf16
  kFp8Block,  // data: [rows, cols] f8e4m3; scales: [ceil(rows/block_rows), ceil(cols/block_cols)]
              // f32; value = fp8 * scale (DeepSeek's weight_scale_inv multiplies)
  kInt8,      // data: [rows, cols] i8; scales: [rows, cols/group_size] f32; value = q * scale
  kInt4,      // data: [rows, cols/2] u8, two values per byte (low nibble first);
              // scales, mins: [rows, cols/group_size] f32; value = q * scale + min (q in 0..15)
};

std::string_view WeightFormatName(WeightFormat f);

struct Weight {
  WeightFormat format = WeightFormat::kDense;
  Tensor data;
  Tensor scales;
  Tensor mins;
  int64_t rows = 0;
  int64_t cols = 0;
  int block_rows = 0;  // kFp8Block
  int block_cols = 0;  // kFp8Block
  int group_size = 0;  // kInt8, kInt4
  // Optional input permutation, i32 [cols] (GPTQ act-order checkpoints): the product is taken
  // with x gathered as x[:, perm], i.e. out[r][j] = sum_c value[j][c] * x[r][perm[c]]. Empty:
  // identity.
  Tensor perm;

  bool empty() const { return data.empty(); }
  // A dense weight over `t` ([rows, cols] or, for vectors, [n]).
  static Weight Dense(const Tensor& t) {
    Weight w;
    w.data = t;
    w.rows = t.ndim >= 1 ? t.shape[0] : 1;
    w.cols = t.ndim >= 2 ? t.shape[1] : 1;
    return w;
  }
  // Bytes a full read of this weight touches (data + scales + mins + perm).
  size_t nbytes() const {
    return data.nbytes() + (scales.empty() ? 0 : scales.nbytes()) +
           (mins.empty() ? 0 : mins.nbytes()) + (perm.empty() ? 0 : perm.nbytes());
  }
};

}  // namespace dh
