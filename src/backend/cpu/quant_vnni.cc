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
#include <limits>
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

// Defaults of PackedMinRows (bench/README.md "Packed integer tiles"): on 512 bits the packed
// tiles won from 8 rows of x in the whole model; the 256-bit ones (8 weight rows per vector)
// lost to the per-row kernel at 8-16 rows and won from 64.
constexpr int64_t kPackedMinRows512 = 8;
constexpr int64_t kPackedMinRows256 = 32;
// Over prepacked weights on 512 bits (bench_quant --threads 2, 8960 x 1536 from memory, two
// rounds, bench/README.md "Zen 5, session 18"): int4 tiles against the per-row kernel at M = 3
// 254-161 against 274-210 us, at M = 1 155-186 against 136-179 (and slower in whole-model
// decode: V2-Lite 4 layers 107-109 against 125 tokens/s); int8 tiles at M = 3-4 lost one round
// and won the other, from M = 5 won both (489-502 against 545-711 us). int4 tiles from one row,
// tried again in session 22: Qwen2-1.5B int4 decode 43.6 against 48.2 tokens/s (medians of six).
constexpr int64_t kPrepackedMinRowsInt4 = 3;
constexpr int64_t kPrepackedMinRowsInt8 = 5;
std::atomic<int64_t> g_packed_min_rows{0};  // 0: the defaults

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

int64_t PackedMinRows() {
  const int64_t forced = g_packed_min_rows.load(std::memory_order_relaxed);
  if (forced > 0) return forced;
  return ActiveIntegerDotPath() == IntegerDotPath::kVnni512 ? kPackedMinRows512
                                                           : kPackedMinRows256;
}

// int8 from 5 rows on every kernel: over prepacked tiles (no packing per call) the 256-bit
// kernels too beat their per-row kernel from 5 rows (AVX-VNNI) or 6 (AVX2; at 5 its tiles tied
// or lost up to 7 %, one threshold kept): bench_quant --threads 2, 8960 x 1536 from memory, two
// rounds, bench/README.md "Zen 5, session 37": AVX2 M = 5 880-951 against 824-951 us, M = 6
// 896-978 against 977-1076; AVX-VNNI M = 5 692-777 against 790-872.
int64_t PrepackedMinRows(bool int4) {
  if (g_packed_min_rows.load(std::memory_order_relaxed) > 0) return PackedMinRows();
  if (int4) return kPrepackedMinRowsInt4;
  return kPrepackedMinRowsInt8;
}

void SetPackedMinRowsForTest(int64_t rows) { g_packed_min_rows.store(rows > 0 ? rows : 0); }

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
  return AutoPrefersIntegerDot(a, ActiveIntegerDotPath(), CpuHalfWidthVectorUnits());
}

bool AutoPrefersIntegerDot(const QuantMatMulArgs& a, IntegerDotPath path, bool half_width) {
  // kAuto, from bench_quant on a Zen 5 (bench/README.md "Quantized decode kernels"): the integer
  // kernel was faster for int4 (both group sizes) and grouped int8 at every M <= 16, and for
  // per-row int8 at M >= 2; per-row int8 at M = 1 was as fast or faster with f32 products (one
  // scale per row leaves the f32 kernel little work), so it keeps them. Above M = 16 (prefill)
  // the packed tiles run int8 and int4 2-3x faster than the dense GEMM over dequantized rows
  // (bench/README.md "Packed integer tiles").
  if (!a.int4 && a.group_size >= a.k && a.m == 1) return false;
  // int8 from PackedMinRows() rows on the AVX2 kernel of a CPU with 128-bit vector units (Zen 1,
  // docs/kernels.md): vpmaddubsw + vpmaddwd run on one pipe there, the f32 FMAs on two, and the
  // dense GEMM over dequantized rows (exact in x) was as fast or faster (M = 256 14.5-16.1
  // against 15.3-19.7 ms). int4 stays integer (10.9-15.6 against 15.6-25.3 ms: the f32 path
  // widens twice the weights per byte), and so does int8 at fewer rows (M = 8 0.65 against 0.93).
  if (!a.int4 && half_width && path == IntegerDotPath::kAvx2 && a.m >= PackedMinRows()) {
    return false;
  }
  return true;
}

const char* IntegerDotName() { return IntegerDotPathName(ActiveIntegerDotPath()); }

