// Attention microbenchmark: CpuBackend::Attention over a paged KV cache, as a causal prefill of
// --ctx tokens (every query row sees the keys up to its own position) and as a decode step of
// --batch sequences of --ctx cached tokens each, against the machine's measured f32 FMA peak.
// Usage: bench_attention [--threads N] [--hq 12] [--hkv 2] [--dk 128] [--dv 128] [--ctx 512]
//                        [--batch 1] [--kv f32|bf16|f8e4m3|i8] [--mode both|prefill|decode]
//                        [--v-in-k 0|1] [--seconds S] [--layers L] [--kv-layout head|slot]
// --layers L gives every call its own cache of L (a model's layers), used in turn, so that with
// enough of them (a working set beyond the last-level cache) the keys and values come from
// memory as a model's decode reads them; time and GB/s are per call (one layer).
// --v-in-k 1 reads the values as the first dv elements of the key rows (MLA's latent cache).
// --kv-layout: the cache head by head (default: as KvStorage lays out the CPU backend's cache,
// Backend::KvCacheHeadMajor) or slot by slot (a slot's heads side by side).
// GFLOP counts 2 flops per multiply-add of the scores and of the value sum over the keys each
// row really sees (causal prefill: about half of ctx^2).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/membw.h"
#include "backend/reference/reference_backend.h"
#include "tensor/dtype.h"

