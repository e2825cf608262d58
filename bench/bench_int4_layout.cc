// What the byte order of int4 codes costs the one-row AVX2 integer kernel (decode), one thread,
// weights in L2. Three stand-alone loops compute the same dots of int4 weights (groups of 32, f16
// scales, 4-bit zero points) with int8 x, and must agree:
//   per-chunk  the layout every backend reads (weight.h: each group's 16 code bytes in column
//              order) and the AVX2 kernel's arithmetic before session 15: per 32-byte chunk (two
//              groups) two vpmaddubsw, one vpmaddwd, one conversion, one scale pick, one FMA;
//   folded     the same layout, the kernel's arithmetic since (quant_int_dot-inl.h RunDotsAvx2):
//              the int16 pair sums of a run's 4 chunks folded by three vphaddw, then one
//              vpmaddwd, conversion and FMA per run of 8 groups;
//   runs       each run of 8 groups (128 bytes) stored so that chunk c holds bytes 4c..4c+3 of
//              every group of the run (x codes permuted alike, once per call): the run's int16
//              pair sums add up per group with plain adds (at most 16 products of 15 * 127 per
//              lane), then one vpmaddwd, conversion and FMA per run.
// No backend uses the "runs" order: it would be a CPU-specific layout made at load
// (bench/README.md "Benchmark weights in huge pages, int4 decoding").
// Usage: bench_int4_layout [--reps N]   (x86-64 with AVX2, FMA and F16C; elsewhere it exits)
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>

namespace {

#define DH_ISA __attribute__((target("avx2,fma,f16c"), noinline))

constexpr int kK = 2048, kN = 256;  // 256 weight rows of 2048 columns: 288 KiB of codes + scales
constexpr int kRowBytes = kK / 2, kGroups = kK / 32;

struct Data {
  std::vector<uint8_t> codes, runs;              // [kN][kRowBytes], canonical and run order
  std::vector<uint16_t> scales;                  // [kN][kGroups] f16
  std::vector<uint8_t> zeros;                    // [kN][kGroups / 2]
  std::vector<int8_t> xe, xo, xe_runs, xo_runs;  // x codes of the even / odd columns
  std::vector<float> x_scale, x_sum;             // per group (= x block of 32)
  std::vector<float> out;
};

// Byte p of a row in run order holds canonical byte RunSource(p).
int RunSource(int p) {
  const int run = p / 128, chunk = (p % 128) / 32, group = (p % 32) / 4, byte = p % 4;
  return 128 * run + 16 * group + 4 * chunk + byte;
}

DH_ISA uint16_t ToHalf(float v) { return _cvtss_sh(v, 0); }

DH_ISA float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// -(zero nibble) * scale of the run's 8 groups times x's group sums, added to acc.
DH_ISA __m256 ZeroTerm(const uint8_t* z, int g0, __m256 scales, const float* x_sum, __m256 acc) {
  uint32_t zw;
  std::memcpy(&zw, z + g0 / 2, 4);
  const __m128i zb = _mm_cvtsi32_si128(static_cast<int>(zw)), low4 = _mm_set1_epi8(15);
  const __m128i nib =
      _mm_unpacklo_epi8(_mm_and_si128(zb, low4), _mm_and_si128(_mm_srli_epi16(zb, 4), low4));
  const __m256 zs = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nib)), scales);
  return _mm256_fnmadd_ps(zs, _mm256_loadu_ps(x_sum + g0), acc);
}

// The int16 pair sums of the 32-byte chunk at byte b of a row (codes q) against x's codes of the
// even and odd columns: two vpmaddubsw, as the kernel forms them.
__attribute__((target("avx2,fma,f16c"), always_inline)) inline __m256i PairSums(const uint8_t* q,
                                                                                const int8_t* xe,
                                                                                const int8_t* xo,
                                                                                int b) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b));
  const __m256i lo = _mm256_and_si256(v, low4);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  return _mm256_add_epi16(
      _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xe + b))),
      _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xo + b))));
}

enum class Variant { kPerChunk, kFolded, kRuns };
constexpr const char* kVariantNames[] = {"per-chunk", "folded", "runs"};