#if defined(__x86_64__)
#define DH_QA_TARGET __attribute__((target("avx2,fma")))
namespace {

// max|x| over the 32 columns at x, per lane of 8 (a NaN lane keeps the running maximum, as
// QuantizeBlock's std::max does).
DH_QA_TARGET inline __m256 BlockAbsMax(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    amax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)), amax);
  }
  return amax;
}

// The 32 codes nearbyint(x * inv), clamped to [-127, 127], as 32 bytes in column order.
DH_QA_TARGET inline __m256i CodeBlock32(const float* x, __m256 inv) {
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i q[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), inv),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
  }
  // packs works within 128-bit halves: the bytes come out as columns 0-3 8-11 16-19 24-27
  // 4-7 12-15 20-23 28-31 (in 4-byte units); one dword permute puts them in order.
  const __m256i w = _mm256_packs_epi32(q[0], q[1]), w2 = _mm256_packs_epi32(q[2], q[3]);
  const __m256i b = _mm256_packs_epi16(w, w2);
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Whether a block whose max|x| is a takes codes: a zero block (or non-finite input, which the
// f32 path would propagate: kept visible as the scale) gets zero codes and scale
// ZeroBlockScale(a) instead.
inline bool CodedBlock(float a) { return a > 0.0f && std::isfinite(a); }
inline float ZeroBlockScale(float a) { return a > 0.0f ? a : 0.0f; }

// QuantizeBlock for a full block of 32 columns in AVX2 (every integer-dot path has it), with
// the same f32 arithmetic: the same scale, and nearbyint's round-to-nearest-even on x * inv.
// The codes come back as 32 bytes in column order.
DH_QA_TARGET float QuantizeBlock32(const float* x, __m256i* codes) {
  const __m256 amax = BlockAbsMax(x);
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float a = _mm_cvtss_f32(m4);
  if (!CodedBlock(a)) {
    *codes = _mm256_setzero_si256();
    return ZeroBlockScale(a);
  }
  *codes = CodeBlock32(x, _mm256_set1_ps(127.0f / a));
  return a / 127.0f;
}

// Per 128-bit half: [max(a0, a1), max(a2, a3), max(b0, b1), max(b2, b3)].
DH_QA_TARGET inline __m256 PairMax(__m256 a, __m256 b) {
  return _mm256_max_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xdd));
}

// QuantizeBlock32 over the 8 full blocks at x (256 columns): the same maxima, scales and codes,
// but the 8 maxima reduced together (pairwise lane maxima of two vectors at a time, no
// per-block horizontal reduction) and 127 / max and max / 127 formed by one vector division
// each instead of two scalar ones per block. scales[b] gets block b's scale, codes[b] its codes.
DH_QA_TARGET void QuantizeBlocks8(const float* x, float* scales, __m256i* codes) {
  // No input lane of PairMax is NaN (BlockAbsMax skips them), so the order of the maxima does
  // not matter.
  __m256 m[8];
#pragma GCC unroll 8
  for (int b = 0; b < 8; ++b) m[b] = BlockAbsMax(x + 32 * b);
  // Per half, lane j of q0 is block j's maximum over that half's lanes (blocks 4-7 in q1).
  const __m256 q0 = PairMax(PairMax(m[0], m[1]), PairMax(m[2], m[3]));
  const __m256 q1 = PairMax(PairMax(m[4], m[5]), PairMax(m[6], m[7]));
  const __m256 amax = _mm256_max_ps(_mm256_permute2f128_ps(q0, q1, 0x20),
                                    _mm256_permute2f128_ps(q0, q1, 0x31));
  alignas(32) float a[8], inv[8], scale[8];
  _mm256_store_ps(a, amax);
  _mm256_store_ps(inv, _mm256_div_ps(_mm256_set1_ps(127.0f), amax));
  _mm256_store_ps(scale, _mm256_div_ps(amax, _mm256_set1_ps(127.0f)));
  for (int b = 0; b < 8; ++b) {
    if (!CodedBlock(a[b])) {
      codes[b] = _mm256_setzero_si256();
      scales[b] = ZeroBlockScale(a[b]);
      continue;
    }
    codes[b] = CodeBlock32(x + 32 * b, _mm256_set1_ps(inv[b]));
    scales[b] = scale[b];
  }
}

// The even columns' codes of a block of 32 into `even` (16 bytes) and the odd ones' into `odd`.
DH_QA_TARGET void StoreEvenOdd(__m256i codes, uint8_t* even, uint8_t* odd) {
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2,
                                         4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m256i s = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(codes, split), 0xd8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(even), _mm256_castsi256_si128(s));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(odd), _mm256_extracti128_si256(s, 1));
}

