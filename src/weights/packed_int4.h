// AWQ (GEMM packing) and GPTQ int4 checkpoint tensors -> our kInt4 layout (backend/weight.h),
// exactly: the 4-bit codes and zero points are copied, the f16 scales kept as stored (bf16
// scales converted to f16, exact unless they lie below f16's normal range), and GPTQ v1's
// "zero - 1" becomes Weight::zero_offset = 1, so (code - zero) * scale is the checkpoint's own
// value (the argument is at ConvertPackedInt4 in packed_int4.cc). GPTQ act-order (a g_idx that is
// not c / group_size) becomes a column permutation: the codes are stored with each group's columns
// contiguous and Weight::perm gathers the input to match. docs/quantized-checkpoints.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "base/status.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace dh {

// The checkpoint tensors of one projection <base>: <base>.qweight, .qzeros, .scales and (GPTQ,
// optional) .g_idx.
struct PackedInt4Tensors {
  const TensorInfo* qweight = nullptr;
  const TensorInfo* qzeros = nullptr;
  const TensorInfo* scales = nullptr;
  const TensorInfo* g_idx = nullptr;
};

// A kInt4 matrix on the host: codes [rows, cols/2] (low nibble first), scales [rows, groups]
// f16, zero nibbles [rows, ceil(groups/2)], value = (code - (zero + zero_offset)) * scale; with a
// permutation, column c of this matrix multiplies input column perm[c].
struct Int4Host {
  int64_t rows = 0;
  int64_t cols = 0;
  int group_size = 0;
  int zero_offset = 0;
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scales;  // f16 bits
  std::vector<uint8_t> zeros;
  std::vector<int32_t> perm;  // [cols]; empty: identity
  int64_t inexact_scales = 0;  // bf16 scales that f16 could only round (below its normal range)

  // A host view (pointers into this object's vectors).
  Weight View();
  // Values [rows, cols] in the checkpoint's input order (the permutation undone).
  std::vector<float> Dequantize() const;
};

// Converts one projection of `rows` outputs and `cols` inputs per `q` (method awq | gptq, bits 4,
// group_size; gptq: checkpoint_format). Errors name the tensor, its file and the offending value.
Result<Int4Host> ConvertPackedInt4(const QuantizationConfig& q, const PackedInt4Tensors& t,
                                   int64_t rows, int64_t cols);

// The act-order permutation for a GPTQ g_idx [cols] over `num_groups` groups of `group_size`:
// columns sorted stably by group. Empty when g_idx is already c / group_size. Error (naming
// `what`) when a value is out of range or a group does not have exactly group_size members
// (except a shorter last one).
Result<std::vector<int32_t>> ActOrderPermutation(std::span<const int32_t> g_idx, int group_size,
                                                 int64_t num_groups, const std::string& what);

}  // namespace dh
