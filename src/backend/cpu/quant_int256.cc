// AVX2 and AVX-VNNI (256-bit) integer-dot kernels for int8 / int4 weights (quant_int256.h). As in
// quant_vnni.cc the intrinsics live in functions with a target attribute, so the file builds with
// the project's baseline flags and the kernels run only where cpuid says the CPU has them.
#include "backend/cpu/quant_int256.h"

#include <cstring>

#include "backend/weight.h"
#include "base/check.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace dh::cpu {

bool CpuHasAvx2() {
#if defined(__x86_64__)
  static const bool ok = [] {
    __builtin_cpu_init();
    // F16C (CPUID.1:ECX bit 29) widens the f16 weight scales; every AVX2 CPU has it.
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && ((c >> 29) & 1u) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return ok;
#else
  return false;
#endif
}

bool CpuHasAvxVnni() {
#if defined(__x86_64__)
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    // CPUID.(EAX=7, ECX=1):EAX bit 4 = AVX-VNNI; the OS saves ymm state since AVX2 is usable.
    if (!CpuHasAvx2() || __get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return false;
    return ((a >> 4) & 1u) != 0;
  }();
  return ok;
#else
  return false;
#endif
}

bool CpuHalfWidthVectorUnits() {
#if defined(__x86_64__)
  static const bool half = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    if (std::strcmp(vendor, "AuthenticAMD") != 0 || __get_cpuid(1, &a, &b, &c, &d) == 0) {
      return false;
    }
    const unsigned base_family = (a >> 8) & 0xfu;
    const unsigned family = base_family == 0xfu ? base_family + ((a >> 20) & 0xffu) : base_family;
    const unsigned model = (((a >> 16) & 0xfu) << 4) | ((a >> 4) & 0xfu);
    // 15h (Excavator), 16h, and 17h models 00h-2Fh (Zen, Zen+); Zen 2 (17h 30h+) has 256-bit units.
    return family == 0x15 || family == 0x16 || (family == 0x17 && model < 0x30);
  }();
  return half;
#else
  return false;
#endif
}

#if defined(__x86_64__)
#define DH_IDOT_BITS 256
#define DH_IDOT_VNNI 0
#define DH_IDOT_NS avx2_kernels
#define DH_IDOT_TARGET __attribute__((target("avx2,fma,f16c")))
namespace {
#include "backend/cpu/quant_int_dot-inl.h"  // NOLINT(build/include)
}  // namespace
#undef DH_IDOT_VNNI
#undef DH_IDOT_NS
#undef DH_IDOT_TARGET

#define DH_IDOT_VNNI 1
#define DH_IDOT_NS avxvnni_kernels
#define DH_IDOT_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
namespace {
#include "backend/cpu/quant_int_dot-inl.h"  // NOLINT(build/include)
}  // namespace
#undef DH_IDOT_BITS
#undef DH_IDOT_VNNI
#undef DH_IDOT_NS
#undef DH_IDOT_TARGET
#endif  // __x86_64__

void IntegerDot256Range(bool vnni, const QuantMatMulArgs& a, const QuantizedActs& acts,
                        int64_t n_begin, int64_t n_end) {
  DH_CHECK((vnni ? CpuHasAvxVnni() : CpuHasAvx2()) &&
               IntegerDotSupports(a.int4, a.k, a.group_size) && acts.m == a.m,
           "integer dot {}: {} k={} group={} m={} (prepared for m={})",
           vnni ? "avxvnni" : "avx2", a.int4 ? "int4" : "int8", a.k, a.group_size, a.m, acts.m);
  if (n_begin >= n_end || a.m <= 0) return;
#if defined(__x86_64__)
  if (vnni) {
    if (a.int4) return avxvnni_kernels::DotAll<true>(a, acts, n_begin, n_end);
    return avxvnni_kernels::DotAll<false>(a, acts, n_begin, n_end);
  }
  if (a.int4) return avx2_kernels::DotAll<true>(a, acts, n_begin, n_end);
  return avx2_kernels::DotAll<false>(a, acts, n_begin, n_end);
#endif
}

int64_t PrepackTileCodes256(const uint8_t* q0, int64_t q_stride, int64_t row_bytes,
                            int32_t* codes) {
#if defined(__x86_64__)
  if (CpuHasAvx2()) return avx2_kernels::PrepackTileCodes(q0, q_stride, row_bytes, codes);
#endif
  return 0;
}

}  // namespace dh::cpu