// Sum of x[0..n), n a multiple of 8, in eight partial sums.
DH_QA_TARGET float Sum8(const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// One row of QuantizeActs: full blocks in AVX2, the last partial block in scalar code.
DH_QA_TARGET void QuantizeRowAvx2(const float* x, int64_t k, int64_t g, bool int4, int64_t half,
                                  int int8_offset, uint8_t* codes, float* bs, float* gs,
                                  int8_t* tail) {
  const int64_t full = k / kBlock;
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(int8_offset));
  auto store = [&](int64_t b, __m256i q) DH_QA_TARGET {
    if (int4) {
      StoreEvenOdd(q, codes + b * kBlock / 2, codes + half + b * kBlock / 2);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + b * kBlock),
                          _mm256_xor_si256(q, bias));  // q + 128 (mod 256) = q ^ 0x80; offset 0: q
    }
  };
  int64_t b = 0;
  for (; b + 8 <= full; b += 8) {
    __m256i q[8];
    QuantizeBlocks8(x + b * kBlock, bs + b, q);
    for (int i = 0; i < 8; ++i) store(b + i, q[i]);
  }
  for (; b < full; ++b) {
    __m256i q;
    bs[b] = QuantizeBlock32(x + b * kBlock, &q);
    store(b, q);
  }
  const int64_t c0 = full * kBlock;
  if (c0 < k) {
    bs[full] = QuantizeBlock(x + c0, k - c0, tail);
    for (int64_t c = c0; c < k; ++c) {
      const int8_t v = tail[c - c0];
      if (int4) {
        codes[(c & 1) * half + c / 2] = static_cast<uint8_t>(v);
      } else {
        codes[c] = static_cast<uint8_t>(v + int8_offset);
      }
    }
  }
  if (!int4) return;
  for (int64_t c = 0, gi = 0; c < k; c += g, ++gi) {
    const int64_t n = std::min(g, k - c);
    const int64_t n8 = n / 8 * 8;
    float sum = n8 > 0 ? Sum8(x + c, n8) : 0.0f;
    for (int64_t i = n8; i < n; ++i) sum += x[c + i];
    gs[gi] = sum;
  }
}

}  // namespace
#endif  // __x86_64__

namespace {

// Whether kernel `path` takes x's codes signed (QuantizedActs::int8_signed): int8 weights on the
// AVX2 kernel, whose vpsignb wants x as q; vpdpbusd (the VNNI kernels) wants q + 128.
bool TakesSignedX(bool int4, IntegerDotPath path) { return !int4 && path == IntegerDotPath::kAvx2; }

// The byte that stores x code 0 (and so pads rows): 128 for int8 weights' offset codes, 0 for
// int4's and for int8's where the kernel takes them signed. int8 codes are q + this.
int ZeroCode(bool int4, const QuantizedActs& acts) { return int4 || acts.int8_signed ? 0 : 128; }

// Row x of a in the by-rows layout: codes (row_bytes, padding included; int8: q + int8_offset),
// one scale per block of 32 columns into bs, int4 group sums into gs; q: k bytes of scratch.
void QuantizeRow(const QuantMatMulArgs& a, const float* x, int64_t row_bytes, int64_t groups,
                 int int8_offset, uint8_t* codes, float* bs, float* gs, int8_t* q) {
  const int64_t k = a.k, g = std::min(a.group_size, k);
  const int64_t nblocks = (k + kBlock - 1) / kBlock;
  const int64_t half = row_bytes / 2;
  if (!a.int4) {
    std::memset(codes + k, int8_offset, static_cast<size_t>(row_bytes - k));
  } else {  // even columns [0, k) take bytes [0, (k + 1) / 2), odd ones half + [0, k / 2)
    std::memset(codes + (k + 1) / 2, 0, static_cast<size_t>(half - (k + 1) / 2));
    std::memset(codes + half + k / 2, 0, static_cast<size_t>(half - k / 2));
    std::fill(gs, gs + groups, 0.0f);
  }
#if defined(__x86_64__)
  if (CpuHasAvx2()) {
    return QuantizeRowAvx2(x, k, g, a.int4, half, int8_offset, codes, bs, gs, q);
  }
#endif
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t c0 = b * kBlock;
    bs[b] = QuantizeBlock(x + c0, std::min(kBlock, k - c0), q + c0);
  }
  if (!a.int4) {
    for (int64_t c = 0; c < k; ++c) codes[c] = static_cast<uint8_t>(q[c] + int8_offset);
  } else {
    for (int64_t c = 0; c < k; ++c) codes[(c & 1) * half + c / 2] = static_cast<uint8_t>(q[c]);
    for (int64_t c = 0; c < k; ++c) gs[c / g] += x[c];
  }
}

