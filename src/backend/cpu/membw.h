// Measured memory read bandwidth of this machine, the yardstick for bandwidth-bound kernels
// (bench_ops, `deepharness bench`).
#pragma once

#include <cstddef>

#include "base/thread_pool.h"

namespace dh {

// Best-of-several read bandwidth in GB/s (1e9 bytes/s) over a buffer of `bytes` (use several
// times the last-level cache) read by every thread of `pool`. The buffer is filled with unique
// data (identical pages could be merged by the VM) and every read feeds a sum that is kept.
double MeasureReadBandwidthGBs(ThreadPool& pool, size_t bytes);

// Best-of-several f32 FMA throughput in GFLOP/s (one FMA = 2 flops) of every thread of `pool`
// together, with independent register-resident FMA chains on the dispatched SIMD target: the
// yardstick for compute-bound kernels (prefill GEMM). Takes ~0.2 s.
double MeasureFmaPeakGflops(ThreadPool& pool);

}  // namespace dh
