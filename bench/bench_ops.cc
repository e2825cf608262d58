// Kernel microbenchmark: GEMV (decode-shaped MatMul) throughput of CpuBackend for bf16 and f32
// weights as a fraction of the machine's measured read bandwidth, plus GEMM rates for small M.
// Usage: bench_ops [--threads N] [--mb WORKING_SET_MB] [--seconds S]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/membw.h"

namespace dh {
namespace {

struct Options {
  int threads = 2;
  size_t working_set_mb = 512;
  double seconds = 1.0;
};

// Unique pseudo-random weights in [-1, 1): identical pages would let the VM merge them.
void FillUnique(std::vector<uint8_t>& bytes, DType dtype, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  const size_t n = bytes.size() / DTypeSize(dtype);
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float v = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / (1 << 23);
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data() + i * 4, &v, 4);
    } else {
      const uint16_t h = F32ToBF16(v);
      std::memcpy(bytes.data() + i * 2, &h, 2);
    }
  }
}

// Seconds per MatMul of x [m, k] with each of `copies` distinct [n, k] weights in turn (so the
// weights come from memory, not cache), best of repeated passes within `seconds`.
double TimeMatMul(CpuBackend& cpu, DType dtype, int64_t m, int64_t n, int64_t k, size_t copies,
                  double seconds) {
  std::vector<std::vector<uint8_t>> store(copies);
  std::vector<Weight> weights;
  for (size_t c = 0; c < copies; ++c) {
    store[c].resize(static_cast<size_t>(n * k) * DTypeSize(dtype));
    FillUnique(store[c], dtype, c + 1);
    weights.push_back(Weight::Dense(Tensor(store[c].data(), dtype, {n, k})));
  }
  std::vector<float> x(m * k, 0.5f), out(m * n);
  const Tensor xt(x.data(), DType::kF32, {m, k}), ot(out.data(), DType::kF32, {m, n});
  for (const Weight& w : weights) cpu.MatMul(xt, w, Tensor(), ot);  // warm-up
  double best = 1e30;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int passes = 0;
  while (passes < 3 || std::chrono::steady_clock::now() < deadline) {
    const auto start = std::chrono::steady_clock::now();
    for (const Weight& w : weights) cpu.MatMul(xt, w, Tensor(), ot);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, s / static_cast<double>(copies));
    ++passes;
  }
  return best;
}

int Run(const Options& o) {
  CpuBackend cpu(BackendOptions{.num_threads = o.threads});
  const double bw = MeasureReadBandwidthGBs(cpu.pool(), o.working_set_mb << 20);
  std::printf("threads=%d target=%s measured read bandwidth: %.2f GB/s\n", o.threads,
              cpu::DispatchedTargetName(), bw);
  std::printf("%-5s %5s %6s %6s %10s %10s %9s %8s\n", "dtype", "M", "N", "K", "time_us", "GB/s",
              "GFLOP/s", "bw_frac");
  struct Shape {
    int64_t n, k;
  };
  // Qwen2-1.5B-shaped projections: attention, MLP up/gate, MLP down.
  const Shape shapes[] = {{1536, 1536}, {8960, 1536}, {1536, 8960}};
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (const Shape& s : shapes) {
      const size_t bytes = static_cast<size_t>(s.n * s.k) * DTypeSize(dtype);
      const size_t copies = std::max<size_t>(2, (o.working_set_mb << 20) / bytes);
      for (int64_t m : {1, 4, 16}) {
        const double t = TimeMatMul(cpu, dtype, m, s.n, s.k, copies, o.seconds);
        const double gbs = static_cast<double>(bytes) / t / 1e9;
        const double gflops = 2.0 * m * s.n * s.k / t / 1e9;
        std::printf("%-5s %5lld %6lld %6lld %10.1f %10.2f %9.1f %8.2f\n",
                    std::string(DTypeName(dtype)).c_str(), static_cast<long long>(m),
                    static_cast<long long>(s.n), static_cast<long long>(s.k), t * 1e6, gbs, gflops,
                    gbs / bw);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace dh

int main(int argc, char** argv) {
  dh::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") {
      o.threads = std::atoi(argv[i + 1]);
    } else if (flag == "--mb") {
      o.working_set_mb = static_cast<size_t>(std::atoll(argv[i + 1]));
    } else if (flag == "--seconds") {
      o.seconds = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: bench_ops [--threads N] [--mb MB] [--seconds S]\n");
      return 2;
    }
  }
  if ((argc - 1) % 2 != 0 || o.threads < 1 || o.working_set_mb < 16 || o.seconds <= 0) {
    std::fprintf(stderr, "usage: bench_ops [--threads N] [--mb MB] [--seconds S]\n");
    return 2;
  }
  return dh::Run(o);
}
