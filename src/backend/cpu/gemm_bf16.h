// bf16 x bf16 -> f32 GEMM on AVX512-BF16 (`vdpbf16ps`), for dense bf16 weights with 4+ rows of x
// (prefill, batched decode, MoE expert groups): the GEMM of gemm.h at twice the multiply rate of
// f32 FMAs (FP8 block-scaled weights run on the same instruction at every row count,
// Fp8Bf16DotMatMul below). x is rounded to bf16 (nearest even) once per call; each product of two
// bf16 values is exact in f32 and sums stay f32, so an output differs from the exact f32 product
// by at most sum_i |x_i - bf16(x_i)| * |w_i| <= 2^-8 * sum_i |x_i * w_i| (plus f32 rounding of
// the sums; bf16 keeps 8 significant bits, so rounding to nearest moves a value by at most 2^-8
// of it).
// Calls of 1-3 rows (decode, on the f32 GEMV) round x the same way under the same condition
// (Bf16DotRoundsX), so a row's products do not depend on the rows beside it.
//
// Layout: per K block (at most kBf16KcPairs column pairs), each thread packs its block of weight
// rows into panels of 16 rows, [panel][pair][16 rows] of u32 column pairs, so one 64-byte load
// holds one column pair of 16 output features. The micro-kernel multiplies 8 rows of x
// (broadcast column pairs) by 3 panels: 24 zmm accumulators of 16 outputs each, no horizontal
// sums. Up to 16 rows of x skip the packing: 8 x 3 tiles of dot products over whole weight rows
// as they lie (32 columns per instruction, one horizontal sum per output; a second pass over the
// block, from L2, for rows 9-16), each tile prefetching the next tile's rows, so the weight
// streams from memory once for the batch, and each output sums its own row of x in one order
// whatever the rows beside it. CpuBackend::MatMul sends 4+ rows (its GEMM path); 1-3 rows take
// the f32 GEMV on x rounded the same way (cpu_matmul.cc). x86 intrinsics in functions compiled
// with a target attribute; chosen at run time.
#pragma once

#include <cstdint>

#include "backend/cpu/gemm.h"

namespace dh::cpu {

enum class Bf16Dot : uint8_t {
  kAuto,  // vdpbf16ps where the CPU has it and the Highway AVX-512 target is active (default)
  kOff,   // always the f32 FMA kernels (bf16 weights widened, x exact)
  kOn,    // as kAuto (the CPU must still have the instruction)
};

// Overrides the mode (tests, microbenchmarks). The starting mode comes from
// DH_BF16_DOT=on|off|auto (unset: auto, see gemm_bf16.cc).
void SetBf16DotForTest(Bf16Dot mode);
// The mode in effect.
Bf16Dot Bf16DotMode();
// Sets the mode for one scope and puts back the one it found (tests).
class ScopedBf16DotForTest {
 public:
  explicit ScopedBf16DotForTest(Bf16Dot mode) : before_(Bf16DotMode()) { SetBf16DotForTest(mode); }
  ~ScopedBf16DotForTest() { SetBf16DotForTest(before_); }
  ScopedBf16DotForTest(const ScopedBf16DotForTest&) = delete;
  ScopedBf16DotForTest& operator=(const ScopedBf16DotForTest&) = delete;

 private:
  Bf16Dot before_;
};

// Whether this CPU has AVX512-BF16 (with AVX-512 F/BW/VL) and this build its kernel.
bool Bf16DotAvailable();

// Whether matmuls of bf16 weights round x to bf16 now: the mode is not off, the CPU has the
// instruction, and Highway dispatches to an AVX-512 target (DH_CPU_TIER=avx2 and the per-target
// tests turn it off with the other AVX-512 kernels). The GEMM below rounds x under it, and calls
// of 1-3 rows round it before the f32 GEMV (cpu_matmul.cc, RoundRowsToBf16): a row's result
// does not depend on how many rows share the call (batch size, tensor parallelism), only on the
// order of f32 sums.
bool Bf16DotRoundsX();

// The per-call choice: Bf16DotRoundsX() and bf16 weight rows in memory (no rows_fn, not
// exact_x).
bool UseBf16Dot(const GemmArgs& a);

// Rows [0, m) of x (k floats each, x_stride apart) rounded to bf16 exactly as the GEMM rounds
// them (`vcvtneps2bf16`: nearest even, subnormals to zero) and widened back to f32 into out
// (k floats per row, contiguous). Call only when Bf16DotRoundsX().
void RoundRowsToBf16(const float* x, int64_t x_stride, int64_t m, int64_t k, float* out);
// One row of x (k floats) as the GEMM packs it: bf16, nearest even, into out (k values; with k
// odd a zero after them, so out holds whole column pairs). Call only when Bf16DotAvailable().
void ConvertRowToBf16(const float* x, int64_t k, uint16_t* out);

// The GEMM of gemm.h for a with UseBf16Dot(a); runs on all threads of pool.
void Bf16DotGemm(const GemmArgs& a, ThreadPool& pool);

struct Fp8MatMulArgs;  // quant_matmul.h

// FP8 weights on vdpbf16ps, under the same mode as bf16 weights: where Bf16DotRoundsX() and the
// weight is not exact_x, every FP8 matmul takes this kernel at every row count. x is multiplied
// by each block's scale and rounded to bf16 (nearest even, `vcvtneps2bf16`) once per block of
// weight rows; the e4m3 codes are decoded to bf16 exactly (every e4m3 value is a bf16 value), so
// each product bf16(x * scale) * value is exact in f32 and an output differs from the exact
// product by at most 2^-8 * sum_i |x_i * scale_i * value_i| plus f32 rounding of the sums.
// Up to kFp8DotTileMaxRows rows of x: tiles of 3 weight rows by 8 rows of x (4 by 4 for calls of
// up to 4 rows) over whole rows, the codes decoded in registers, each output one chain (a row
// gives the same bits alone or in a batch of up to that many); more rows (prefill): the packed
// panels and micro-kernel of the bf16 GEMM, the codes decoded into the panels, x scaled per 8-row
// tile and K block.
bool UseFp8Bf16Dot(bool exact_x);
inline constexpr int64_t kFp8DotTileMaxRows = 48;
// out = x * dequant(w)^T + bias for n output features; runs on all threads of pool. Call only
// when UseFp8Bf16Dot holds for the weight.
void Fp8Bf16DotMatMul(const Fp8MatMulArgs& a, int64_t n, ThreadPool& pool);

// Floating-point operations (2 per multiply-add) per call of Bf16DotProbe; 0 without the kernel.
int64_t Bf16DotProbeFlops(int64_t iters);
// iters steps of independent register-resident vdpbf16ps chains (the bf16 peak yardstick);
// returns a value derived from them. Call only when Bf16DotAvailable().
float Bf16DotProbe(int64_t iters);

}  // namespace dh::cpu
