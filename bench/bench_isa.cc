// Throughput of the single AVX2 instructions the CPU kernels are built from, one thread: each
// row runs 12 independent register chains of one instruction (or an even mix of two), so the
// time per instruction is its issue cost, not its latency. The clock is estimated from a chain of
// dependent scalar adds (one cycle each on every x86 core of the last decade). Use it to see
// which unit a kernel is bound by on the machine at hand (bench/README.md "Zen 1, session 14":
// there vpmaddubsw / vpmaddwd take 2 cycles per ymm on one pipe, and the variable-index
// vpermilps 4 against 1 for the immediate form).
// With AVX512-VNNI a second table does the same on 512-bit registers (bench/README.md "Zen 5,
// session 19": there vpdpbusd, vfmadd231ps and vmulps share two pipes, vcvtdq2ps and the shifts
// do not).
// Usage: bench_isa [--iters N]   (x86-64 with AVX2, FMA and F16C; elsewhere it says so and exits)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>

namespace {

#define DH_ISA __attribute__((target("avx2,fma,f16c"), noinline))

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Cycles per second from a chain of 4 dependent adds per iteration.
double ClockHz(int64_t iters) {
  int64_t x = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) {
    asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
  }
  return 4.0 * static_cast<double>(iters) / Seconds(t0);
}

// 12 chains a0..a11 of vector type V (distinct start values from SET1, so no two chains can be
// merged); OP(x) updates one, with the operands b and c at hand. The asm statements keep every
// chain live in a register each iteration and its result after the loop.
#define DH_CHAINS_OF(V, SET1, OP_A, OP_B)                                                      \
  V a0 = SET1(1), a1 = SET1(2), a2 = SET1(3), a3 = SET1(4), a4 = SET1(5), a5 = SET1(6),         \
    a6 = SET1(7), a7 = SET1(8), a8 = SET1(9), a9 = SET1(10), a10 = SET1(11), a11 = SET1(12);    \
  const V b = SET1(3), c = SET1(5);                                                           \
  (void)b; /* not every instruction takes a second or third operand */                         \
  (void)c;                                                                                    \
  const auto t0 = std::chrono::steady_clock::now();                                           \
  for (int64_t i = 0; i < iters; ++i) {                                                       \
    OP_A(a0) OP_A(a1) OP_A(a2) OP_A(a3) OP_A(a4) OP_A(a5);                                     \
    OP_B(a6) OP_B(a7) OP_B(a8) OP_B(a9) OP_B(a10) OP_B(a11);                                   \
    asm volatile("" ::"x"(a0), "x"(a1), "x"(a2), "x"(a3), "x"(a4), "x"(a5), "x"(a6), "x"(a7), \
                 "x"(a8), "x"(a9), "x"(a10), "x"(a11));                                        \
  }                                                                                           \
  const double s = Seconds(t0);                                                               \
  asm volatile("" ::"x"(a0), "x"(a11));                                                       \
  return s / (12.0 * static_cast<double>(iters));
#define DH_CHAINS(OP_A, OP_B) DH_CHAINS_OF(__m256i, _mm256_set1_epi8, OP_A, OP_B)

#define MADDUBS(x) x = _mm256_maddubs_epi16(x, b);
#define MADDWD(x) x = _mm256_madd_epi16(x, b);
#define PS(x) _mm256_castsi256_ps(x)
#define FMA(x) x = _mm256_castps_si256(_mm256_fmadd_ps(PS(x), PS(b), PS(x)));
#define CVTDQ(x) x = _mm256_castps_si256(_mm256_cvtepi32_ps(x));
#define CVTPH(x) x = _mm256_castps_si256(_mm256_cvtph_ps(_mm256_castsi256_si128(x)));
#define PERMILVAR(x) x = _mm256_castps_si256(_mm256_permutevar_ps(PS(x), b));
#define PERMILIMM(x) x = _mm256_castps_si256(_mm256_permute_ps(PS(x), 0x4e));
#define PERMPS(x) x = _mm256_castps_si256(_mm256_permutevar8x32_ps(PS(x), b));
#define HADDD(x) x = _mm256_hadd_epi32(x, b);
#define SLLW(x) x = _mm256_slli_epi16(x, 7);
#define ANDV(x) x = _mm256_and_si256(x, b);
#define SIGNB(x) x = _mm256_sign_epi8(x, b);
#define MOVSXBW(x) x = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(x));