// Quad `quad` (rows 4 * quad .. + 3; padding rows past a.m: zero) of the packed layout: each row
// quantized by rows into this thread's scratch, then block by block the 8 x 4 dwords of the
// quad's rows transposed into the packed order (dword d of lane l at (b * 8 + d) * 16 + 4 * l),
// and the block scales and group sums dealt out by lane.
void PackQuad(const QuantMatMulArgs& a, int64_t quad, QuantizedActs* acts) {
  const int64_t nblocks = acts->blocks, row_bytes = acts->row_bytes, half = row_bytes / 2;
  const int64_t groups = acts->groups;
  thread_local std::vector<uint8_t> rows;
  thread_local std::vector<float> bs, gs;
  thread_local std::vector<int8_t> q;
  rows.resize(static_cast<size_t>(4 * row_bytes));
  bs.resize(static_cast<size_t>(4 * nblocks));
  gs.resize(static_cast<size_t>(4 * groups));
  q.resize(static_cast<size_t>(a.k));
  for (int64_t lane = 0; lane < 4; ++lane) {
    const int64_t r = quad * 4 + lane;
    uint8_t* row = rows.data() + lane * row_bytes;
    if (r < a.m) {
      QuantizeRow(a, a.x + r * a.x_stride, row_bytes, groups, ZeroCode(a.int4, *acts), row,
                  bs.data() + lane * nblocks, gs.data() + lane * groups, q.data());
    } else {
      std::memset(row, ZeroCode(a.int4, *acts), static_cast<size_t>(row_bytes));
      std::fill_n(bs.data() + lane * nblocks, nblocks, 0.0f);
      std::fill_n(gs.data() + lane * groups, groups, 0.0f);
    }
  }
  uint8_t* dst = acts->codes.data() + quad * nblocks * 128;
  for (int64_t b = 0; b < nblocks; ++b) {
    uint8_t* out = dst + b * 128;
#if defined(__x86_64__)
    // Per lane, dwords 0-3 and 4-7 as two SSE vectors, then two 4 x 4 transposes.
    __m128i lo[4], hi[4];
    for (int64_t lane = 0; lane < 4; ++lane) {
      const uint8_t* row = rows.data() + lane * row_bytes;
      if (a.int4) {
        const __m128i even = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * 16));
        const __m128i odd =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + half + b * 16));
        lo[lane] = _mm_unpacklo_epi32(even, odd);
        hi[lane] = _mm_unpackhi_epi32(even, odd);
      } else {
        lo[lane] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * 32));
        hi[lane] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * 32 + 16));
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m128i* v = h == 0 ? lo : hi;
      const __m128i t0 = _mm_unpacklo_epi32(v[0], v[1]), t1 = _mm_unpacklo_epi32(v[2], v[3]);
      const __m128i t2 = _mm_unpackhi_epi32(v[0], v[1]), t3 = _mm_unpackhi_epi32(v[2], v[3]);
      __m128i* o = reinterpret_cast<__m128i*>(out + h * 64);
      _mm_storeu_si128(o + 0, _mm_unpacklo_epi64(t0, t1));
      _mm_storeu_si128(o + 1, _mm_unpackhi_epi64(t0, t1));
      _mm_storeu_si128(o + 2, _mm_unpacklo_epi64(t2, t3));
      _mm_storeu_si128(o + 3, _mm_unpackhi_epi64(t2, t3));
    }
#else
    for (int64_t lane = 0; lane < 4; ++lane) {
      const uint8_t* row = rows.data() + lane * row_bytes;
      for (int64_t d = 0; d < 8; ++d) {
        // int8: columns 4d..4d+3; int4: even columns' bytes for even d, odd ones' for odd d.
        const int64_t src = a.int4 ? (d & 1) * half + b * 16 + (d >> 1) * 4 : b * 32 + d * 4;
        std::memcpy(out + d * 16 + lane * 4, row + src, 4);
      }
    }
