// 256-bit integer-dot-product kernels for int8 / int4 weights, beside the AVX512-VNNI ones of
// quant_vnni.cc and over the same quantized activations (QuantizedActs: x quantized to int8 once
// per call, one scale per 32 columns). Two x86 tiers:
//   - AVX-VNNI (vpdpbusd on ymm, VEX encoded: Alder Lake and later, Zen 5): the 512-bit kernel's
//     arithmetic on half the width;
//   - AVX2 (every x86-64 CPU since Haswell / Zen 1): vpmaddubsw (u8 x s8 -> pairs summed in i16)
//     then vpmaddwd against ones (i16 pairs -> i32).
// Exactness of the AVX2 products (vpmaddubsw saturates its i16 pair sums):
//   int8: the unsigned operand is |w| (0..128) and the signed one is x with w's sign applied
//         (vpsignb; x codes lie in -127..127 and are stored as they are for this kernel,
//         QuantizedActs::int8_signed), so a pair sum is at most 2 * 128 * 127 = 32512 <
//         32767: never saturates, the i32 lane is the exact dot product.
//   int4: codes 0..15 against x in -127..127: a pair is at most 2 * 15 * 127 = 3810, and the even
//         and odd nibble pairs added in i16 at most 7620: exact. The kernels that add several
//         pairs in i16 before widening (a run's folds, a prepacked tile's block) add at most 16
//         products per lane: 16 * 15 * 127 = 30480, exact.
// So every path computes the same i32 lane dots; the outputs differ from the 512-bit kernel's
// only by f32 summation order (quant_vnni.h has the error bound, which covers all paths).
#pragma once

#include <cstdint>

#include "backend/cpu/quant_vnni.h"

namespace dh::cpu {

// Whether the CPU has AVX2 + FMA (+ F16C), and AVX-VNNI on top (checked with cpuid; GCC 12's
// __builtin_cpu_supports("avxvnni") misses it on Zen 5).
bool CpuHasAvx2();
bool CpuHasAvxVnni();
// Whether the CPU runs each 256-bit vector operation as two 128-bit halves (AMD families 15h-16h
// and Zen / Zen+, family 17h models 00h-2Fh): there the AVX2 integer multiplies have half the
// width of the f32 FMAs' two pipes, which changes which int8 path is faster (quant_vnni.cc).
bool CpuHalfWidthVectorUnits();

// Rows [n_begin, n_end) of `a` on the 256-bit kernel: vnni = true for AVX-VNNI, false for AVX2.
// The caller checks the CPU (CpuHasAvxVnni / CpuHasAvx2) and the layout (IntegerDotSupports).
void IntegerDot256Range(bool vnni, const QuantMatMulArgs& a, const QuantizedActs& acts,
                        int64_t n_begin, int64_t n_end);
// PrepackTiles' codes of one whole tile by 8 x 8 dword transposes (0 steps without AVX2); as
// quant_vnni.cc's 512-bit form, for CPUs without AVX-512.
int64_t PrepackTileCodes256(const uint8_t* q0, int64_t q_stride, int64_t row_bytes,
                            int32_t* codes);

}  // namespace dh::cpu
