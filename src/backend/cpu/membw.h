// Measured memory read bandwidth of this machine, the yardstick for bandwidth-bound kernels
// (bench_ops, `deepharness bench`).
#pragma once

#include <cstddef>

#include "base/thread_pool.h"

namespace dh {

// Best-of-several read bandwidth in GB/s (1e9 bytes/s) over a buffer of `bytes` (use several
// times the last-level cache) read by every thread of `pool`, in huge pages where the kernel
// offers them, by two readers (one and two streams per thread), best of 8 runs each. The buffer
// is filled with unique data (identical pages could be merged by the VM) and every read feeds a
// sum that is kept.
double MeasureReadBandwidthGBs(ThreadPool& pool, size_t bytes);

// The same probe's best and median run (GB/s): the best is what the machine reaches, the median
// what it gives most of the time (on the shared VM of bench/README.md "Zen 5, session 25" the
// median ran 7-30 % below the best).
struct ReadBandwidth {
  double best_gbs = 0;
  double median_gbs = 0;
};
ReadBandwidth MeasureReadBandwidth(ThreadPool& pool, size_t bytes);

// Best-of-several f32 FMA throughput in GFLOP/s (one FMA = 2 flops) of every thread of `pool`
// together, with independent register-resident FMA chains on the dispatched SIMD target: the
// yardstick for compute-bound kernels (prefill GEMM). Takes ~0.2 s.
double MeasureFmaPeakGflops(ThreadPool& pool);

// Best-of-several bf16 dot-product throughput in GFLOP/s (vdpbf16ps: 32 multiply-adds of bf16
// pairs into f32 per 512-bit instruction, 2 flops each) on every thread of `pool`: the yardstick
// for the AVX512-BF16 GEMM (gemm_bf16.h). 0 on a CPU without AVX512-BF16.
double MeasureBf16PeakGflops(ThreadPool& pool);

}  // namespace dh
