// AVX512-VNNI kernels for int8 / int4 weights (see quant_vnni.h for the numerics). The x86
// intrinsics live in functions compiled for AVX-512 + VNNI with a target attribute, so this file
// builds with the project's baseline flags on every host and the kernels run only where
// __builtin_cpu_supports says the CPU has them.
#include "backend/cpu/quant_vnni.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backend/cpu/quant_int256.h"
#include "backend/weight.h"
#include "base/check.h"

#if defined(__x86_64__)
// GCC 12 warns about the deliberately undefined pass-through operand inside its own AVX-512
// intrinsics (false positives reported at the inlining site).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace dh::cpu {
namespace {

// DH_INTEGER_DOT=on|off|auto|avx2|avxvnni|vnni512 (unset: auto) sets the starting mode and
// kernel: a diagnostic knob to run a whole model (perplexity, bench) on one path.
struct EnvChoice {
  IntegerDot mode = IntegerDot::kAuto;
  IntegerDotPath path = IntegerDotPath::kNone;
};

EnvChoice ChoiceFromEnv() {
  EnvChoice c;
  const char* v = std::getenv("DH_INTEGER_DOT");
  if (v == nullptr) return c;
  const std::string_view s(v);
  if (s == "on") {
    c.mode = IntegerDot::kOn;
  } else if (s == "off") {
    c.mode = IntegerDot::kOff;
  } else if (s == "avx2" || s == "avxvnni" || s == "vnni512") {
    c.mode = IntegerDot::kOn;
    c.path = s == "avx2" ? IntegerDotPath::kAvx2
                         : (s == "avxvnni" ? IntegerDotPath::kAvxVnni : IntegerDotPath::kVnni512);
  } else if (s != "auto" && !s.empty()) {
    std::fprintf(stderr,
                 "DH_INTEGER_DOT=%s: expected on, off, auto, avx2, avxvnni or vnni512; using "
                 "auto\n",
                 v);
  }
  return c;
}

const EnvChoice& StartChoice() {
  static const EnvChoice c = ChoiceFromEnv();
  return c;
}

std::atomic<IntegerDot> g_mode{StartChoice().mode};
std::atomic<IntegerDotPath> g_path{StartChoice().path};

constexpr int64_t kBlock = 32;  // x columns per quantization block

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Columns of x per i32 lane, and per 64-byte vector of codes (the widest kernel's).
int64_t LaneCols(bool int4) { return int4 ? 8 : 4; }
int64_t ChunkCols(bool int4) { return int4 ? 128 : 64; }

// Quantizes x[0..n) to int8 with one scale (max|x| / 127); returns the scale.
float QuantizeBlock(const float* x, int64_t n, int8_t* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (!(amax > 0.0f) || !std::isfinite(amax)) {
    // Zero block (or non-finite input, which the f32 path would propagate: keep it visible).
    for (int64_t i = 0; i < n; ++i) q[i] = 0;
    return amax > 0.0f ? amax : 0.0f;
  }
  const float inv = 127.0f / amax;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::nearbyint(x[i] * inv);
    q[i] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  return amax / 127.0f;
}

}  // namespace

void SetIntegerDotForTest(IntegerDot mode) { g_mode.store(mode); }

void SetIntegerDotPathForTest(IntegerDotPath path) { g_path.store(path); }

bool IntegerDotPathAvailable(IntegerDotPath path) {
#if defined(__x86_64__)
  switch (path) {
    case IntegerDotPath::kNone: return false;
    case IntegerDotPath::kAvx2: return CpuHasAvx2();
    case IntegerDotPath::kAvxVnni: return CpuHasAvxVnni();
    case IntegerDotPath::kVnni512: {
      static const bool ok = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni");
      }();
      return ok;
    }
  }
#else
  (void)path;
#endif
  return false;
}

IntegerDotPath BestIntegerDotPath() {
  for (IntegerDotPath p :
       {IntegerDotPath::kVnni512, IntegerDotPath::kAvxVnni, IntegerDotPath::kAvx2}) {
    if (IntegerDotPathAvailable(p)) return p;
  }
  return IntegerDotPath::kNone;
}

IntegerDotPath ActiveIntegerDotPath() {
  const IntegerDotPath forced = g_path.load(std::memory_order_relaxed);
  if (forced != IntegerDotPath::kNone && IntegerDotPathAvailable(forced)) return forced;
  if (forced != IntegerDotPath::kNone) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      std::fprintf(stderr, "integer dot: this CPU has no %s kernel; using %s\n",
                   IntegerDotPathName(forced), IntegerDotPathName(BestIntegerDotPath()));
    }
  }
  return BestIntegerDotPath();
}

const char* IntegerDotPathName(IntegerDotPath path) {
  switch (path) {
    case IntegerDotPath::kAvx2: return "avx2-maddubs";
    case IntegerDotPath::kAvxVnni: return "avxvnni256";
    case IntegerDotPath::kVnni512: return "vnni512";
    case IntegerDotPath::kNone: break;
  }
  return "none";
}

bool IntegerDotAvailable() { return BestIntegerDotPath() != IntegerDotPath::kNone; }

bool IntegerDotSupports(bool int4, int64_t k, int64_t group_size) {
  if (!QuantMatMulSupports(int4, k, group_size)) return false;
  const int64_t g = group_size, c = ChunkCols(int4);
  return g >= k || g % c == 0 || (c % g == 0 && g % LaneCols(int4) == 0);
}