namespace dh {
namespace {

struct Options {
  int threads = 2;
  int64_t hq = 12, hkv = 2, dk = 128, dv = 128;
  int ctx = 512, batch = 1;
  std::string kv = "f32";
  std::string mode = "both";
  bool v_in_k = false;
  double seconds = 1.0;
  int layers = 1;
  int layout = -1;  // --kv-layout: 1 head by head, 0 slot by slot, -1 the CPU backend's
  bool head_major = true;  // the layout in use (Run)
};

constexpr int kBlockSize = 16;

// A cache of [slots, hkv, dim] in `dtype` (scales per token and head when quantized), head by
// head or slot by slot (KvStorage's two layouts), filled through the reference KvWrite from
// pseudo-random values in [-1, 1).
struct Cache {
  std::vector<uint8_t> data;
  std::vector<float> scales;
  KvCacheView view;
  Cache(DType dtype, int64_t slots, int64_t heads, int64_t dim, bool head_major) {
    data.resize(static_cast<size_t>(slots * heads * dim) * DTypeSize(dtype));
    Tensor d(data.data(), dtype, {slots, heads, dim});
    if (head_major) d = HeadMajorKv(d);
    if (dtype == DType::kF8E4M3 || dtype == DType::kI8) {
      scales.resize(static_cast<size_t>(slots * heads));
      Tensor sc(scales.data(), DType::kF32, {slots, heads, 1});
      if (head_major) sc = HeadMajorKv(sc);
      view = KvCacheView(d, sc, dim);
    } else {
      view = KvCacheView(d);
    }
  }
};

void FillRandom(std::vector<float>& v, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / (1 << 23);
  }
}

// Best seconds per Attention call of `num_tokens` query rows over `seqs` sequences of `ctx`
// cached tokens each (the last `queries` of each are the queries).
double TimeAttention(CpuBackend& cpu, const Options& o, DType dtype, int seqs, int queries,
                     double* gflop, double* bytes) {
  const int blocks_per_seq = (o.ctx + kBlockSize - 1) / kBlockSize;
  const int64_t slots = static_cast<int64_t>(seqs) * blocks_per_seq * kBlockSize;
  std::vector<std::unique_ptr<Cache>> kcs, vcs;
  {
    ReferenceBackend ref({});
    std::vector<float> k(slots * o.hkv * o.dk), v(slots * o.hkv * o.dv);
    FillRandom(k, 1);
    FillRandom(v, 2);
    std::vector<int32_t> all(slots);
    std::iota(all.begin(), all.end(), 0);
    for (int l = 0; l < o.layers; ++l) {
      kcs.push_back(std::make_unique<Cache>(dtype, slots, o.hkv, o.dk, o.head_major));
      vcs.push_back(
          std::make_unique<Cache>(dtype, o.v_in_k ? 1 : slots, o.hkv, o.dv, o.head_major));
      ref.KvWrite(Tensor(k.data(), DType::kF32, {slots, o.hkv, o.dk}),
                  Tensor(v.data(), DType::kF32, {slots, o.hkv, o.dv}), kcs.back()->view,
                  o.v_in_k ? kcs.back()->view.NarrowRow(0, o.dv) : vcs.back()->view,
                  Tensor(all.data(), DType::kI32, {slots}));
    }
  }
  // MLA: the values are the first dv elements of the key rows (one scale per row covers both).
  auto v_view = [&](int l) { return o.v_in_k ? kcs[l]->view.NarrowRow(0, o.dv) : vcs[l]->view; };
  *bytes = static_cast<double>(seqs) * o.ctx * o.hkv *
           static_cast<double>(o.v_in_k ? o.dk : o.dk + o.dv) * DTypeSize(dtype);
  // Each sequence's blocks in reverse order, so the slot list is not one run.
  std::vector<int32_t> tables(static_cast<size_t>(seqs) * blocks_per_seq), lens(seqs, o.ctx),
      qs(seqs + 1);
  for (int s = 0; s < seqs; ++s) {
    for (int b = 0; b < blocks_per_seq; ++b) {
      tables[s * blocks_per_seq + b] = s * blocks_per_seq + (blocks_per_seq - 1 - b);
    }
  }
  for (int s = 0; s <= seqs; ++s) qs[s] = s * queries;
  const int64_t tokens = static_cast<int64_t>(seqs) * queries;
  std::vector<float> q(tokens * o.hq * o.dk), out(tokens * o.hq * o.dv);
  FillRandom(q, 3);
  const AttentionMeta meta = HostAttentionMeta(qs, lens, tables, static_cast<int>(tokens),
                                               kBlockSize, blocks_per_seq, o.ctx);
  const Tensor qt(q.data(), DType::kF32, {tokens, o.hq, o.dk});
  const Tensor ot(out.data(), DType::kF32, {tokens, o.hq, o.dv});
  const float scale = 1.0f / std::sqrt(static_cast<float>(o.dk));
  // Keys seen: query i of a sequence (0-based among its `queries`) sees ctx - queries + i + 1.
  double macs = 0;
  for (int i = 0; i < queries; ++i) macs += o.ctx - queries + i + 1;
  *gflop = 2.0 * macs * seqs * o.hq * static_cast<double>(o.dk + o.dv) / 1e9;
  auto pass = [&] {
    for (int l = 0; l < o.layers; ++l) cpu.Attention(qt, kcs[l]->view, v_view(l), meta, scale, ot);
  };
  pass();  // warm-up
  double best = 1e30;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.seconds);
  int passes = 0;
  while (passes < 3 || std::chrono::steady_clock::now() < deadline) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    ++passes;
  }
  return best / o.layers;
}

