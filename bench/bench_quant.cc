// Quantized-weight MatMul microbenchmark: CpuBackend::MatMul over int8 (groups of 32, per row),
// int4 (groups of 32, 128) and FP8 e4m3 (128x128 block scales) weights, with the f32 kernels and
// with the integer (VNNI) kernels forced, for a few M. Reports the weight bytes actually read
// (codes + scales + zero points) per second and their fraction of the measured read bandwidth.
// Usage: bench_quant [--threads N] [--mb WORKING_SET_MB] [--seconds S] [--m 1,2,4,16]
//                    [--n 8960] [--k 1536] [--cpu-time 1] [--formats
//                    int8,int8-row,int4,int4-g128,fp8] [--packed-min-rows R] [--moe E]
//                    [--shared N1,N2,...] [--fp8-codes gaussian|uniform]
// --packed-min-rows R runs the integer kernels' packed tiles from M = R (default: the engine's).
// int8 / int4 weights also run prepacked (CpuBackend::PrepareWeight's tiles; path name
// "+tiles") on every integer kernel, alternated with the row layout, where the engine would
// prepack (the best kernel is vnni512; not with DH_PREPACKED_TILES=off).
// --moe E times CpuBackend::MoeExperts instead: E experts of int4 g32 SwiGLU weights (gate and up
// [n, k], down [k, n]; --n 1408 --k 2048 is DeepSeek-V2-Lite's), each of M tokens (--m) routed
// to 6 distinct random experts with a new routing every call, on the engine's own kernel choice
// (DH_CPU_TIER / DH_INTEGER_DOT pick the tier); reports the routed experts' bytes per second.
// --shared N1,N2,... times CpuBackend::MatMuls instead: weights of N1, N2, ... rows and --k
// columns over one x (a layer's q, k and v: 1536,256,256 for Qwen2-1.5B; an MLP's gate and up),
// in each of --formats int8 / int4 (groups of 32, prepared as a load prepares them) and bf16, on
// the engine's own kernel choice, as one MatMul per weight and as one MatMuls call, alternated in
// 20 bursts of --seconds / 10 each; the median burst of each is reported, so a host whose speed
// changes between bursts moves both alike.
// --fp8-codes: FP8 weights are normal values (make-model's FillRandomNormal) quantized as a
// checkpoint's are (QuantizeFp8Block: per 128x128 block scale = max|x| / 448; about 1 code in
// 10^4 is zero or subnormal), or with
// `uniform` random codes (no NaN; the exponent's low bit cleared, so 1 code in 8 has exponent 0:
// the codes of sessions 38-39).
// --cpu-time 1 (with --threads 1, where the calling thread does all the work) times the calling
// thread's CPU time instead of wall time: with a cache-resident working set (--mb 1 --n 256) it
// measures the kernels' compute rate even on a busy machine.
#include <algorithm>
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
#include "backend/cpu/membw.h"
#include "backend/cpu/quant_vnni.h"
#include "tools/random_model.h"
#include "weights/quantize.h"