#endif
    for (int64_t lane = 0; lane < 4; ++lane) {
      acts->lane_scales[(quad * nblocks + b) * 4 + lane] = bs[lane * nblocks + b];
    }
  }
  for (int64_t gi = 0; gi < groups; ++gi) {
    for (int64_t lane = 0; lane < 4; ++lane) {
      acts->group_sums[(quad * groups + gi) * 4 + lane] = gs[lane * groups + gi];
    }
  }
}

}  // namespace

bool PackedTilesSupport(int64_t k, int64_t group_size) {
  return group_size >= k || group_size % kBlock == 0;
}

bool PrepackWanted(bool int4, int64_t k) {
  static const bool off = [] {
    const char* v = std::getenv("DH_PREPACKED_TILES");
    return v != nullptr && std::string_view(v) == "off";
  }();
  if (off || StartChoice().mode == IntegerDot::kOff) return false;
  switch (ActiveIntegerDotPath()) {
    case IntegerDotPath::kVnni512: return true;
    case IntegerDotPath::kAvx2:
    case IntegerDotPath::kAvxVnni:
      // int8 weights held twice, as on vnni512 (rows for 1-4 rows of x, tiles from 5); int4
      // weights' tiles serve every row count (their rows are then released).
      return (!int4 || FewRowsTakeTiles(ActiveIntegerDotPath(), int4, k)) &&
             !CpuHalfWidthVectorUnits();
    case IntegerDotPath::kNone: break;
  }
  return false;
}

bool PrepackSupports(bool int4, int64_t k, int64_t group_size) {
  return QuantMatMulSupports(int4, k, group_size) && PackedTilesSupport(k, group_size) &&
         IntegerDotSupports(int4, k, group_size);
}

size_t PrepackedBytes(bool int4, int64_t n, int64_t k, int64_t group_size) {
  if (n <= 0 || k <= 0 || group_size <= 0 || k > (int64_t{1} << 40)) return 0;
  const int64_t tiles = (n + kPrepackedRows - 1) / kPrepackedRows;
  const int64_t tile_bytes = PrepackedLayoutOf(int4, k, group_size).tile_bytes;
  if (tiles > std::numeric_limits<int64_t>::max() / tile_bytes) return 0;
  return static_cast<size_t>(tiles * tile_bytes);
}

// PrepackTileCodes of the 512-bit kernels (defined below, after they are included); 0 steps
// where the CPU lacks them.
int64_t PrepackTileCodes512(const uint8_t* q0, int64_t q_stride, int64_t row_bytes,
                            int32_t* codes);

void PrepackTiles(const QuantMatMulArgs& a, int64_t n, int64_t tile_begin, int64_t tile_end,
                  uint8_t* dst) {
  const PrepackedLayout l = PrepackedLayoutOf(a.int4, a.k, a.group_size);
  const int64_t row_bytes = a.int4 ? (a.k + 1) / 2 : a.k;
  const int64_t block_bytes = l.steps_per_block * 4;  // of one row
  const auto* q = static_cast<const uint8_t*>(a.q);
  const auto transpose = IntegerDotPathAvailable(IntegerDotPath::kVnni512) ? PrepackTileCodes512
                                                                           : PrepackTileCodes256;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    uint8_t* tile = dst + t * l.tile_bytes;
    std::memset(tile, 0, static_cast<size_t>(l.tile_bytes));
    auto* codes = reinterpret_cast<uint32_t*>(tile);
    auto* scales = reinterpret_cast<uint16_t*>(tile + l.scale_offset);
    uint8_t* extra = tile + l.extra_offset;
    // Whole tiles' codes by dword transposes (16 x 16 where the CPU has AVX-512, 8 x 8 with
    // AVX2), the rest (a last partial tile, a row's last bytes; every tile without AVX2) dword
    // by dword.
    int64_t done = 0;
    if ((t + 1) * kPrepackedRows <= n) {
      done = transpose(q + t * kPrepackedRows * a.q_stride, a.q_stride, row_bytes,
                       reinterpret_cast<int32_t*>(codes));
    }
    for (int64_t i = 0; i < kPrepackedRows && t * kPrepackedRows + i < n; ++i) {
      const int64_t j = t * kPrepackedRows + i;
      const uint8_t* row = q + j * a.q_stride;
      for (int64_t s = done; 4 * s < row_bytes; ++s) {
        uint8_t bytes[4] = {};
        std::memcpy(bytes, row + 4 * s, static_cast<size_t>(std::min<int64_t>(4, row_bytes - 4 * s)));
        std::memcpy(codes + s * kPrepackedRows + i, bytes, 4);
      }
      for (int64_t gi = 0; gi < l.groups; ++gi) {
        scales[gi * kPrepackedRows + i] = a.scales[j * a.scale_stride + gi];
        if (a.int4) {
          const int z = ZeroNibble(a.zeros + j * a.zero_stride, gi);
          extra[gi * (kPrepackedRows / 2) + i / 2] |= static_cast<uint8_t>(z << ((i & 1) * 4));
        }
      }
      if (!a.int4) {
        for (int64_t b = 0; b < l.blocks; ++b) {
          int32_t sum = 0;
          for (int64_t c = b * block_bytes; c < (b + 1) * block_bytes && c < row_bytes; ++c) {
            sum += static_cast<int8_t>(row[c]);
          }
          const int32_t corr = -128 * sum;
          std::memcpy(extra + (b * kPrepackedRows + i) * 4, &corr, 4);
        }
      }
    }
  }
}

