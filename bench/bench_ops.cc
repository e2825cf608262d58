// Kernel microbenchmark: GEMV (decode-shaped MatMul) throughput of CpuBackend for bf16 and f32
// weights as a fraction of the machine's measured read bandwidth, plus GEMM rates for larger M as
// a fraction of the measured f32 FMA peak and (bf16 weights, AVX512-BF16) of the bf16 dot peak;
// DH_BF16_DOT=off runs bf16 weights on the f32 FMA GEMM for comparison.
// Usage: bench_ops [--threads N] [--mb WORKING_SET_MB] [--seconds S] [--m 1,4,16]
//                  [--kernel auto|gemv|gemm] [--dtype all|bf16|f32] [--heads H]
// --heads H times CpuBackend::BatchedMatMul on MLA's absorbed decode products with H heads
// (V2-Lite 16, V3 128) instead.
// --kernel gemv / gemm call cpu::MatMulRange / cpu::Gemm directly (to find their crossover in M);
// auto goes through CpuBackend::MatMul.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/membw.h"

namespace dh {
namespace {

struct Options {
  int threads = 2;
  size_t working_set_mb = 512;
  double seconds = 1.0;
  std::vector<int64_t> ms = {1, 4, 16};
  std::string kernel = "auto";
  std::string dtype = "all";
  int64_t heads = 0;  // --heads H: time BatchedMatMul on MLA's absorbed products instead
};

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long long v = std::strtoll(p, &end, 10);
    if (end == p || v < 1) return {};
    out.push_back(v);
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != 0) return {};
  }
  return out;
}

// Unique pseudo-random weights in [-1, 1): identical pages would let the VM merge them.
void FillUnique(Buffer& bytes, DType dtype, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  const size_t n = bytes.size() / DTypeSize(dtype);
  auto* out = static_cast<uint8_t*>(bytes.data());
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float v = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / (1 << 23);
    if (dtype == DType::kF32) {
      std::memcpy(out + i * 4, &v, 4);
    } else {
      const uint16_t h = F32ToBF16(v);
      std::memcpy(out + i * 2, &h, 2);
    }
  }
}

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// f32 FMA peak per CPU-second of one thread (insensitive to other processes taking the core).
double FmaPeakPerCpuSecond() {
  constexpr int64_t kIters = 1 << 22;
  double best = 1e30;
  float keep = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = CpuSeconds();
    keep += cpu::FmaProbe(kIters);
    best = std::min(best, CpuSeconds() - t0);
  }
  if (keep == 12345.0f) std::printf(" ");
  return static_cast<double>(cpu::FmaProbeFlops(kIters)) / best / 1e9;
}

// Seconds per MatMul of x [m, k] with each of `copies` distinct [n, k] weights in turn (so the
// weights come from memory, not cache), best of repeated passes within `seconds`.
double TimeMatMul(CpuBackend& cpu, DType dtype, int64_t m, int64_t n, int64_t k, size_t copies,
                  double seconds, const std::string& kernel, double* cpu_seconds) {
  // The backend's own host memory (2 MiB pages where the kernel gives them), as a loaded model's
  // weights get; std::vector's 4 KiB pages read 0-5 % slower (bench/README.md "Benchmark
  // weights in huge pages").
  std::vector<std::unique_ptr<Buffer>> store;
  std::vector<Weight> weights;
  for (size_t c = 0; c < copies; ++c) {
    store.push_back(cpu.Allocate(static_cast<size_t>(n * k) * DTypeSize(dtype)));
    FillUnique(*store[c], dtype, c + 1);
    weights.push_back(Weight::Dense(Tensor(store[c]->data(), dtype, {n, k})));
  }
  std::vector<float> x(m * k, 0.5f), out(m * n);
  const Tensor xt(x.data(), DType::kF32, {m, k}), ot(out.data(), DType::kF32, {m, n});
  auto matmul = [&](const Weight& w) {
    if (kernel == "auto") return cpu.MatMul(xt, w, Tensor(), ot);
    const cpu::WType wt = dtype == DType::kF32 ? cpu::WType::kF32 : cpu::WType::kBF16;
    if (kernel == "gemm") {
      cpu::GemmArgs g;
      g.x = x.data();
      g.x_stride = k;
      g.m = m;
      g.n = n;
      g.k = k;
      g.w = w.data.data;
      g.wtype = wt;
      g.w_stride = k;
      g.out = out.data();
      g.out_stride = n;
      return cpu::Gemm(g, cpu.pool());
    }
    cpu::MatMulArgs a;
    a.x = x.data();
    a.x_stride = k;
    a.m = m;
    a.w = w.data.data;
    a.wtype = wt;
    a.w_stride = k;
    a.k = k;
    a.out = out.data();
    a.out_stride = n;
    cpu.pool().ParallelFor(n, std::max<int64_t>(1, 32768 / (m * k)),
                           [&](size_t b, size_t e) { cpu::MatMulRange(a, b, e); });
  };
  for (const Weight& w : weights) matmul(w);  // warm-up
  double best = 1e30;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int passes = 0;
  while (passes < 3 || std::chrono::steady_clock::now() < deadline) {
    const auto start = std::chrono::steady_clock::now();
    const double c0 = CpuSeconds();
    for (const Weight& w : weights) matmul(w);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    *cpu_seconds = std::min(*cpu_seconds, (CpuSeconds() - c0) / static_cast<double>(copies));
    best = std::min(best, s / static_cast<double>(copies));
    ++passes;
  }
  return best;
}