// Seconds per instruction of each row.
DH_ISA double Maddubs(int64_t iters) { DH_CHAINS(MADDUBS, MADDUBS) }
DH_ISA double Maddwd(int64_t iters) { DH_CHAINS(MADDWD, MADDWD) }
DH_ISA double Fma(int64_t iters) { DH_CHAINS(FMA, FMA) }
DH_ISA double Cvtdq(int64_t iters) { DH_CHAINS(CVTDQ, CVTDQ) }
DH_ISA double Cvtph(int64_t iters) { DH_CHAINS(CVTPH, CVTPH) }
DH_ISA double PermilVar(int64_t iters) { DH_CHAINS(PERMILVAR, PERMILVAR) }
DH_ISA double PermilImm(int64_t iters) { DH_CHAINS(PERMILIMM, PERMILIMM) }
DH_ISA double Permps(int64_t iters) { DH_CHAINS(PERMPS, PERMPS) }
DH_ISA double Haddd(int64_t iters) { DH_CHAINS(HADDD, HADDD) }
DH_ISA double Sllw(int64_t iters) { DH_CHAINS(SLLW, SLLW) }
DH_ISA double And(int64_t iters) { DH_CHAINS(ANDV, ANDV) }
DH_ISA double Sign(int64_t iters) { DH_CHAINS(SIGNB, SIGNB) }
DH_ISA double Movsxbw(int64_t iters) { DH_CHAINS(MOVSXBW, MOVSXBW) }
DH_ISA double MaddubsMaddwd(int64_t iters) { DH_CHAINS(MADDUBS, MADDWD) }
DH_ISA double MaddubsSign(int64_t iters) { DH_CHAINS(MADDUBS, SIGNB) }
DH_ISA double MaddwdMovsx(int64_t iters) { DH_CHAINS(MADDWD, MOVSXBW) }
DH_ISA double MaddubsFma(int64_t iters) { DH_CHAINS(MADDUBS, FMA) }
DH_ISA double MaddubsCvtdq(int64_t iters) { DH_CHAINS(MADDUBS, CVTDQ) }
DH_ISA double MaddubsPermilVar(int64_t iters) { DH_CHAINS(MADDUBS, PERMILVAR) }
DH_ISA double MaddubsPermilImm(int64_t iters) { DH_CHAINS(MADDUBS, PERMILIMM) }
DH_ISA double FmaCvtph(int64_t iters) { DH_CHAINS(FMA, CVTPH) }

