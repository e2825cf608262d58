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

// Columns of x per i32 lane, and per 64-byte vector of codes.
int64_t LaneCols(bool int4) { return int4 ? 8 : 4; }
int64_t ChunkCols(bool int4) { return int4 ? 128 : 64; }

// How the weight scales map onto the 16 lanes of a chunk.
enum class ScaleMode { kOne, kPerChunk, kPermute };

ScaleMode ModeFor(bool int4, int64_t k, int64_t g) {
  if (g >= k) return ScaleMode::kOne;
  if (g % ChunkCols(int4) == 0) return ScaleMode::kPerChunk;
  return ScaleMode::kPermute;
}

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
namespace {

#define DH_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")))

// The first min(count, left) of the `count` (1, 2, 4, 8 or 16) f16 scales at s, widened, in the
// low lanes, with plain loads of 2-32 bytes (masked loads were slow on Zen 5); the other lanes
// are zero and never selected.
DH_VNNI_TARGET inline __m512 LoadScales(const uint16_t* s, int count, int64_t left) {
  __m128i h;
  if (left < count) {
    alignas(32) uint16_t t[16] = {};
    for (int64_t i = 0; i < left; ++i) t[i] = s[i];
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(t)));
  }
  switch (count) {
    case 1:
      h = _mm_cvtsi32_si128(s[0]);
      break;
    case 2: {
      int32_t v;
      std::memcpy(&v, s, 4);
      h = _mm_cvtsi32_si128(v);
      break;
    }
    case 4:
      h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s));
      break;
    case 8:
      h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
      break;
    default:
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  }
  return _mm512_cvtph_ps(_mm256_zextsi128_si256(h));
}

// sum over the n groups of min[g] * gsum[g], min[g] = -(zero nibble + offset) * scale[g]: the
// int4 zero-point term. z * scale is exact in f32 (at most 16 significant bits).
DH_VNNI_TARGET inline float DotMins(const uint16_t* s, const uint8_t* z, int offset,
                                    const float* gsum, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m512i off = _mm512_set1_epi32(offset);
  int64_t g = 0;
  for (; g + 16 <= n; g += 16) {
    const __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + g)));
    const __m128i zb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(z + g / 2));
    const __m128i nib =
        _mm_unpacklo_epi8(_mm_and_si128(zb, low4), _mm_and_si128(_mm_srli_epi16(zb, 4), low4));
    const __m512 zf = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_cvtepu8_epi32(nib), off));
    acc = _mm512_fmadd_ps(_mm512_mul_ps(zf, sc), _mm512_loadu_ps(gsum + g), acc);
  }
  float tail = 0.0f;
  for (; g < n; ++g) {
    const int zero = ZeroNibble(z, g) + offset;
    tail += static_cast<float>(zero) * _cvtsh_ss(s[g]) * gsum[g];
  }
  return -(_mm512_reduce_add_ps(acc) + tail);
}

// One 64-byte chunk of codes v (bytes [b, b + 64) of the row) times MR rows of quantized x, added
// to facc with the per-lane scales x_scale * wsl.
template <int MR, bool kInt4>
DH_VNNI_TARGET inline __attribute__((always_inline)) void Chunk(
    __m512i v, __m512 wsl, int64_t b, int64_t half, const uint8_t* const* xc,
    const float* const* xl, __m512* facc) {
  const int64_t lane0 = b / 4;
  if constexpr (kInt4) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i lo = _mm512_and_si512(v, low4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    for (int r = 0; r < MR; ++r) {
      __m512i acc =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xc[r] + b));
      acc = _mm512_dpbusd_epi32(acc, hi, _mm512_loadu_si512(xc[r] + half + b));
      const __m512 comb = _mm512_mul_ps(_mm512_loadu_ps(xl[r] + lane0), wsl);
      facc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), comb, facc[r]);
    }
  } else {
    // dot(x + 128, w) - 128 * sum(w): exact in i32.
    const __m512i corr = _mm512_slli_epi32(
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), v), 7);
    for (int r = 0; r < MR; ++r) {
      __m512i acc =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(xc[r] + b), v);
      acc = _mm512_sub_epi32(acc, corr);
      const __m512 comb = _mm512_mul_ps(_mm512_loadu_ps(xl[r] + lane0), wsl);
      facc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), comb, facc[r]);
    }
  }
}

