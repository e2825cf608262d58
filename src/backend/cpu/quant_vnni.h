// Integer-dot-product kernels for int8 / int4 weights (backend/weight.h layouts): each row of x
// is quantized on the fly to int8 per block of 32 columns (scale = max|x| / 127, round to
// nearest), and the products run in vpdpbusd (u8 x s8 -> i32, AVX512-VNNI). The Highway kernels
// of quant_matmul.h (f32 products) stay the portable path; x86 only, chosen at run time.
//
// Numerics: the weight codes are used exactly; each x element is off by at most half its block's
// scale (max|x| / 254), so an output is off by at most sum over blocks of
// (max|x_block| / 254) * sum |q * scale| (the int4 min term uses exact f32 sums of x), plus f32
// rounding of the per-lane partial sums. Per lane of 4 (int8) or 8 (int4) columns the i32 dot is
// exact and is scaled by x_scale * w_scale in f32.
//
// int8 weights are signed, so x is offset by 128 to fit the unsigned operand:
// dot(x + 128, w) - 128 * sum(w), with sum(w) taken by a second vpdpbusd against ones (exact).
// int4 codes (0..15) are the unsigned operand against signed x directly.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/quant_matmul.h"

namespace dh::cpu {

enum class IntegerDot : uint8_t {
  kAuto,  // integer kernels where the CPU has them and they were measured faster
  kOff,   // always the f32 (Highway) kernels
  kOn,    // integer kernels whenever the CPU and layout allow
};

// Overrides the per-call choice (tests and microbenchmarks); kAuto restores it. The starting
// mode comes from the environment variable DH_INTEGER_DOT=on|off|auto (default auto).
void SetIntegerDotForTest(IntegerDot mode);

// Whether this CPU and build have the AVX512-VNNI kernels.
bool IntegerDotAvailable();

// Whether the layout suits the integer kernels: each lane of 4 (int8) / 8 (int4) columns lies in
// one weight group, and a 64-byte vector of codes spans whole groups or part of one group.
bool IntegerDotSupports(bool int4, int64_t k, int64_t group_size);

// The per-call choice (CPU, layout, m, override): true when the integer kernel serves `a`.
bool UseIntegerDot(const QuantMatMulArgs& a);

// x of one MatMul call, quantized once and shared by all threads.
struct QuantizedActs {
  int64_t m = 0;
  int64_t row_bytes = 0;  // bytes per x row in `codes` (int4: even half then odd half)
  int64_t lanes = 0;      // i32 lanes per x row (one scale each)
  int64_t groups = 0;     // int4: weight groups per row
  std::vector<uint8_t> codes;        // int8 weights: u8 (q + 128); int4 weights: s8 even | odd
  std::vector<float> lane_scales;    // [m][lanes]: the x block scale of each lane
  std::vector<float> group_sums;     // int4: [m][groups] exact f32 sum of x over each group
};

// Quantizes a.x (m rows of k) for the integer kernel of a's format and group size.
void QuantizeActs(const QuantMatMulArgs& a, QuantizedActs* acts);

// Rows [n_begin, n_end) of the output of `a` with the integer kernel (needs UseIntegerDot(a) or
// IntegerDotAvailable() && IntegerDotSupports(...)).
void IntegerDotRange(const QuantMatMulArgs& a, const QuantizedActs& acts, int64_t n_begin,
                     int64_t n_end);

// The name --trace-kernels prints for the integer kernel.
const char* IntegerDotName();

}  // namespace dh::cpu