// Vector loads from L1 (bench/README.md "Zen 5, session 37": there they issue 2 per cycle, the
// x broadcasts and spills of the integer tiles' block loop set its pace, not vpmaddubsw): 12
// independent loads per iteration, from distinct lines of a buffer that stays in L1, each into its
// own register (asm, so the compiler neither hoists nor merges them); the mixes pair each load
// with the instruction that consumes it.
alignas(64) uint8_t g_lines[12 * 64];
#define DH_LOADS(...)                                                                        \
  const auto t0 = std::chrono::steady_clock::now();                                          \
  for (int64_t i = 0; i < iters; ++i) {                                                      \
    asm volatile(__VA_ARGS__ ::"r"(g_lines)                                                  \
                 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",   \
                   "xmm9", "xmm10", "xmm11", "xmm12", "memory");                             \
  }                                                                                          \
  return Seconds(t0) / (12.0 * static_cast<double>(iters));
#define DH_LOAD12(INS)                                                                       \
  INS " 0(%0), %%ymm0\n\t" INS " 64(%0), %%ymm1\n\t" INS " 128(%0), %%ymm2\n\t"              \
  INS " 192(%0), %%ymm3\n\t" INS " 256(%0), %%ymm4\n\t" INS " 320(%0), %%ymm5\n\t"           \
  INS " 384(%0), %%ymm6\n\t" INS " 448(%0), %%ymm7\n\t" INS " 512(%0), %%ymm8\n\t"           \
  INS " 576(%0), %%ymm9\n\t" INS " 640(%0), %%ymm10\n\t" INS " 704(%0), %%ymm11\n\t"
// A broadcast load into register r, then vpmaddubsw of the register ymm12 against it
// (MEM: vpmaddubsw reads its other operand from memory too, 32 bytes on).
#define DH_BCAST_MADD(R, OFF) \
  "vpbroadcastd " #OFF "(%0), %%ymm" #R "\n\tvpmaddubsw %%ymm" #R ", %%ymm12, %%ymm" #R "\n\t"
#define DH_BCAST_MADD_MEM(R, OFF)                 \
  "vpbroadcastd " #OFF "(%0), %%ymm" #R "\n\t"   \
  "vpmaddubsw 32+" #OFF "(%0), %%ymm" #R ", %%ymm" #R "\n\t"
#define DH_SHUF_MADD(R, IMM)                                     \
  "vpshufd $" #IMM ", %%ymm12, %%ymm" #R "\n\t"                 \
  "vpmaddubsw %%ymm" #R ", %%ymm12, %%ymm" #R "\n\t"
DH_ISA double LoadBroadcast(int64_t iters) { DH_LOADS(DH_LOAD12("vpbroadcastd")) }
DH_ISA double LoadVector(int64_t iters) { DH_LOADS(DH_LOAD12("vmovdqu")) }
DH_ISA double BroadcastMaddubs(int64_t iters) {
  DH_LOADS(DH_BCAST_MADD(0, 0) DH_BCAST_MADD(1, 64) DH_BCAST_MADD(2, 128) DH_BCAST_MADD(3, 192)
               DH_BCAST_MADD(4, 256) DH_BCAST_MADD(5, 320))
}
DH_ISA double BroadcastMaddubsMem(int64_t iters) {
  DH_LOADS(DH_BCAST_MADD_MEM(0, 0) DH_BCAST_MADD_MEM(1, 64) DH_BCAST_MADD_MEM(2, 128)
               DH_BCAST_MADD_MEM(3, 192) DH_BCAST_MADD_MEM(4, 256) DH_BCAST_MADD_MEM(5, 320))
}
DH_ISA double ShufdMaddubs(int64_t iters) {
  DH_LOADS(DH_SHUF_MADD(0, 0x00) DH_SHUF_MADD(1, 0x55) DH_SHUF_MADD(2, 0xaa)
               DH_SHUF_MADD(3, 0xff) DH_SHUF_MADD(4, 0x4e) DH_SHUF_MADD(5, 0xb1))
}

// GCC 12's AVX-512 intrinsics pass an "undefined" vector that -Wmaybe-uninitialized flags once
// inlined (as in quant_vnni.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The same on 512-bit registers, for the AVX512-VNNI kernels (quant_int_dot-inl.h): which of
// their instructions share the pipes of vpdpbusd. In a 6 + 6 mix of two instructions that
// issue 2 per cycle each, 0.25 cycles per instruction means separate pipes, 0.5 shared ones.
#define DH_ISA512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni"), noinline))
#define DH_CHAINS512(OP_A, OP_B) DH_CHAINS_OF(__m512i, _mm512_set1_epi8, OP_A, OP_B)

#define ZPS(x) _mm512_castsi512_ps(x)
#define ZDPBUSD(x) x = _mm512_dpbusd_epi32(x, b, c);
#define ZFMA(x) x = _mm512_castps_si512(_mm512_fmadd_ps(ZPS(x), ZPS(b), ZPS(c)));
#define ZMUL(x) x = _mm512_castps_si512(_mm512_mul_ps(ZPS(x), ZPS(b)));
#define ZADDPS(x) x = _mm512_castps_si512(_mm512_add_ps(ZPS(x), ZPS(b)));
#define ZCVTDQ(x) x = _mm512_castps_si512(_mm512_cvtepi32_ps(x));
#define ZSRLW(x) x = _mm512_srli_epi16(x, 4);
#define ZAND(x) x = _mm512_and_si512(x, b);
#define ZADDB(x) x = _mm512_add_epi8(x, b);
#define ZPERMD(x) x = _mm512_permutexvar_epi32(b, x);
#define ZSHUFB(x) x = _mm512_shuffle_epi8(x, b);

DH_ISA512 double Dpbusd512(int64_t iters) { DH_CHAINS512(ZDPBUSD, ZDPBUSD) }
DH_ISA512 double Fma512(int64_t iters) { DH_CHAINS512(ZFMA, ZFMA) }
DH_ISA512 double Mul512(int64_t iters) { DH_CHAINS512(ZMUL, ZMUL) }
DH_ISA512 double AddPs512(int64_t iters) { DH_CHAINS512(ZADDPS, ZADDPS) }
DH_ISA512 double Cvtdq512(int64_t iters) { DH_CHAINS512(ZCVTDQ, ZCVTDQ) }
DH_ISA512 double Srlw512(int64_t iters) { DH_CHAINS512(ZSRLW, ZSRLW) }
DH_ISA512 double And512(int64_t iters) { DH_CHAINS512(ZAND, ZAND) }
DH_ISA512 double AddB512(int64_t iters) { DH_CHAINS512(ZADDB, ZADDB) }
DH_ISA512 double Permd512(int64_t iters) { DH_CHAINS512(ZPERMD, ZPERMD) }
DH_ISA512 double Shufb512(int64_t iters) { DH_CHAINS512(ZSHUFB, ZSHUFB) }
DH_ISA512 double DpbusdFma512(int64_t iters) { DH_CHAINS512(ZDPBUSD, ZFMA) }
DH_ISA512 double DpbusdMul512(int64_t iters) { DH_CHAINS512(ZDPBUSD, ZMUL) }
DH_ISA512 double DpbusdAddPs512(int64_t iters) { DH_CHAINS512(ZDPBUSD, ZADDPS) }
DH_ISA512 double DpbusdCvtdq512(int64_t iters) { DH_CHAINS512(ZDPBUSD, ZCVTDQ) }
DH_ISA512 double DpbusdSrlw512(int64_t iters) { DH_CHAINS512(ZDPBUSD, ZSRLW) }
DH_ISA512 double DpbusdAddB512(int64_t iters) { DH_CHAINS512(ZDPBUSD, ZADDB) }
DH_ISA512 double DpbusdPermd512(int64_t iters) { DH_CHAINS512(ZDPBUSD, ZPERMD) }
DH_ISA512 double DpbusdShufb512(int64_t iters) { DH_CHAINS512(ZDPBUSD, ZSHUFB) }

#pragma GCC diagnostic pop

struct Row {
  const char* name;
  double (*run)(int64_t);
};

const Row kRows[] = {
    {"vpmaddubsw", Maddubs},
    {"vpmaddwd", Maddwd},
    {"vfmadd231ps", Fma},
    {"vcvtdq2ps", Cvtdq},
    {"vcvtph2ps", Cvtph},
    {"vpermilps (index vector)", PermilVar},
    {"vpermilps (immediate)", PermilImm},
    {"vpermps", Permps},
    {"vphaddd", Haddd},
    {"vpsllw", Sllw},
    {"vpand", And},
    {"vpsignb", Sign},
    {"vpmovsxbw", Movsxbw},
    {"vpmaddubsw + vpmaddwd", MaddubsMaddwd},
    {"vpmaddubsw + vpsignb", MaddubsSign},
    {"vpmaddwd + vpmovsxbw", MaddwdMovsx},
    {"vpmaddubsw + vfmadd231ps", MaddubsFma},
    {"vpmaddubsw + vcvtdq2ps", MaddubsCvtdq},
    {"vpmaddubsw + vpermilps (index vector)", MaddubsPermilVar},
    {"vpmaddubsw + vpermilps (immediate)", MaddubsPermilImm},
    {"vfmadd231ps + vcvtph2ps", FmaCvtph},
    {"vpbroadcastd ymm, m32 (load)", LoadBroadcast},
    {"vmovdqu ymm, m256 (load)", LoadVector},
    {"vpbroadcastd m32 + vpmaddubsw", BroadcastMaddubs},
    {"vpbroadcastd m32 + vpmaddubsw m256", BroadcastMaddubsMem},
    {"vpshufd + vpmaddubsw", ShufdMaddubs},
};

const Row kRows512[] = {
    {"vpdpbusd zmm", Dpbusd512},
    {"vfmadd231ps zmm", Fma512},
    {"vmulps zmm", Mul512},
    {"vaddps zmm", AddPs512},
    {"vcvtdq2ps zmm", Cvtdq512},
    {"vpsrlw zmm", Srlw512},
    {"vpandd zmm", And512},
    {"vpaddb zmm", AddB512},
    {"vpermd zmm", Permd512},
    {"vpshufb zmm", Shufb512},
    {"vpdpbusd + vfmadd231ps", DpbusdFma512},
    {"vpdpbusd + vmulps", DpbusdMul512},
    {"vpdpbusd + vaddps", DpbusdAddPs512},
    {"vpdpbusd + vcvtdq2ps", DpbusdCvtdq512},
    {"vpdpbusd + vpsrlw", DpbusdSrlw512},
    {"vpdpbusd + vpaddb", DpbusdAddB512},
    {"vpdpbusd + vpermd", DpbusdPermd512},
    {"vpdpbusd + vpshufb", DpbusdShufb512},
};

void PrintRows(const Row* rows, size_t n, int64_t iters, double hz) {
  std::printf("| instruction (12 chains; mixes 6 + 6) | ns each | cycles each | per cycle |\n");
  std::printf("| --- | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < n; ++i) {
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) best = std::min(best, rows[i].run(iters / 12));
    std::printf("| %s | %.3f | %.2f | %.2f |\n", rows[i].name, best * 1e9, best * hz,
                1.0 / (best * hz));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t iters = 20'000'000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_isa [--iters N]\n");
      return 2;
    }
  }
  if (iters <= 0) {
    std::fprintf(stderr, "bench_isa: --iters must be positive\n");
    return 2;
  }
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
      !__builtin_cpu_supports("f16c")) {
    std::printf("bench_isa: this CPU lacks AVX2, FMA or F16C; nothing to measure\n");
    return 0;
  }
  const double hz = ClockHz(iters * 4);
  std::printf("one thread, 256-bit registers, 12 independent chains; clock ~%.2f GHz (scalar add "
              "chain)\n",
              hz / 1e9);
  PrintRows(kRows, sizeof(kRows) / sizeof(kRows[0]), iters, hz);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni")) {
    std::printf("\none thread, 512-bit registers (AVX512-VNNI), as above\n");
    PrintRows(kRows512, sizeof(kRows512) / sizeof(kRows512[0]), iters, hz);
  }
  return 0;
}

#else  // !__x86_64__

int main() {
  std::printf("bench_isa: x86-64 only\n");
  return 0;
}

#endif
