// The activation side every CPU matmul kernel shares (dense GEMV, tiled GEMM, int8/int4 and FP8
// GEMV): m rows of k f32 values (x), the f32 output rows and an optional bias. Each kernel's
// argument struct derives from it and adds only its weight's layout, so CpuBackend::MatMul
// fills these fields once per call.
#pragma once

#include <cstdint>

namespace dh::cpu {

struct ActivationArgs {
  const float* x = nullptr;
  int64_t x_stride = 0;  // floats between rows of x
  int64_t m = 0;         // rows of x and of out
  int64_t k = 0;         // columns of x (= of the weight)
  const float* bias = nullptr;  // one float per output feature; may be null
  float* out = nullptr;
  int64_t out_stride = 0;  // floats between rows of out
};

}  // namespace dh::cpu