bool UseIntegerDot(const QuantMatMulArgs& a) {
  const IntegerDot mode = g_mode.load(std::memory_order_relaxed);
  if (mode == IntegerDot::kOff || !IntegerDotAvailable()) return false;
  if (!IntegerDotSupports(a.int4, a.k, a.group_size) || a.m <= 0) return false;
  if (mode == IntegerDot::kOn) return true;
  // kAuto, from bench_quant on a Zen 5 (bench/README.md "Quantized decode kernels"): the integer
  // kernel was faster for int4 (both group sizes) and grouped int8 at every M <= 16, and for
  // per-row int8 at M >= 2; per-row int8 at M = 1 was as fast or faster with f32 products (one
  // scale per row leaves the f32 kernel little work), so it keeps them. Above M = 16 the rows
  // are dequantized for the dense GEMM.
  if (a.m > 16) return false;
  if (!a.int4 && a.group_size >= a.k && a.m == 1) return false;
  return true;
}

const char* IntegerDotName() { return IntegerDotPathName(ActiveIntegerDotPath()); }

void QuantizeActs(const QuantMatMulArgs& a, QuantizedActs* acts) {
  const int64_t k = a.k, m = a.m;
  const int64_t g = std::min(a.group_size, k);
  acts->m = m;
  // Per-thread scratch, grown once: no heap allocation per call once the shapes were seen.
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> bs;
  const int64_t nblocks = (k + kBlock - 1) / kBlock;
  q.resize(static_cast<size_t>(k));
  bs.resize(static_cast<size_t>(nblocks));
  if (!a.int4) {
    acts->row_bytes = RoundUp(k, 64);
    acts->lanes = acts->row_bytes / 4;
    acts->groups = 0;
  } else {
    acts->row_bytes = 2 * RoundUp((k + 1) / 2, 64);
    acts->lanes = acts->row_bytes / 2 / 4;
    acts->groups = (k + g - 1) / g;
  }
  acts->codes.assign(static_cast<size_t>(m * acts->row_bytes), a.int4 ? 0 : 128);
  acts->lane_scales.assign(static_cast<size_t>(m * acts->lanes), 0.0f);
  acts->group_sums.assign(static_cast<size_t>(m * acts->groups), 0.0f);
  const int64_t lc = LaneCols(a.int4);
  for (int64_t r = 0; r < m; ++r) {
    const float* x = a.x + r * a.x_stride;
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t c0 = b * kBlock;
      bs[b] = QuantizeBlock(x + c0, std::min(kBlock, k - c0), q.data() + c0);
    }
    uint8_t* codes = acts->codes.data() + r * acts->row_bytes;
    if (!a.int4) {
      for (int64_t c = 0; c < k; ++c) codes[c] = static_cast<uint8_t>(q[c] + 128);
    } else {
      const int64_t half = acts->row_bytes / 2;
      for (int64_t c = 0; c < k; ++c) codes[(c & 1) * half + c / 2] = static_cast<uint8_t>(q[c]);
      float* gs = acts->group_sums.data() + r * acts->groups;
      for (int64_t c = 0; c < k; ++c) gs[c / g] += x[c];
    }
    float* ls = acts->lane_scales.data() + r * acts->lanes;
    for (int64_t l = 0; l < acts->lanes; ++l) {
      const int64_t b = l * lc / kBlock;
      ls[l] = b < nblocks ? bs[b] : 0.0f;
    }
  }
}

#if defined(__x86_64__)
#define DH_IDOT_BITS 512
#define DH_IDOT_VNNI 1
#define DH_IDOT_NS vnni512_kernels
#define DH_IDOT_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")))
namespace {
#include "backend/cpu/quant_int_dot-inl.h"  // NOLINT(build/include)
}  // namespace
#undef DH_IDOT_BITS
#undef DH_IDOT_VNNI
#undef DH_IDOT_NS
#undef DH_IDOT_TARGET
#endif  // __x86_64__

void IntegerDotRange(const QuantMatMulArgs& a, const QuantizedActs& acts, int64_t n_begin,
                     int64_t n_end) {
  IntegerDotRangeOn(ActiveIntegerDotPath(), a, acts, n_begin, n_end);
}

void IntegerDotRangeOn(IntegerDotPath path, const QuantMatMulArgs& a, const QuantizedActs& acts,
                       int64_t n_begin, int64_t n_end) {
  DH_CHECK(IntegerDotPathAvailable(path) && IntegerDotSupports(a.int4, a.k, a.group_size) &&
               acts.m == a.m,
           "integer dot {}: {} k={} group={} m={} (prepared for m={})", IntegerDotPathName(path),
           a.int4 ? "int4" : "int8", a.k, a.group_size, a.m, acts.m);
  if (n_begin >= n_end || a.m <= 0) return;
  if (path != IntegerDotPath::kVnni512) {
    return IntegerDot256Range(path == IntegerDotPath::kAvxVnni, a, acts, n_begin, n_end);
  }
#if defined(__x86_64__)
  if (a.int4) return vnni512_kernels::DotAll<true>(a, acts, n_begin, n_end);
  vnni512_kernels::DotAll<false>(a, acts, n_begin, n_end);
#endif
}

}  // namespace dh::cpu

#if defined(__x86_64__)
#pragma GCC diagnostic pop
#endif