// Seconds per BatchedMatMul of x [m, heads, k] with `heads` bf16 weights [n, k] (multiplied by
// exact x, as MLA's absorbed kv_b copies are), each of `copies` distinct sets in turn; best of
// repeated passes within `seconds`.
double TimeBatched(CpuBackend& cpu, int64_t m, int64_t heads, int64_t n, int64_t k, size_t copies,
                   double seconds) {
  std::vector<std::unique_ptr<Buffer>> store;
  std::vector<std::vector<Weight>> sets(copies);
  for (size_t c = 0; c < copies; ++c) {
    for (int64_t h = 0; h < heads; ++h) {
      store.push_back(cpu.Allocate(static_cast<size_t>(n * k) * 2));
      FillUnique(*store.back(), DType::kBF16, c * heads + h + 1);
      Weight w = Weight::Dense(Tensor(store.back()->data(), DType::kBF16, {n, k}));
      w.exact_x = true;
      sets[c].push_back(w);
    }
  }
  std::vector<float> x(m * heads * k, 0.5f), out(m * heads * n);
  const Tensor xt(x.data(), DType::kF32, {m, heads, k});
  const Tensor ot(out.data(), DType::kF32, {m, heads, n});
  for (const auto& set : sets) cpu.BatchedMatMul(xt, set, ot);  // warm-up
  double best = 1e30;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int passes = 0;
  while (passes < 3 || std::chrono::steady_clock::now() < deadline) {
    const auto start = std::chrono::steady_clock::now();
    for (const auto& set : sets) cpu.BatchedMatMul(xt, set, ot);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, s / static_cast<double>(copies));
    ++passes;
  }
  return best;
}

// MLA's two absorbed products per layer at decode (DeepSeek-V2/V3: kv_lora 512, qk_nope 128,
// v_head 128): q_nope through W_uk^T ([512, 128] per head) and the latent output through W_uv
// ([128, 512] per head).
int RunBatched(const Options& o, CpuBackend& cpu, double bw) {
  std::printf("%-9s %5s %5s %6s %6s %10s %10s %8s\n", "product", "M", "heads", "N", "K",
              "time_us", "GB/s", "bw_frac");
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  for (const Shape& s : {Shape{"q*W_uk^T", 512, 128}, Shape{"o*W_uv", 128, 512}}) {
    const size_t bytes = static_cast<size_t>(o.heads * s.n * s.k) * 2;
    for (int64_t m : o.ms) {
      const size_t copies = std::max<size_t>(2, (o.working_set_mb << 20) / bytes);
      const double t = TimeBatched(cpu, m, o.heads, s.n, s.k, copies, o.seconds);
      const double gbs = static_cast<double>(bytes) / t / 1e9;
      std::printf("%-9s %5lld %5lld %6lld %6lld %10.1f %10.2f %8.2f\n", s.name,
                  static_cast<long long>(m), static_cast<long long>(o.heads),
                  static_cast<long long>(s.n), static_cast<long long>(s.k), t * 1e6, gbs,
                  gbs / bw);
    }
  }
  return 0;
}

