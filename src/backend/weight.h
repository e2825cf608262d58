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
  kInt8,      // data: [rows, cols] i8; scales: [rows, groups] f16; value = q * scale
  kInt4,      // data: [rows, ceil(cols/2)] u8, two codes per byte (low nibble first);
              // scales: [rows, groups] f16; zeros: [rows, ceil(groups/2)] u8, one 4-bit zero
              // point per group (low nibble first); value = (q - z) * scale, q in 0..15 and
              // z = zero nibble + zero_offset (AWQ's and GPTQ's own arithmetic)
};
// groups = ceil(cols / group_size). Per 32 weights: int8 34 bytes (1.0625 per weight), int4 18.5
// (0.578). The reference decoder (weight_rows.h) also reads f32 / bf16 scales; the CPU kernels
// take f16 scales.

std::string_view WeightFormatName(WeightFormat f);

// The stored zero nibble of group g in one row of kInt4 zeros (two per byte, low nibble first).
inline int ZeroNibble(const uint8_t* zeros, int64_t g) {
  return (zeros[g / 2] >> ((g & 1) * 4)) & 15;
}

struct Weight {
  WeightFormat format = WeightFormat::kDense;
  Tensor data;
  Tensor scales;
  Tensor zeros;  // kInt4
  int64_t rows = 0;
  int64_t cols = 0;
  int block_rows = 0;  // kFp8Block
  int block_cols = 0;  // kFp8Block
  int group_size = 0;  // kInt8, kInt4
  // kInt4: added to every stored zero nibble. 0 for our own quantizer, AWQ and gptq_v2; 1 for
  // GPTQ v1 checkpoints, which store zero - 1 (so their zero points 1..16 load exactly).
  int zero_offset = 0;
  // Optional input permutation, i32 [cols] (GPTQ act-order checkpoints): the product is taken
  // with x gathered as x[:, perm], i.e. out[r][j] = sum_c value[j][c] * x[r][perm[c]]. Empty:
  // identity.
  Tensor perm;
  // A backend's second copy of the same weight in its own kernels' layout, made by
  // Backend::PrepareWeight and owned by that backend (the CPU backend's prepacked int4 tiles,
  // backend/cpu/quant_vnni.h); the fields above stay valid. Empty: none. Code that changes
  // data or rows must clear it.
  Tensor packed;
  // Set by the loader on a table that is also read a row at a time (an embedding): a backend
  // keeps the fields above readable.
  bool read_by_rows = false;
  // Set by a backend whose `packed` copy serves every product, where it handed the bytes of
  // data / scales / zeros back to the system (the CPU backend's int4 tiles; their shapes and
  // dtypes stay as they were, their bytes must not be read). Code that reads rows must check.
  bool rows_released = false;
  // Multiply by exact x even where bf16 weights round x to bf16 (backend/cpu/gemm_bf16.h): set
  // on dense data standing in for another format (FP8 blocks dequantized into a tensor-parallel
  // slice), so a parallel layout gives the products of one process, and on MLA's kv_b_proj and
  // its absorbed copies, so its two paths agree (model/arch/deepseek.cc).
  bool exact_x = false;

  bool empty() const { return data.empty(); }
  // A dense weight over `t` ([rows, cols] or, for vectors, [n]).
  static Weight Dense(const Tensor& t) {
    Weight w;
    w.data = t;
    w.rows = t.ndim >= 1 ? t.shape[0] : 1;
    w.cols = t.ndim >= 2 ? t.shape[1] : 1;
    return w;
  }
  // Bytes a full read of this weight touches (data + scales + zeros + perm).
  size_t nbytes() const {
    return data.nbytes() + (scales.empty() ? 0 : scales.nbytes()) +
           (zeros.empty() ? 0 : zeros.nbytes()) + (perm.empty() ? 0 : perm.nbytes());
  }
};

}  // namespace dh
