// MatMul over int8 / int4 weights (backend/weight.h layouts) with Highway kernels that
// dequantize in registers: int8/int4 codes are widened to f32 and scaled per group, never
// written back as a dense matrix. Dispatches at run time to the best SIMD target. Each weight
// row's f16 scales (and int4 zero points) are widened to f32 once per row, before its codes.
#pragma once

#include <cstdint>

#include "backend/cpu/activation_args.h"

namespace dh::cpu {

// out[r, j] = dot(x[r, :], dequant(w[j, :])) + bias[j] for r < m and j in [n_begin, n_end).
struct QuantMatMulArgs : ActivationArgs {
  bool int4 = false;        // false: kInt8 (value = q * scale), true: kInt4 ((q - z) * scale)
  const void* q = nullptr;  // codes: i8 [.., k] or u8 [.., ceil(k/2)] (low nibble first)
  int64_t q_stride = 0;     // bytes between weight rows
  const uint16_t* scales = nullptr;  // f16 bits, one per group
  int64_t scale_stride = 0;          // halves between weight rows of scales
  const uint8_t* zeros = nullptr;    // int4 only: 4-bit zero points, two per byte, low first
  int64_t zero_stride = 0;           // bytes between weight rows of zeros
  int zero_offset = 0;               // int4: z = nibble + zero_offset
  int64_t group_size = 0;
  // The same weight as prepacked tiles (quant_vnni.h, PrepackTiles), or null. The integer
  // kernels' tiles read these instead of q / scales / zeros; the other kernels ignore them.
  const uint8_t* tiles = nullptr;
};

// Whether the kernels handle this layout (int4 groups must not split a byte: even group size,
// or one group per row).
inline bool QuantMatMulSupports(bool int4, int64_t k, int64_t group_size) {
  if (k <= 0 || group_size <= 0) return false;
  return !int4 || group_size % 2 == 0 || group_size >= k;
}

// Computes rows [n_begin, n_end) of the output: a fused GEMV in which each weight vector is
// dequantized once, in registers, and used for up to 4 rows of x at a time (x, out: m rows).
void QuantMatMulRange(const QuantMatMulArgs& a, int64_t n_begin, int64_t n_end);

// Dequantizes weight rows [row_begin, row_begin + count) of `a` (q, scales, zeros, k, group_size;
// the x / out fields are unused) into out, count x k f32 row-major — for tiled GEMMs over f32.
// With col_begin / col_count, only those columns (out: count x col_count; col_count < 0: to the
// end of the row), col_begin needing DequantizeSliceAligned.
void DequantizeRows(const QuantMatMulArgs& a, int64_t row_begin, int64_t count, float* out,
                    int64_t col_begin = 0, int64_t col_count = -1);
// Whether column col_begin starts a slice DequantizeRows decodes: 0, or the start of a group
// (int4: an even column).
bool DequantizeSliceAligned(const QuantMatMulArgs& a, int64_t col_begin);

// FP8 e4m3 weights with block scales (WeightFormat::kFp8Block): value = fp8 * scale, one f32
// scale per block_rows x block_cols block. Decoded in registers without a table: the 7 magnitude
// bits of e4m3 are placed under an f16 exponent/mantissa (sign at bit 15, magnitude shifted left
// by 7), the f16 is widened to f32 (vcvtph2ps / Highway PromoteTo), and the 2^8 difference of the
// exponent biases (15 - 7) is folded into the block scale. This is exact for every normal and
// subnormal e4m3 value (e4m3 subnormals land on f16 subnormals, which widen exactly). e4m3 NaN
// (0x7f / 0xff) would decode as 480 * 2^8 instead of NaN: checkpoints hold no NaN.
struct Fp8MatMulArgs : ActivationArgs {
  const uint8_t* q = nullptr;  // e4m3 codes [.., k]
  int64_t q_stride = 0;        // bytes between weight rows
  const float* scales = nullptr;
  int64_t scale_stride = 0;  // floats between rows of blocks
  int64_t block_rows = 0;
  int64_t block_cols = 0;
};

// Rows [n_begin, n_end) of out = x * dequant(w)^T + bias: x times the block scales once per
// block of weight rows, then each decoded weight vector of 4 (512 bits) or 2 weight rows at a
// time used for up to 4 rows of x.
void Fp8MatMulRange(const Fp8MatMulArgs& a, int64_t n_begin, int64_t n_end);
// The most rows of x that CpuBackend::MatMul gives Fp8MatMulRange on this CPU (more go to the
// tiled GEMM over decoded panels): 32 on 512-bit targets, 8 on narrower ones.
int64_t Fp8FusedMaxRows();

// Decodes weight rows [row_begin, row_begin + count) into out (count x k f32, row-major); with
// col_begin / col_count, only those columns (count x col_count), col_begin needing
// Fp8DequantizeSliceAligned.
void Fp8DequantizeRows(const Fp8MatMulArgs& a, int64_t row_begin, int64_t count, float* out,
                       int64_t col_begin = 0, int64_t col_count = -1);
// Whether column col_begin starts a slice Fp8DequantizeRows decodes: the start of a block.
bool Fp8DequantizeSliceAligned(const Fp8MatMulArgs& a, int64_t col_begin);

}  // namespace dh::cpu