int Run(const Options& o) {
  CpuBackend cpu(BackendOptions{.num_threads = o.threads});
  const double bw = MeasureReadBandwidthGBs(cpu.pool(), o.working_set_mb << 20);
  const double peak = MeasureFmaPeakGflops(cpu.pool());
  const double bf16_peak = MeasureBf16PeakGflops(cpu.pool());  // 0 without AVX512-BF16
  const double core_peak = FmaPeakPerCpuSecond();
  cpu::GemmArgs bf16_call;
  bf16_call.m = 8;
  bf16_call.k = 64;
  bf16_call.wtype = cpu::WType::kBF16;
  std::printf("threads=%d target=%s measured read bandwidth: %.2f GB/s, f32 FMA peak: %.1f GFLOP/s "
              "(%.1f GFLOP per CPU-second of one thread), bf16 dot peak: %.1f GFLOP/s, bf16 GEMM: "
              "%s\n",
              o.threads, cpu::DispatchedTargetName(), bw, peak, core_peak, bf16_peak,
              cpu::UseBf16Dot(bf16_call) ? "vdpbf16ps" : "f32 FMA");
  if (o.heads > 0) return RunBatched(o, cpu, bw);
  // cpu_frac: GFLOP per CPU-second of the whole process / (threads x the one-thread peak per
  // CPU-second): the kernel's efficiency while other processes take turns on the cores (pool
  // threads waiting at the end of a call count as busy, so it errs low).
  // bf16_frac: GFLOP/s / the bf16 dot peak (bf16 rows on a CPU with AVX512-BF16).
  std::printf("%-5s %5s %6s %6s %10s %10s %9s %8s %9s %8s %9s\n", "dtype", "M", "N", "K",
              "time_us", "GB/s", "GFLOP/s", "bw_frac", "peak_frac", "cpu_frac", "bf16_frac");
  struct Shape {
    int64_t n, k;
  };
  // Qwen2-1.5B-shaped projections: attention, MLP up/gate, MLP down.
  const Shape shapes[] = {{1536, 1536}, {8960, 1536}, {1536, 8960}};
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    if (o.dtype != "all" && o.dtype != DTypeName(dtype)) continue;
    for (const Shape& s : shapes) {
      const size_t bytes = static_cast<size_t>(s.n * s.k) * DTypeSize(dtype);
      for (int64_t m : o.ms) {
        // Decode and batched decode (up to 16 rows): distinct weights from memory, as a decode
        // step reads them; more rows (prefill): compute-bound, two copies.
        const size_t copies = m <= 16 ? std::max<size_t>(2, (o.working_set_mb << 20) / bytes) : 2;
        double cpu_s = 1e30;
        const double t =
            TimeMatMul(cpu, dtype, m, s.n, s.k, copies, o.seconds, o.kernel, &cpu_s);
        const double cpu_frac = 2.0 * m * s.n * s.k / cpu_s / 1e9 / (o.threads * core_peak);
        const double gbs = static_cast<double>(bytes) / t / 1e9;
        const double gflops = 2.0 * m * s.n * s.k / t / 1e9;
        const bool bf16_row = dtype == DType::kBF16 && bf16_peak > 0;
        std::printf("%-5s %5lld %6lld %6lld %10.1f %10.2f %9.1f %8.2f %9.2f %8.2f %9s\n",
                    std::string(DTypeName(dtype)).c_str(), static_cast<long long>(m),
                    static_cast<long long>(s.n), static_cast<long long>(s.k), t * 1e6, gbs, gflops,
                    gbs / bw, gflops / peak, cpu_frac,
                    bf16_row ? fmt::format("{:.2f}", gflops / bf16_peak).c_str() : "-");
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace dh

namespace {
constexpr const char* kUsage =
    "usage: bench_ops [--threads N] [--mb MB] [--seconds S] [--m M1,M2,...] "
    "[--kernel auto|gemv|gemm] [--dtype all|bf16|f32] [--heads H]\n";
}  // namespace

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
    } else if (flag == "--m") {
      o.ms = dh::ParseList(argv[i + 1]);
    } else if (flag == "--kernel") {
      o.kernel = argv[i + 1];
    } else if (flag == "--dtype") {
      o.dtype = argv[i + 1];
    } else if (flag == "--heads") {
      o.heads = std::atoll(argv[i + 1]);
    } else {
      std::fprintf(stderr, "%s", kUsage);
      return 2;
    }
  }
  const bool kernel_ok = o.kernel == "auto" || o.kernel == "gemv" || o.kernel == "gemm";
  if ((argc - 1) % 2 != 0 || o.threads < 1 || o.working_set_mb < 16 || o.seconds <= 0 ||
      o.ms.empty() || !kernel_ok || o.heads < 0) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  return dh::Run(o);
}
