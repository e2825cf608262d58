// Memory read bandwidth probe: each thread sums its own slice of a large buffer with vector loads.
#include "backend/cpu/membw.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "base/check.h"

namespace dh {

double MeasureReadBandwidthGBs(ThreadPool& pool, size_t bytes) {
  const size_t words = std::max<size_t>(bytes / 8, 1024);
  std::vector<uint64_t> buf(words);
  // Unique contents (splitmix64 of the index), written by the threads that will read them.
  pool.ParallelFor(words, 4096, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      buf[i] = z ^ (z >> 31);
    }
  });
  std::atomic<uint64_t> sink{0};
  double best_seconds = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    pool.ParallelFor(words, 4096, [&](size_t b, size_t e) {
      sink.fetch_add(cpu::SumWords(buf.data() + b, static_cast<int64_t>(e - b)),
                     std::memory_order_relaxed);
    });
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best_seconds = std::min(best_seconds, s);
  }
  // The sum is data dependent, so no rep can be skipped; checking it keeps it observable.
  DH_CHECK(sink.load() != 0 || words == 0, "bandwidth probe summed to zero");
  return static_cast<double>(words * 8) / best_seconds / 1e9;
}

double MeasureFmaPeakGflops(ThreadPool& pool) {
  constexpr int64_t kIters = 1 << 20;  // ~4 ms per thread at one 512-bit FMA pair per cycle
  std::atomic<uint32_t> sink{0};
  double best_seconds = 1e30;
  cpu::FmaProbe(1024);  // warm-up (wakes the workers' cores, settles the clock)
  for (int rep = 0; rep < 7; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    pool.RunOnAll([&](int) {
      const float v = cpu::FmaProbe(kIters);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      sink.fetch_add(bits, std::memory_order_relaxed);
    });
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best_seconds = std::min(best_seconds, s);
  }
  DH_CHECK(sink.load() != 0, "FMA probe summed to zero");
  return static_cast<double>(cpu::FmaProbeFlops(kIters)) * pool.num_threads() / best_seconds / 1e9;
}

}  // namespace dh