template <Variant kV>
DH_ISA void Rows(Data& d) {
  constexpr bool kRuns = kV == Variant::kRuns;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i half_order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const int8_t* xe = kRuns ? d.xe_runs.data() : d.xe.data();
  const int8_t* xo = kRuns ? d.xo_runs.data() : d.xo.data();
  for (int j = 0; j < kN; ++j) {
    const uint8_t* q = (kRuns ? d.runs.data() : d.codes.data()) + j * kRowBytes;
    const uint16_t* s = d.scales.data() + j * kGroups;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, mins = a0;
    for (int b = 0; b < kRowBytes; b += 128) {  // a run: 8 groups, 4 chunks
      const int g0 = b / 16;
      const __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + g0)));
      const __m256 comb = _mm256_mul_ps(sv, _mm256_loadu_ps(d.x_scale.data() + g0));
      mins = ZeroTerm(d.zeros.data() + j * kGroups / 2, g0, sv, d.x_sum.data(), mins);
      if constexpr (kRuns) {
        __m256i p = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          p = _mm256_add_epi16(p, PairSums(q, xe, xo, b + 32 * c));
        }
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), comb, a0);
      } else if constexpr (kV == Variant::kFolded) {
        __m256i pairs[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          pairs[c] = PairSums(q, xe, xo, b + 32 * c);
        }
        // Lanes [g0 g0 g2 g2 g4 g4 g6 g6 | g1 g1 g3 g3 g5 g5 g7 g7]: the products in that order.
        const __m256i folded = _mm256_hadd_epi16(_mm256_hadd_epi16(pairs[0], pairs[1]),
                                                 _mm256_hadd_epi16(pairs[2], pairs[3]));
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(folded, ones)),
                             _mm256_permutevar8x32_ps(comb, half_order), a0);
      } else {
        const __m256 arranged = _mm256_permutevar8x32_ps(comb, half_order);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m256 dots =
              _mm256_cvtepi32_ps(_mm256_madd_epi16(PairSums(q, xe, xo, b + 32 * c), ones));
          __m256 pick;  // chunk c's two groups in each half (immediate in-half permute)
          switch (c) {
            case 0:
              pick = _mm256_permute_ps(arranged, 0x00);
              break;
            case 1:
              pick = _mm256_permute_ps(arranged, 0x55);
              break;
            case 2:
              pick = _mm256_permute_ps(arranged, 0xaa);
              break;
            default:
              pick = _mm256_permute_ps(arranged, 0xff);
              break;
          }
          if (c & 1) {
            a1 = _mm256_fmadd_ps(dots, pick, a1);
          } else {
            a0 = _mm256_fmadd_ps(dots, pick, a0);
          }
        }
      }
    }
    d.out[j] = Sum8(_mm256_add_ps(_mm256_add_ps(a0, a1), mins));
  }
}

double ClockHz() {
  int64_t x = 0;
  constexpr int64_t kIters = 100000000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < kIters; ++i) {
    asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
  }
  return 4.0 * kIters /
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <Variant kV>
double SecondsPerCall(Data& d, int reps) {
  Rows<kV>(d);  // warm-up: weights into L2
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) Rows<kV>(d);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  return best;
}

int Main(int argc, char** argv) {
  int reps = 1000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_int4_layout [--reps N]\n");
      return 2;
    }
  }
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || reps < 1) {
    std::printf("bench_int4_layout: needs AVX2 and FMA (and --reps >= 1)\n");
    return 0;
  }
  Data d;
  uint64_t state = 1;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  d.codes.resize(kN * kRowBytes);
  d.runs.resize(kN * kRowBytes);
  d.scales.resize(kN * kGroups);
  d.zeros.resize(kN * kGroups / 2);
  for (auto& c : d.codes) c = static_cast<uint8_t>(next());
  for (auto& s : d.scales) s = ToHalf(0.001f * static_cast<float>(1 + next() % 100));
  for (auto& z : d.zeros) z = static_cast<uint8_t>(next());
  for (int j = 0; j < kN; ++j) {
    for (int p = 0; p < kRowBytes; ++p)
      d.runs[j * kRowBytes + p] = d.codes[j * kRowBytes + RunSource(p)];
  }
  for (auto* v : {&d.xe, &d.xo}) {
    v->resize(kRowBytes);
    for (auto& c : *v) c = static_cast<int8_t>(static_cast<int>(next() % 255) - 127);
  }
  d.xe_runs.resize(kRowBytes);
  d.xo_runs.resize(kRowBytes);
  for (int p = 0; p < kRowBytes; ++p) {
    d.xe_runs[p] = d.xe[RunSource(p)];
    d.xo_runs[p] = d.xo[RunSource(p)];
  }
  for (int g = 0; g < kGroups; ++g) {
    d.x_scale.push_back(0.01f * static_cast<float>(1 + g % 7));
    float sum = 0;
    for (int i = 0; i < 16; ++i) sum += static_cast<float>(d.xe[16 * g + i] + d.xo[16 * g + i]);
    d.x_sum.push_back(sum * d.x_scale.back());
  }
  d.out.resize(kN);
  Rows<Variant::kPerChunk>(d);
  const std::vector<float> per_chunk = d.out;
  for (int v = 1; v < 3; ++v) {
    if (v == 1) {
      Rows<Variant::kFolded>(d);
    } else {
      Rows<Variant::kRuns>(d);
    }
    for (int j = 0; j < kN; ++j) {
      const float tol = 1e-5f * (1.0f + std::fabs(per_chunk[j]));
      if (std::fabs(d.out[j] - per_chunk[j]) > tol) {
        std::printf("bench_int4_layout: %s row %d differs: %g against %g\n", kVariantNames[v], j,
                    d.out[j], per_chunk[j]);
        return 1;
      }
    }
  }
  const double hz = ClockHz();
  const double chunks = static_cast<double>(kN) * kRowBytes / 32;
  std::printf("clock estimate %.2f GHz; %d x %d int4 (groups of 32), one thread, in cache\n",
              hz / 1e9, kN, kK);
  std::printf("| variant | us per call | cycles per 64 weights |\n|---|---:|---:|\n");
  for (int round = 0; round < 2; ++round) {
    for (int v = 0; v < 3; ++v) {
      const double s = v == 0   ? SecondsPerCall<Variant::kPerChunk>(d, reps)
                       : v == 1 ? SecondsPerCall<Variant::kFolded>(d, reps)
                                : SecondsPerCall<Variant::kRuns>(d, reps);
      std::printf("| %s | %.1f | %.2f |\n", kVariantNames[v], s * 1e6, s * hz / chunks);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }

#else
int main() {
  std::printf("bench_int4_layout: x86-64 only\n");
  return 0;
}
#endif