void UnpackTiles(const QuantMatMulArgs& a, int64_t n, int64_t tile_begin, int64_t tile_end) {
  const PrepackedLayout l = PrepackedLayoutOf(a.int4, a.k, a.group_size);
  const int64_t row_bytes = a.int4 ? (a.k + 1) / 2 : a.k;
  auto* q = static_cast<uint8_t*>(const_cast<void*>(a.q));
  auto* scales = const_cast<uint16_t*>(a.scales);
  auto* zeros = const_cast<uint8_t*>(a.zeros);
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile = a.tiles + t * l.tile_bytes;
    const auto* codes = reinterpret_cast<const uint32_t*>(tile);
    const auto* h = reinterpret_cast<const uint16_t*>(tile + l.scale_offset);
    const uint8_t* z = tile + l.extra_offset;
    for (int64_t i = 0; i < kPrepackedRows && t * kPrepackedRows + i < n; ++i) {
      const int64_t j = t * kPrepackedRows + i;
      uint8_t* row = q + j * a.q_stride;
      for (int64_t s = 0; 4 * s < row_bytes; ++s) {
        std::memcpy(row + 4 * s, codes + s * kPrepackedRows + i,
                    static_cast<size_t>(std::min<int64_t>(4, row_bytes - 4 * s)));
      }
      for (int64_t gi = 0; gi < l.groups; ++gi) {
        scales[j * a.scale_stride + gi] = h[gi * kPrepackedRows + i];
      }
      if (a.int4) {
        uint8_t* zrow = zeros + j * a.zero_stride;
        std::memset(zrow, 0, static_cast<size_t>((l.groups + 1) / 2));
        for (int64_t gi = 0; gi < l.groups; ++gi) {
          const int nib = (z[gi * (kPrepackedRows / 2) + i / 2] >> ((i & 1) * 4)) & 15;
          zrow[gi / 2] |= static_cast<uint8_t>(nib << ((gi & 1) * 4));
        }
      }
    }
  }
}

