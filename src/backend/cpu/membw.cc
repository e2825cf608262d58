// Memory read bandwidth probe (each thread sums its own slice of a large buffer with vector
// loads) and the f32 FMA / bf16 dot peak probes.
#include "backend/cpu/membw.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_bf16.h"
#include "base/check.h"
#include "base/stats.h"

namespace dh {

double MeasureReadBandwidthGBs(ThreadPool& pool, size_t bytes) {
  return MeasureReadBandwidth(pool, bytes).best_gbs;
}

ReadBandwidth MeasureReadBandwidth(ThreadPool& pool, size_t bytes) {
  const size_t words = std::max<size_t>(bytes / 8, 1024);
  // 2 MiB aligned and advised as transparent huge pages where the kernel offers them: a TLB
  // miss every 4 KiB otherwise costs a few percent of the rate (the weights, a long-lived
  // mapping, usually get huge pages).
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t alloc = (words * 8 + kHuge - 1) / kHuge * kHuge;
  std::unique_ptr<uint64_t, decltype(&std::free)> mem(
      static_cast<uint64_t*>(std::aligned_alloc(kHuge, alloc)), &std::free);
  DH_CHECK(mem != nullptr, "bandwidth probe: cannot allocate {} bytes", alloc);
  uint64_t* buf = mem.get();
#if defined(__linux__)
  madvise(buf, alloc, MADV_HUGEPAGE);  // advice only: failure leaves normal pages
#endif
  // Unique contents (splitmix64 of the index), written by the threads that will read them.
  pool.ParallelFor(words, 4096, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      buf[i] = z ^ (z >> 31);
    }
  });
  // Two readers, alternated: one stream per thread, and two streams per thread (each thread's
  // slice read from its start and its middle at once), which some memory systems serve faster.
  // The best of all runs is the machine's rate: a kernel that reads its weights faster than the
  // probe would show more than 100 %.
  uint64_t (*const readers[])(const uint64_t*, int64_t) = {cpu::SumWords,
                                                           cpu::SumWordsTwoStreams};
  std::atomic<uint64_t> sink{0};
  std::vector<double> seconds;
  for (int rep = 0; rep < 8; ++rep) {
    for (auto* reader : readers) {
      const auto start = std::chrono::steady_clock::now();
      pool.ParallelFor(words, 4096, [&](size_t b, size_t e) {
        sink.fetch_add(reader(buf + b, static_cast<int64_t>(e - b)), std::memory_order_relaxed);
      });
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      seconds.push_back(s);
    }
  }
  // The sum is data dependent, so no rep can be skipped; checking it keeps it observable.
  DH_CHECK(sink.load() != 0 || words == 0, "bandwidth probe summed to zero");
  std::sort(seconds.begin(), seconds.end());
  const double best = seconds.front();
  const double median = Percentile(seconds, 50);
  ReadBandwidth r;
  r.best_gbs = static_cast<double>(words * 8) / best / 1e9;
  r.median_gbs = static_cast<double>(words * 8) / median / 1e9;
  return r;
}

namespace {

constexpr int64_t kPeakIters = 1 << 20;  // ~4 ms per thread at one 512-bit FMA pair per cycle

// Best of 7 runs of `probe(kPeakIters)` (flops_per_call flops each) on every thread of pool, in
// GFLOP/s.
double MeasurePeak(ThreadPool& pool, float (*probe)(int64_t), int64_t flops_per_call) {
  std::atomic<uint32_t> sink{0};
  double best_seconds = 1e30;
  probe(1024);  // warm-up (wakes the workers' cores, settles the clock)
  for (int rep = 0; rep < 7; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    pool.RunOnAll([&](int) {
      const float v = probe(kPeakIters);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      sink.fetch_add(bits, std::memory_order_relaxed);
    });
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best_seconds = std::min(best_seconds, s);
  }
  DH_CHECK(sink.load() != 0, "peak probe summed to zero");
  return static_cast<double>(flops_per_call) * pool.num_threads() / best_seconds / 1e9;
}

}  // namespace

double MeasureFmaPeakGflops(ThreadPool& pool) {
  return MeasurePeak(pool, cpu::FmaProbe, cpu::FmaProbeFlops(kPeakIters));
}

double MeasureBf16PeakGflops(ThreadPool& pool) {
  if (!cpu::Bf16DotAvailable()) return 0.0;
  return MeasurePeak(pool, cpu::Bf16DotProbe, cpu::Bf16DotProbeFlops(kPeakIters));
}

}  // namespace dh
