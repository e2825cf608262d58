// The value checks of `verify` (verify.h): per-tensor statistics taken on the raw bits of each
// element, fast enough to keep up with the disk.
#pragma once

#include <cstdint>

#include "io/safetensors.h"
#include "tools/verify.h"

namespace dh {

// Element i of a float tensor's data (f32, f16, bf16, f8 e4m3/e5m2) as f32; 0 for other dtypes.
float ElementAt(const uint8_t* data, DType dtype, uint64_t i);

// The largest finite magnitude bit pattern of `dtype` whose value is <= limit: the threshold
// AccumulateStats compares against (values order like their bits once the sign is cleared).
uint64_t LimitBits(DType dtype, double limit);

// Adds one chunk of n elements of a tensor to s: NaN, Inf, |x| above the limit given as
// limit_bits, max |x|, and with cols > 0 (whole rows of a 2-D tensor) the all-zero rows.
void AccumulateStats(const uint8_t* data, DType dtype, uint64_t n, uint64_t cols,
                     uint64_t limit_bits, TensorStats* s);

}  // namespace dh