void QuantizeActs(const QuantMatMulArgs& a, QuantizedActs* acts, ThreadPool* pool,
                  IntegerDotPath path) {
  const int64_t k = a.k, m = a.m;
  const int64_t g = std::min(a.group_size, k);
  acts->m = m;
  if (path == IntegerDotPath::kNone) path = ActiveIntegerDotPath();
  acts->int8_signed = TakesSignedX(a.int4, path);
  acts->packed = (m >= (a.tiles != nullptr ? PrepackedMinRows(a.int4) : PackedMinRows())) &&
                 PackedTilesSupport(k, a.group_size);
  // Per-thread scratch, grown once: no heap allocation per call once the shapes were seen.
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> bs;
  const int64_t nblocks = (k + kBlock - 1) / kBlock;
  q.resize(static_cast<size_t>(k));
  bs.resize(static_cast<size_t>(nblocks));
  acts->blocks = nblocks;
  if (!a.int4) {
    acts->row_bytes = RoundUp(k, 64);
    acts->lanes = acts->row_bytes / 4;
    acts->groups = 0;
  } else {
    acts->row_bytes = 2 * RoundUp((k + 1) / 2, 64);
    acts->lanes = acts->row_bytes / 2 / 4;
    acts->groups = (k + g - 1) / g;
  }
  if (acts->packed) {
    const int64_t quads = (m + 3) / 4;
    acts->codes.resize(static_cast<size_t>(quads * nblocks * 128));
    acts->lane_scales.resize(static_cast<size_t>(quads * nblocks * 4));
    acts->group_sums.resize(static_cast<size_t>(quads * acts->groups * 4));
    auto quantize_quads = [&](size_t q_begin, size_t q_end) {
      for (size_t qd = q_begin; qd < q_end; ++qd) PackQuad(a, static_cast<int64_t>(qd), acts);
    };
    if (pool != nullptr && m * k >= (int64_t{1} << 16)) {
      pool->ParallelFor(static_cast<size_t>(quads), 1, quantize_quads);
    } else {
      quantize_quads(0, static_cast<size_t>(quads));
    }
    return;
  }
  // resize() keeps the last call's contents: every element is written below (codes: columns
  // [0, k) by the quantizer, the padding here; lane scales and group sums in full).
  acts->codes.resize(static_cast<size_t>(m * acts->row_bytes));
  acts->lane_scales.resize(static_cast<size_t>(m * acts->lanes));
  acts->group_sums.resize(static_cast<size_t>(m * acts->groups));
  acts->block_scales.resize(static_cast<size_t>(m * nblocks));
  const int64_t lanes_per_block = kBlock / LaneCols(a.int4);
  for (int64_t r = 0; r < m; ++r) {
    QuantizeRow(a, a.x + r * a.x_stride, acts->row_bytes, acts->groups, ZeroCode(a.int4, *acts),
                acts->codes.data() + r * acts->row_bytes, bs.data(),
                acts->group_sums.data() + r * acts->groups, q.data());
    // Lane l holds block l / lanes_per_block's scale (4 or 8 lanes per block), 0 past the last.
    float* ls = acts->lane_scales.data() + r * acts->lanes;
    for (int64_t b = 0; b < nblocks; ++b) {
      float* dst = ls + b * lanes_per_block;
      for (int64_t i = 0; i < lanes_per_block; ++i) dst[i] = bs[b];
    }
    std::fill(ls + nblocks * lanes_per_block, ls + acts->lanes, 0.0f);
    std::copy(bs.begin(), bs.begin() + nblocks, acts->block_scales.begin() + r * nblocks);
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

int64_t PrepackTileCodes512(const uint8_t* q0, int64_t q_stride, int64_t row_bytes,
                            int32_t* codes) {
#if defined(__x86_64__)
  if (IntegerDotPathAvailable(IntegerDotPath::kVnni512)) {
    return vnni512_kernels::PrepackTileCodes(q0, q_stride, row_bytes, codes);
  }
#endif
  return 0;
}

bool ReadsPrepackedTiles(const QuantMatMulArgs& a) {
  // x packed (QuantizeActs), or by rows.
  return a.tiles != nullptr &&
         ((a.m >= PrepackedMinRows(a.int4) && PackedTilesSupport(a.k, a.group_size)) ||
          FewRowsReadTiles(ActiveIntegerDotPath(), a));
}

void IntegerDotRange(const QuantMatMulArgs& a, const QuantizedActs& acts, int64_t n_begin,
                     int64_t n_end) {
  IntegerDotRangeOn(ActiveIntegerDotPath(), a, acts, n_begin, n_end);
}

void IntegerDotRangeOn(IntegerDotPath path, const QuantMatMulArgs& a, const QuantizedActs& acts,
                       int64_t n_begin, int64_t n_end) {
  DH_CHECK(IntegerDotPathAvailable(path) && IntegerDotSupports(a.int4, a.k, a.group_size) &&
               acts.m == a.m && acts.int8_signed == TakesSignedX(a.int4, path),
           "integer dot {}: {} k={} group={} m={} (prepared for m={}, {} x codes)",
           IntegerDotPathName(path), a.int4 ? "int4" : "int8", a.k, a.group_size, a.m, acts.m,
           acts.int8_signed ? "signed" : "offset");
  if (n_begin >= n_end || a.m <= 0) return;
  const bool tiles = a.tiles != nullptr && (acts.packed || FewRowsReadTiles(path, a));
  DH_CHECK(!tiles || n_begin % kPrepackedRows == 0, "prepacked tiles start at row {}", n_begin);
  DH_CHECK(tiles || a.q != nullptr, "integer dot {}: the weight's rows were released (only its "
           "prepacked tiles remain)", IntegerDotPathName(path));
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
