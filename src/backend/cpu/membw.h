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

}  // namespace dh