// Output rows [n_begin, n_end) for x rows [r0, r0 + MR): each 64-byte vector of weight codes is
// loaded once and multiplied with the MR rows of quantized x. kMode: how weight scales map onto
// lanes (a template parameter so the chunk loop has no branches).
template <int MR, bool kInt4, ScaleMode kMode>
DH_VNNI_TARGET void DotRows(const QuantMatMulArgs& a, const QuantizedActs& x, int64_t r0,
                            int64_t n_begin, int64_t n_end) {
  const int64_t k = a.k, g = std::min(a.group_size, k);
  const int64_t row_len = kInt4 ? (k + 1) / 2 : k;  // bytes of codes per weight row
  const int64_t full = row_len / 64 * 64;
  constexpr int64_t kChunk = kInt4 ? 128 : 64, kLane = kInt4 ? 8 : 4;
  const int64_t ngroups = (k + g - 1) / g;
  const int per_chunk = kMode == ScaleMode::kPermute ? static_cast<int>(kChunk / g) : 1;
  const int64_t chunks_per_group = kMode == ScaleMode::kPerChunk ? g / kChunk : 1;
  alignas(64) int32_t idx_lanes[16];
  for (int i = 0; i < 16; ++i) {
    idx_lanes[i] = kMode == ScaleMode::kPermute ? static_cast<int32_t>(i * kLane / g) : 0;
  }
  const __m512i idx = _mm512_load_si512(idx_lanes);
  const int64_t half = x.row_bytes / 2;
  const uint8_t* xc[MR];
  const float* xl[MR];
  for (int r = 0; r < MR; ++r) {
    xc[r] = x.codes.data() + (r0 + r) * x.row_bytes;
    xl[r] = x.lane_scales.data() + (r0 + r) * x.lanes;
  }
  const uint8_t* qbase = static_cast<const uint8_t*>(a.q);
  for (int64_t j = n_begin; j < n_end; ++j) {
    const uint8_t* q = qbase + j * a.q_stride;
    const uint16_t* s = a.scales + j * a.scale_stride;
    __m512 facc[MR], facc2[MR];
    for (int r = 0; r < MR; ++r) facc[r] = facc2[r] = _mm512_setzero_ps();
    // Scales of the chunk at byte b; gi: group of its first column, advanced without divisions.
    int64_t gi = 0, chunk_in_group = 0;
    const __m512 one_scale = _mm512_set1_ps(_cvtsh_ss(s[0]));
    auto next_scales = [&]() DH_VNNI_TARGET {
      if constexpr (kMode == ScaleMode::kOne) {
        return one_scale;
      } else if constexpr (kMode == ScaleMode::kPerChunk) {
        const __m512 w = _mm512_set1_ps(_cvtsh_ss(s[gi]));
        if (++chunk_in_group == chunks_per_group) {
          chunk_in_group = 0;
          ++gi;
        }
        return w;
      } else {
        const __m512 w = _mm512_permutexvar_ps(idx, LoadScales(s + gi, per_chunk, ngroups - gi));
        gi += per_chunk;
        return w;
      }
    };
    int64_t b = 0;
    for (; b + 128 <= full; b += 128) {  // two chunks, two accumulator sets
      const __m512i v0 = _mm512_loadu_si512(q + b), v1 = _mm512_loadu_si512(q + b + 64);
      const __m512 w0 = next_scales();
      const __m512 w1 = next_scales();
      Chunk<MR, kInt4>(v0, w0, b, half, xc, xl, facc);
      Chunk<MR, kInt4>(v1, w1, b + 64, half, xc, xl, facc2);
    }
    if (b < full) {
      const __m512i v0 = _mm512_loadu_si512(q + b);
      Chunk<MR, kInt4>(v0, next_scales(), b, half, xc, xl, facc);
      b += 64;
    }
    if (b < row_len) {  // partial last chunk
      const __m512i v0 = _mm512_maskz_loadu_epi8((1ULL << (row_len - b)) - 1, q + b);
      Chunk<MR, kInt4>(v0, next_scales(), b, half, xc, xl, facc2);
    }
    const float bias = a.bias ? a.bias[j] : 0.0f;
    for (int r = 0; r < MR; ++r) {
      float sum = _mm512_reduce_add_ps(_mm512_add_ps(facc[r], facc2[r]));
      if constexpr (kInt4) {
        sum += DotMins(s, a.zeros + j * a.zero_stride, a.zero_offset,
                       x.group_sums.data() + (r0 + r) * x.groups, ngroups);
      }
      a.out[(r0 + r) * a.out_stride + j] = sum + bias;
    }
  }
}

template <int MR, bool kInt4>
void DotRowsAnyMode(const QuantMatMulArgs& a, const QuantizedActs& x, int64_t r0,
                    int64_t n_begin, int64_t n_end) {
  switch (ModeFor(kInt4, a.k, std::min(a.group_size, a.k))) {
    case ScaleMode::kOne: return DotRows<MR, kInt4, ScaleMode::kOne>(a, x, r0, n_begin, n_end);
    case ScaleMode::kPerChunk:
      return DotRows<MR, kInt4, ScaleMode::kPerChunk>(a, x, r0, n_begin, n_end);
    case ScaleMode::kPermute:
      return DotRows<MR, kInt4, ScaleMode::kPermute>(a, x, r0, n_begin, n_end);
  }
}

// All rows of x over weight rows [n_begin, n_end), in tiles of ~32 KiB of weight codes that
// stay in L1/L2 while every block of 4 x rows passes over them: a batch reads each weight byte
// from memory once.
template <bool kInt4>
void DotAll(const QuantMatMulArgs& a, const QuantizedActs& x, int64_t n_begin, int64_t n_end) {
  const int64_t row_bytes = std::max<int64_t>(1, kInt4 ? (a.k + 1) / 2 : a.k);
  const int64_t tile = a.m <= 4 ? n_end - n_begin : std::max<int64_t>(1, (32 << 10) / row_bytes);
  for (int64_t j0 = n_begin; j0 < n_end; j0 += tile) {
    const int64_t j1 = std::min(n_end, j0 + tile);
    int64_t r0 = 0;
    for (; r0 + 4 <= a.m; r0 += 4) DotRowsAnyMode<4, kInt4>(a, x, r0, j0, j1);
    switch (a.m - r0) {
      case 3: DotRowsAnyMode<3, kInt4>(a, x, r0, j0, j1); break;
      case 2: DotRowsAnyMode<2, kInt4>(a, x, r0, j0, j1); break;
      case 1: DotRowsAnyMode<1, kInt4>(a, x, r0, j0, j1); break;
      default: break;
    }
  }
}

}  // namespace
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
  if (a.int4) {
    DotAll<true>(a, acts, n_begin, n_end);
  } else {
    DotAll<false>(a, acts, n_begin, n_end);
  }
#endif
}

}  // namespace dh::cpu

#if defined(__x86_64__)
#pragma GCC diagnostic pop
#endif