namespace dh {
namespace {

struct Options {
  int threads = 2;
  size_t working_set_mb = 512;
  double seconds = 1.0;
  std::vector<int64_t> ms = {1, 2, 4, 16};
  int64_t n = 8960, k = 1536;
  bool cpu_time = false;
  std::string formats = "int8,int8-row,int4,int4-g128,fp8";
  int64_t packed_min_rows = 0;  // 0: the default (cpu::PackedMinRows)
  int64_t moe_experts = 0;      // --moe E: time MoeExperts over E experts instead
  std::vector<int64_t> shared;  // --shared N1,N2,...: time MatMuls over weights of these rows
  bool fp8_uniform = false;     // --fp8-codes uniform: random codes instead of quantized values
};

double Now(bool cpu_time) {
  if (!cpu_time) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Format {
  const char* name;
  WeightFormat format;
  int group;  // 0: per row
};

// One weight with its own storage, in the backend's host memory (2 MiB pages where the kernel
// gives them) as a loaded model's weights are; std::vector's 4 KiB pages read 0-5 % slower
// (bench/README.md "Benchmark weights in huge pages").
struct Stored {
  std::unique_ptr<Buffer> q, zeros;
  std::unique_ptr<Buffer> scales;  // fp8: f32 per block; int8, int4: f16 per group
  Weight w;
  Weight tiled;  // w with CpuBackend::PrepareWeight's prepacked tiles; else empty
};

uint64_t g_state = 0x9e3779b97f4a7c15ull;
uint8_t RandomByte() {
  g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<uint8_t>(g_state >> 56);
}

// Random codes (each byte & mask), or `count` copies of `value` (scales, zero points), in the
// backend's host memory.
std::unique_ptr<Buffer> RandomBytes(Backend& backend, size_t n, uint8_t mask) {
  auto b = backend.Allocate(n);
  auto* p = static_cast<uint8_t*>(b->data());
  for (size_t i = 0; i < n; ++i) p[i] = RandomByte() & mask;
  return b;
}
template <typename T>
std::unique_ptr<Buffer> Filled(Backend& backend, size_t count, T value) {
  auto b = backend.Allocate(count * sizeof(T));
  auto* p = static_cast<uint8_t*>(b->data());
  for (size_t i = 0; i < count; ++i) std::memcpy(p + i * sizeof(T), &value, sizeof(T));
  return b;
}

// Normal values (tools::FillRandomNormal, as make-model's weights) quantized to FP8 with 128x128
// block scales, once per shape: every copy of the working set holds the same codes.
struct Fp8Codes {
  int64_t n = 0, k = 0;
  std::vector<uint8_t> q;
  std::vector<float> scales;
};
const Fp8Codes& NormalFp8(int64_t n, int64_t k) {
  static Fp8Codes c;
  if (c.n == n && c.k == k) return c;
  std::vector<float> x(static_cast<size_t>(n * k));
  tools::FillRandomNormal(1, 1.0, n * k, DType::kF32, x.data());
  c.n = n;
  c.k = k;
  c.q.resize(x.size());
  c.scales.resize(static_cast<size_t>(((n + 127) / 128) * ((k + 127) / 128)));
  QuantizeFp8Block(x.data(), n, k, 128, 128, c.q.data(), c.scales.data());
  return c;
}

Stored Make(Backend& backend, const Format& f, int64_t n, int64_t k, bool fp8_uniform) {
  Stored s;
  s.w.format = f.format;
  s.w.rows = n;
  s.w.cols = k;
  if (f.format == WeightFormat::kFp8Block) {
    const int64_t br = (n + 127) / 128, bc = (k + 127) / 128;
    if (fp8_uniform) {
      s.q = RandomBytes(backend, n * k, 0xf7);  // no NaN (0x7f / 0xff)
      s.scales = Filled(backend, br * bc, 0.01f);
    } else {
      const Fp8Codes& c = NormalFp8(n, k);
      s.q = backend.Allocate(c.q.size());
      std::memcpy(s.q->data(), c.q.data(), c.q.size());
      s.scales = backend.Allocate(c.scales.size() * sizeof(float));
      std::memcpy(s.scales->data(), c.scales.data(), c.scales.size() * sizeof(float));
    }
    s.w.block_rows = s.w.block_cols = 128;
    s.w.data = Tensor(s.q->data(), DType::kF8E4M3, {n, k});
    s.w.scales = Tensor(s.scales->data(), DType::kF32, {br, bc});
    return s;
  }
  const bool int4 = f.format == WeightFormat::kInt4;
  const int64_t g = f.group > 0 ? f.group : k, groups = (k + g - 1) / g;
  const int64_t row_bytes = int4 ? (k + 1) / 2 : k;
  s.q = RandomBytes(backend, n * row_bytes, 0xff);
  s.scales = Filled(backend, n * groups, F32ToF16(0.01f));
  s.w.group_size = static_cast<int>(g);
  s.w.data = Tensor(s.q->data(), int4 ? DType::kU8 : DType::kI8, {n, row_bytes});
  s.w.scales = Tensor(s.scales->data(), DType::kF16, {n, groups});
  if (int4) {
    const int64_t zero_bytes = (groups + 1) / 2;
    s.zeros = Filled<uint8_t>(backend, n * zero_bytes, 0x88);  // zero point 8 in every group
    s.w.zeros = Tensor(s.zeros->data(), DType::kU8, {n, zero_bytes});
  }
  return s;
}

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return v;
}

// Whether --formats names format `name`.
bool Wanted(const Options& o, const char* name) {
  return ("," + o.formats + ",").find("," + std::string(name) + ",") != std::string::npos;
}

// --moe: MoeExperts over o.moe_experts int4 experts, top 6, hidden o.k, intermediate o.n.
int RunMoe(const Options& o, CpuBackend& cpu, double bw) {
  constexpr int64_t kTopK = 6;
  const int64_t experts = o.moe_experts, hidden = o.k, inter = o.n;
  if (experts < kTopK) {
    std::fprintf(stderr, "bench_quant: --moe needs at least %lld experts\n",
                 static_cast<long long>(kTopK));
    return 2;
  }
  const Format f{"int4", WeightFormat::kInt4, 32};
  std::vector<Stored> stored;
  std::vector<ExpertWeights> ew(static_cast<size_t>(experts));
  auto prepared = [&](int64_t n, int64_t k) {
    stored.push_back(Make(cpu, f, n, k, o.fp8_uniform));
    Result<Weight> p = cpu.PrepareWeight(stored.back().w);
    return p.ok() ? *p : stored.back().w;
  };
  for (ExpertWeights& e : ew) {
    e.gate = prepared(inter, hidden);
    e.up = prepared(inter, hidden);
    e.down = prepared(hidden, inter);
  }
  const size_t expert_bytes = ew[0].gate.nbytes() + ew[0].up.nbytes() + ew[0].down.nbytes();
  std::printf("MoeExperts: %lld int4 g32 experts [%lld x %lld] (%.2f MB each), top %lld, "
              "integer kernel %s%s\n",
              static_cast<long long>(experts), static_cast<long long>(inter),
              static_cast<long long>(hidden), static_cast<double>(expert_bytes) / 1e6,
              static_cast<long long>(kTopK), cpu::IntegerDotName(),
              ew[0].gate.packed.empty() ? "" : " (prepacked tiles)");
  std::printf("| M | us/call | experts read per call | routed GB/s | %% of bandwidth |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: |\n");
  for (int64_t m : o.ms) {
    std::vector<float> x(m * hidden), out(m * hidden), wts(m * kTopK, 1.0f / kTopK);
    for (float& v : x) v = static_cast<float>(RandomByte()) / 128 - 1;
    // 64 routings, cycled: each call reads other experts than the one before.
    constexpr int kRoutings = 64;
    std::vector<int32_t> ids(kRoutings * m * kTopK);
    int64_t distinct_total = 0;
    for (int r = 0; r < kRoutings; ++r) {
      std::vector<uint8_t> used(experts, 0);
      for (int64_t t = 0; t < m; ++t) {
        std::vector<uint8_t> mine(experts, 0);
        for (int64_t i = 0; i < kTopK; ++i) {
          int64_t e = ((RandomByte() << 8) | RandomByte()) % experts;
          while (mine[e]) e = (e + 1) % experts;
          mine[e] = used[e] = 1;
          ids[(r * m + t) * kTopK + i] = static_cast<int32_t>(e);
        }
      }
      for (uint8_t u : used) distinct_total += u;
    }
    const Tensor xt(x.data(), DType::kF32, {m, hidden}), ot(out.data(), DType::kF32, {m, hidden});
    const Tensor wt(wts.data(), DType::kF32, {m, kTopK});
    auto call = [&](int r) {
      const Tensor it(ids.data() + r * m * kTopK, DType::kI32, {m, kTopK});
      cpu.MoeExperts(xt, it, wt, ew, ot);
    };
    for (int r = 0; r < kRoutings; ++r) call(r);  // warm-up
    int64_t calls = 0;
    const double t0 = Now(false);
    double elapsed = 0;
    do {
      for (int r = 0; r < kRoutings; ++r) call(r);
      calls += kRoutings;
      elapsed = Now(false) - t0;
    } while (elapsed < o.seconds);
    const double per_call = elapsed / static_cast<double>(calls);
    const double experts_per_call = static_cast<double>(distinct_total) / kRoutings;
    const double gbs = experts_per_call * static_cast<double>(expert_bytes) / per_call / 1e9;
    std::printf("| %lld | %.1f | %.1f | %.2f | %.1f |\n", static_cast<long long>(m),
                per_call * 1e6, experts_per_call, gbs, 100.0 * gbs / bw);
    std::fflush(stdout);
  }
  return 0;
}

// A dense bf16 weight [n, k] of random values in [-1, 1), in the backend's host memory.
Stored MakeBf16(Backend& backend, int64_t n, int64_t k) {
  Stored s;
  s.q = backend.Allocate(static_cast<size_t>(n * k) * 2);
  auto* p = static_cast<uint16_t*>(s.q->data());
  for (int64_t i = 0; i < n * k; ++i) p[i] = F32ToBF16(static_cast<float>(RandomByte()) / 128 - 1);
  s.w = Weight::Dense(Tensor(s.q->data(), DType::kBF16, {n, k}));
  return s;
}

// --shared: one MatMul per weight against one MatMuls call over the same weights.
int RunShared(const Options& o, CpuBackend& cpu, double bw) {
  const Format formats[] = {{"int8", WeightFormat::kInt8, 32},
                            {"int4", WeightFormat::kInt4, 32},
                            {"bf16", WeightFormat::kDense, 0}};
  std::printf("| format | weights | M | one MatMul each (us) | MatMuls (us) | ratio | MatMuls GB/s "
              "| %% of bandwidth |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::string names;
  for (int64_t n : o.shared) names += (names.empty() ? "" : ",") + std::to_string(n);
  for (const Format& f : formats) {
    if (!Wanted(o, f.name)) continue;
    // Groups of weights cycled through the working set, as in the main loop.
    std::vector<std::vector<Stored>> groups;
    size_t total = 0, group_bytes = 0;
    while (total < (o.working_set_mb << 20) || groups.empty()) {
      groups.emplace_back();
      group_bytes = 0;
      for (int64_t n : o.shared) {
        Stored s = f.format == WeightFormat::kDense ? MakeBf16(cpu, n, o.k)
                                                    : Make(cpu, f, n, o.k, o.fp8_uniform);
        if (f.format != WeightFormat::kDense) {
          Result<Weight> p = cpu.PrepareWeight(s.w);
          if (p.ok()) s.w = *p;
        }
        group_bytes += s.w.nbytes();
        groups.back().push_back(std::move(s));
      }
      total += group_bytes;
    }
    for (int64_t m : o.ms) {
      std::vector<float> x(m * o.k);
      for (float& v : x) v = static_cast<float>(RandomByte()) / 128 - 1;
      const Tensor xt(x.data(), DType::kF32, {m, o.k});
      std::vector<std::vector<float>> outs;
      for (int64_t n : o.shared) outs.emplace_back(m * n);
      auto targets_of = [&](const std::vector<Stored>& g) {
        std::vector<MatMulTarget> t;
        for (size_t i = 0; i < g.size(); ++i) {
          t.push_back({&g[i].w, Tensor(), Tensor(outs[i].data(), DType::kF32, {m, g[i].w.rows})});
        }
        return t;
      };
      std::vector<std::vector<MatMulTarget>> targets;
      for (const auto& g : groups) targets.push_back(targets_of(g));
      auto burst = [&](bool together) {
        int64_t calls = 0;
        const double t0 = Now(false);
        double elapsed = 0;
        do {
          for (const auto& t : targets) {
            if (together) {
              cpu.MatMuls(xt, t);
            } else {
              for (const MatMulTarget& one : t) cpu.MatMul(xt, *one.w, one.bias, one.out);
            }
          }
          calls += static_cast<int64_t>(targets.size());
          elapsed = Now(false) - t0;
        } while (elapsed < o.seconds / 10);
        return elapsed / static_cast<double>(calls);
      };
      burst(false);  // warm-up
      burst(true);
      std::vector<double> each, together;
      for (int b = 0; b < 20; ++b) (b % 2 == 0 ? each : together).push_back(burst(b % 2 != 0));
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double t_each = median(each), t_together = median(together);
      const double gbs = static_cast<double>(group_bytes) / t_together / 1e9;
      std::printf("| %s | %s | %lld | %.1f | %.1f | %.3f | %.2f | %.1f |\n", f.name,
                  names.c_str(), static_cast<long long>(m), t_each * 1e6, t_together * 1e6,
                  t_each / t_together, gbs, 100.0 * gbs / bw);
      std::fflush(stdout);
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") o.threads = std::atoi(argv[i + 1]);
    else if (a == "--mb") o.working_set_mb = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--seconds") o.seconds = std::atof(argv[i + 1]);
    else if (a == "--m") o.ms = ParseList(argv[i + 1]);
    else if (a == "--n") o.n = std::atoll(argv[i + 1]);
    else if (a == "--k") o.k = std::atoll(argv[i + 1]);
    else if (a == "--cpu-time") o.cpu_time = std::atoi(argv[i + 1]) != 0;
    else if (a == "--formats") o.formats = argv[i + 1];
    else if (a == "--packed-min-rows") o.packed_min_rows = std::atoll(argv[i + 1]);
    else if (a == "--moe") o.moe_experts = std::atoll(argv[i + 1]);
    else if (a == "--shared") o.shared = ParseList(argv[i + 1]);
    else if (a == "--fp8-codes" && (std::string(argv[i + 1]) == "gaussian" ||
                                     std::string(argv[i + 1]) == "uniform")) {
      o.fp8_uniform = std::string(argv[i + 1]) == "uniform";
    } else {
      std::fprintf(stderr, "bench_quant: unknown option %s %s\n", a.c_str(), argv[i + 1]);
      return 2;
    }
  }
  cpu::SetPackedMinRowsForTest(o.packed_min_rows);
  // Both layouts of each weight are timed: the rows stay after its tiles are made.
  CpuBackend cpu(BackendOptions{.num_threads = o.threads, .release_rows = false});
  const double bw = MeasureReadBandwidthGBs(cpu.pool(), o.working_set_mb << 20);
  std::printf("threads %d, N=%lld K=%lld, measured read bandwidth %.2f GB/s, best integer kernel %s\n",
              o.threads, static_cast<long long>(o.n), static_cast<long long>(o.k), bw,
              cpu::IntegerDotPathName(cpu::BestIntegerDotPath()));
  if (o.moe_experts != 0) return RunMoe(o, cpu, bw);
  if (!o.shared.empty()) return RunShared(o, cpu, bw);
  std::printf("packed integer tiles from M = %lld\n",
              static_cast<long long>(cpu::PackedMinRows()));
  std::printf("| format | path | M | us/call | weight GB/s | %% of bandwidth | GOP/s |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  const Format formats[] = {{"int8", WeightFormat::kInt8, 32},
                            {"int8-row", WeightFormat::kInt8, 0},
                            {"int4", WeightFormat::kInt4, 32},
                            {"int4-g128", WeightFormat::kInt4, 128},
                            {"fp8", WeightFormat::kFp8Block, 0}};
  for (const Format& f : formats) {
    if (!Wanted(o, f.name)) continue;
    std::vector<Stored> copies;
    size_t total = 0;
    while (total < (o.working_set_mb << 20) || copies.empty()) {
      copies.push_back(Make(cpu, f, o.n, o.k, o.fp8_uniform));
      total += copies.back().w.nbytes();
      if (f.format != WeightFormat::kFp8Block) {
        Result<Weight> p = cpu.PrepareWeight(copies.back().w);
        if (p.ok() && !p->packed.empty()) copies.back().tiled = *p;
      }
    }
    const size_t bytes = copies[0].w.nbytes();
    for (int64_t m : o.ms) {
      std::vector<float> x(m * o.k), out(m * o.n);
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(RandomByte()) / 128 - 1;
      const Tensor xt(x.data(), DType::kF32, {m, o.k}), ot(out.data(), DType::kF32, {m, o.n});
      const bool int_fmt = f.format != WeightFormat::kFp8Block;
      // f32 products, then each integer kernel the CPU has (interleaved per M).
      for (cpu::IntegerDotPath path :
           {cpu::IntegerDotPath::kNone, cpu::IntegerDotPath::kAvx2, cpu::IntegerDotPath::kAvxVnni,
            cpu::IntegerDotPath::kVnni512}) {
        const bool integer = path != cpu::IntegerDotPath::kNone;
        if (integer && (!int_fmt || !cpu::IntegerDotPathAvailable(path))) continue;
        cpu::SetIntegerDotForTest(integer ? cpu::IntegerDot::kOn : cpu::IntegerDot::kOff);
        cpu::SetIntegerDotPathForTest(path);
        for (const bool tiled : {false, true}) {
          if (tiled && (!integer || copies[0].tiled.empty())) continue;
          auto weight = [&](const Stored& s) -> const Weight& { return tiled ? s.tiled : s.w; };
          for (const Stored& s : copies) cpu.MatMul(xt, weight(s), Tensor(), ot);  // warm-up
          int64_t calls = 0;
          const double t0 = Now(o.cpu_time);
          double elapsed = 0;
          do {
            for (const Stored& s : copies) cpu.MatMul(xt, weight(s), Tensor(), ot);
            calls += static_cast<int64_t>(copies.size());
            elapsed = Now(o.cpu_time) - t0;
          } while (elapsed < o.seconds);
          const double per_call = elapsed / static_cast<double>(calls);
          const double gbs = static_cast<double>(bytes) / per_call / 1e9;
          const double gops = 2.0 * static_cast<double>(m * o.n * o.k) / per_call / 1e9;
          std::printf("| %s | %s%s | %lld | %.1f | %.2f | %.1f | %.1f |\n", f.name,
                      integer ? cpu::IntegerDotPathName(path) : "f32", tiled ? "+tiles" : "",
                      static_cast<long long>(m), per_call * 1e6, gbs, 100.0 * gbs / bw, gops);
          std::fflush(stdout);
        }
      }
    }
  }
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kAuto);
  cpu::SetIntegerDotPathForTest(cpu::IntegerDotPath::kNone);
  return 0;
}

}  // namespace
}  // namespace dh

int main(int argc, char** argv) { return dh::Main(argc, argv); }