int Run(Options o, DType dtype) {
  CpuBackend cpu(BackendOptions{.num_threads = o.threads});
  o.head_major = o.layout < 0 ? cpu.KvCacheHeadMajor() : o.layout == 1;
  const double peak = MeasureFmaPeakGflops(cpu.pool());
  const double bw = MeasureReadBandwidthGBs(cpu.pool(), size_t{512} << 20);
  std::printf(
      "threads=%d target=%s f32 FMA peak %.1f GFLOP/s, read bandwidth %.1f GB/s; Hq=%lld Hkv=%lld "
      "Dk=%lld Dv=%lld kv=%s%s (%s), %d layer(s)\n",
      o.threads, cpu::DispatchedTargetName(), peak, bw, static_cast<long long>(o.hq),
      static_cast<long long>(o.hkv), static_cast<long long>(o.dk), static_cast<long long>(o.dv),
      o.kv.c_str(), o.v_in_k ? " (values in the keys)" : "",
      o.head_major ? "head by head" : "slot by slot", o.layers);
  std::printf("%-8s %6s %6s %10s %9s %9s %9s %9s\n", "mode", "ctx", "batch", "time_us", "GFLOP/s",
              "peak_frac", "kv_GB/s", "bw_frac");
  double gflop = 0, bytes = 0;
  auto row = [&](const char* mode, int batch, double t) {
    std::printf("%-8s %6d %6d %10.1f %9.1f %9.2f %9.1f %9.2f\n", mode, o.ctx, batch, t * 1e6,
                gflop / t, gflop / t / peak, bytes / t / 1e9, bytes / t / 1e9 / bw);
  };
  if (o.mode != "decode") row("prefill", 1, TimeAttention(cpu, o, dtype, 1, o.ctx, &gflop, &bytes));
  if (o.mode != "prefill") {
    row("decode", o.batch, TimeAttention(cpu, o, dtype, o.batch, 1, &gflop, &bytes));
  }
  return 0;
}

}  // namespace
}  // namespace dh

namespace {
constexpr const char* kUsage =
    "usage: bench_attention [--threads N] [--hq N] [--hkv N] [--dk N] [--dv N] [--ctx N] "
    "[--batch N] [--kv f32|bf16|f8e4m3|i8] [--mode both|prefill|decode] [--v-in-k 0|1] "
    "[--seconds S] [--layers L] [--kv-layout head|slot]\n";
}  // namespace

int main(int argc, char** argv) {
  dh::Options o;
  bool ok = (argc - 1) % 2 == 0;
  for (int i = 1; ok && i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    const long long n = std::atoll(value);
    if (flag == "--threads") {
      o.threads = static_cast<int>(n);
    } else if (flag == "--hq") {
      o.hq = n;
    } else if (flag == "--hkv") {
      o.hkv = n;
    } else if (flag == "--dk") {
      o.dk = n;
    } else if (flag == "--dv") {
      o.dv = n;
    } else if (flag == "--ctx") {
      o.ctx = static_cast<int>(n);
    } else if (flag == "--batch") {
      o.batch = static_cast<int>(n);
    } else if (flag == "--kv") {
      o.kv = value;
    } else if (flag == "--v-in-k") {
      o.v_in_k = n != 0;
    } else if (flag == "--mode") {
      o.mode = value;
    } else if (flag == "--layers") {
      o.layers = static_cast<int>(n);
    } else if (flag == "--seconds") {
      o.seconds = std::atof(value);
    } else if (flag == "--kv-layout" &&
               (std::string(value) == "head" || std::string(value) == "slot")) {
      o.layout = std::string(value) == "head" ? 1 : 0;
    } else {
      ok = false;
    }
  }
  const dh::DType dtypes[] = {dh::DType::kF32, dh::DType::kBF16, dh::DType::kF8E4M3,
                              dh::DType::kI8};
  const dh::DType* dtype = std::find_if(std::begin(dtypes), std::end(dtypes),
                                        [&](dh::DType t) { return dh::DTypeName(t) == o.kv; });
  ok = ok && dtype != std::end(dtypes) && o.threads >= 1 && o.threads <= 256 && o.hq >= 1 &&
       o.hkv >= 1 && o.hq % o.hkv == 0 && o.hq <= 1024 && o.dk >= 1 && o.dk <= 4096 && o.dv >= 1 &&
       o.dv <= 4096 && (!o.v_in_k || o.dv <= o.dk) && o.ctx >= 1 && o.ctx <= 65536 &&
       o.batch >= 1 && o.batch <= 256 && o.seconds > 0 && o.layers >= 1 && o.layers <= 1024 &&
       (o.mode == "both" || o.mode == "prefill" || o.mode == "decode");
  if (!ok) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  return dh::Run(o, *dtype);
}
