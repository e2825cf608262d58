// The integer-dot kernel body (quant_vnni.h has the numerics), written once for every x86 tier
// and included once per tier: by quant_int256.cc for AVX2 and AVX-VNNI (256-bit) and by
// quant_vnni.cc for AVX512-VNNI (512-bit). The includer defines
//   DH_IDOT_BITS    256 or 512 (the vector width),
//   DH_IDOT_VNNI    1 for vpdpbusd, 0 for AVX2's vpmaddubsw + vpmaddwd (256-bit only),
//   DH_IDOT_NS      the namespace of this copy,
//   DH_IDOT_TARGET  the functions' target attribute,
// inside an anonymous namespace. The first section maps a few vector operations onto the width's
// intrinsics; everything after it is width-independent. No include guard on purpose.

namespace DH_IDOT_NS {

// The kernel this copy is (its choices that differ by tier: FewRowsTakeTiles).
constexpr IntegerDotPath kPath = DH_IDOT_BITS == 512 ? IntegerDotPath::kVnni512
                                 : DH_IDOT_VNNI      ? IntegerDotPath::kAvxVnni
                                                     : IntegerDotPath::kAvx2;

#if DH_IDOT_BITS == 512
static_assert(DH_IDOT_VNNI, "the 512-bit kernel is the AVX512-VNNI one");
using VecI = __m512i;
using VecF = __m512;
DH_IDOT_TARGET inline VecI LoadI(const void* p) { return _mm512_loadu_si512(p); }
DH_IDOT_TARGET inline VecI ZeroI() { return _mm512_setzero_si512(); }
DH_IDOT_TARGET inline VecI SetI8(char c) { return _mm512_set1_epi8(c); }
DH_IDOT_TARGET inline VecI AndI(VecI a, VecI b) { return _mm512_and_si512(a, b); }
DH_IDOT_TARGET inline VecI Shr4(VecI a) { return _mm512_srli_epi16(a, 4); }
DH_IDOT_TARGET inline VecI SubI32(VecI a, VecI b) { return _mm512_sub_epi32(a, b); }
DH_IDOT_TARGET inline VecI AddI32(VecI a, VecI b) { return _mm512_add_epi32(a, b); }
DH_IDOT_TARGET inline VecI Shl7I32(VecI a) { return _mm512_slli_epi32(a, 7); }
DH_IDOT_TARGET inline VecI Dpbusd(VecI acc, VecI u8, VecI s8) {
  return _mm512_dpbusd_epi32(acc, u8, s8);
}
DH_IDOT_TARGET inline VecF ZeroF() { return _mm512_setzero_ps(); }
DH_IDOT_TARGET inline VecF SetF(float v) { return _mm512_set1_ps(v); }
DH_IDOT_TARGET inline VecF LoadF(const float* p) { return _mm512_loadu_ps(p); }
DH_IDOT_TARGET inline VecF AddF(VecF a, VecF b) { return _mm512_add_ps(a, b); }
DH_IDOT_TARGET inline VecF MulF(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
DH_IDOT_TARGET inline VecF FmaF(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
DH_IDOT_TARGET inline VecF FnmaF(VecF a, VecF b, VecF c) { return _mm512_fnmadd_ps(a, b, c); }
DH_IDOT_TARGET inline VecF ToF(VecI a) { return _mm512_cvtepi32_ps(a); }
DH_IDOT_TARGET inline float SumF(VecF v) { return _mm512_reduce_add_ps(v); }
// Lane i of the result is v[idx[i]].
DH_IDOT_TARGET inline VecF PermuteF(VecF v, VecI idx) { return _mm512_permutexvar_ps(idx, v); }
// Lane i of each 128-bit quarter of the result is lane (kImm >> 2i) & 3 of that quarter of v.
template <int kImm>
DH_IDOT_TARGET inline VecF PermuteImmF(VecF v) { return _mm512_permute_ps(v, kImm); }
// Not used on 512 bits (the kBlock32 runs are 256-bit only); for the shared template.
DH_IDOT_TARGET inline VecF BothHalvesF(VecF v, bool) { return v; }
// All lanes of f16 values at p, and the low 8 lanes from h (the rest zero), widened to f32.
DH_IDOT_TARGET inline VecF WidenHalves(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
DH_IDOT_TARGET inline VecF WidenHalves8(__m128i h) {
  return _mm512_cvtph_ps(_mm256_zextsi128_si256(h));
}
// The low bytes of b (one per lane) widened to i32 lanes.
DH_IDOT_TARGET inline VecI WidenBytes(__m128i b) { return _mm512_cvtepu8_epi32(b); }
// The 4 bytes at p in every i32 lane.
DH_IDOT_TARGET inline VecI BroadcastDword(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
DH_IDOT_TARGET inline void StoreI(void* p, VecI v) { _mm512_storeu_si512(p, v); }
DH_IDOT_TARGET inline void StoreF(float* p, VecF v) { _mm512_storeu_ps(p, v); }
// dst[c * dst_stride + i] = dword c of the 64 bytes at src + i * stride, for i, c < 16.
DH_IDOT_TARGET inline void TransposeDwords(const uint8_t* src, int64_t stride, int32_t* dst,
                                           int64_t dst_stride = 16) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * stride);
  for (int i = 0; i < 16; i += 2) {  // t: pairs of rows interleaved per 128-bit lane
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int q = 0; q < 16; q += 4) {  // r[q + c]: lane L holds column 4L + c of rows q..q+3
    r[q] = _mm512_unpacklo_epi64(t[q], t[q + 2]);
    r[q + 1] = _mm512_unpackhi_epi64(t[q], t[q + 2]);
    r[q + 2] = _mm512_unpacklo_epi64(t[q + 1], t[q + 3]);
    r[q + 3] = _mm512_unpackhi_epi64(t[q + 1], t[q + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // a 4 x 4 transpose of 128-bit lanes over the quads
    const __m512i a = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
    const __m512i b = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i a2 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
    const __m512i b2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
    _mm512_storeu_si512(dst + (0 + c) * dst_stride, _mm512_shuffle_i32x4(a, b, 0x88));
    _mm512_storeu_si512(dst + (4 + c) * dst_stride, _mm512_shuffle_i32x4(a, b, 0xdd));
    _mm512_storeu_si512(dst + (8 + c) * dst_stride, _mm512_shuffle_i32x4(a2, b2, 0x88));
    _mm512_storeu_si512(dst + (12 + c) * dst_stride, _mm512_shuffle_i32x4(a2, b2, 0xdd));
  }
}
#else
using VecI = __m256i;
using VecF = __m256;
DH_IDOT_TARGET inline VecI LoadI(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
DH_IDOT_TARGET inline VecI ZeroI() { return _mm256_setzero_si256(); }
DH_IDOT_TARGET inline VecI SetI8(char c) { return _mm256_set1_epi8(c); }
DH_IDOT_TARGET inline VecI AndI(VecI a, VecI b) { return _mm256_and_si256(a, b); }
DH_IDOT_TARGET inline VecI Shr4(VecI a) { return _mm256_srli_epi16(a, 4); }
DH_IDOT_TARGET inline VecI SubI32(VecI a, VecI b) { return _mm256_sub_epi32(a, b); }
DH_IDOT_TARGET inline VecI AddI32(VecI a, VecI b) { return _mm256_add_epi32(a, b); }
DH_IDOT_TARGET inline VecI Shl7I32(VecI a) { return _mm256_slli_epi32(a, 7); }
#if DH_IDOT_VNNI
DH_IDOT_TARGET inline VecI Dpbusd(VecI acc, VecI u8, VecI s8) {
  return _mm256_dpbusd_avx_epi32(acc, u8, s8);
}
#endif
DH_IDOT_TARGET inline VecF ZeroF() { return _mm256_setzero_ps(); }
DH_IDOT_TARGET inline VecF SetF(float v) { return _mm256_set1_ps(v); }
DH_IDOT_TARGET inline VecF LoadF(const float* p) { return _mm256_loadu_ps(p); }
DH_IDOT_TARGET inline VecF AddF(VecF a, VecF b) { return _mm256_add_ps(a, b); }
DH_IDOT_TARGET inline VecF MulF(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
DH_IDOT_TARGET inline VecF FmaF(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
DH_IDOT_TARGET inline VecF FnmaF(VecF a, VecF b, VecF c) { return _mm256_fnmadd_ps(a, b, c); }
DH_IDOT_TARGET inline VecF ToF(VecI a) { return _mm256_cvtepi32_ps(a); }
DH_IDOT_TARGET inline float SumF(VecF v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
DH_IDOT_TARGET inline VecF PermuteF(VecF v, VecI idx) { return _mm256_permutevar8x32_ps(v, idx); }
// Lane i of each 128-bit half of the result is lane (kImm >> 2i) & 3 of that half of v.
template <int kImm>
DH_IDOT_TARGET inline VecF PermuteImmF(VecF v) { return _mm256_permute_ps(v, kImm); }
// v's low (high == false) or high 128-bit half in both halves.
DH_IDOT_TARGET inline VecF BothHalvesF(VecF v, bool high) {
  const __m128 h = high ? _mm256_extractf128_ps(v, 1) : _mm256_castps256_ps128(v);
  return _mm256_insertf128_ps(_mm256_castps128_ps256(h), h, 1);
}
DH_IDOT_TARGET inline VecF WidenHalves(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
DH_IDOT_TARGET inline VecF WidenHalves8(__m128i h) { return _mm256_cvtph_ps(h); }
DH_IDOT_TARGET inline VecI WidenBytes(__m128i b) { return _mm256_cvtepu8_epi32(b); }
DH_IDOT_TARGET inline VecI BroadcastDword(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
DH_IDOT_TARGET inline void StoreI(void* p, VecI v) {
  _mm256_storeu_si256(static_cast<__m256i*>(p), v);
}
DH_IDOT_TARGET inline void StoreF(float* p, VecF v) { _mm256_storeu_ps(p, v); }
// dst[c * dst_stride + i] = dword c of the 32 bytes at src + i * stride, for i, c < 8.
DH_IDOT_TARGET inline void TransposeDwords(const uint8_t* src, int64_t stride, int32_t* dst,
                                           int64_t dst_stride = 8) {
  __m256i r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = LoadI(src + i * stride);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int q = 0; q < 8; q += 4) {
    r[q] = _mm256_unpacklo_epi64(t[q], t[q + 2]);
    r[q + 1] = _mm256_unpackhi_epi64(t[q], t[q + 2]);
    r[q + 2] = _mm256_unpacklo_epi64(t[q + 1], t[q + 3]);
    r[q + 3] = _mm256_unpackhi_epi64(t[q + 1], t[q + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    StoreI(dst + c * dst_stride, _mm256_permute2x128_si256(r[c], r[4 + c], 0x20));
    StoreI(dst + (4 + c) * dst_stride, _mm256_permute2x128_si256(r[c], r[4 + c], 0x31));
  }
}
#endif

// Lane i of each 128-bit half of the result is lane slot(i) of that half of v, slot(i) =
// c * kPer / 2 + i * kPer / 8 (the chunk pick of DotRows' runs below, kPer groups per chunk), with
// vpermilps' immediate form: c is the index of an unrolled loop, so the switch folds away. Zen 1
// issues the immediate form at 1 cycle per ymm and the index-vector form at 4 (bench_isa,
// bench/README.md "Zen 1, session 14"). The 256-bit kernels' picks only.
template <int kPer>
constexpr int PickImm(int c) {
  int imm = 0;
  for (int i = 0; i < 4; ++i) imm |= (c * kPer / 2 + i * kPer / 8) << (2 * i);
  return imm;
}
template <int kPer>
DH_IDOT_TARGET inline __attribute__((always_inline)) VecF PickInHalvesF(VecF v, int c) {
  static_assert(kPer == 2 || kPer == 4);
  if constexpr (kPer == 4) {  // two chunks per run
    return c == 0 ? PermuteImmF<PickImm<4>(0)>(v) : PermuteImmF<PickImm<4>(1)>(v);
  } else {  // four chunks per run
    switch (c) {
      case 0: return PermuteImmF<PickImm<2>(0)>(v);
      case 1: return PermuteImmF<PickImm<2>(1)>(v);
      case 2: return PermuteImmF<PickImm<2>(2)>(v);
      default: return PermuteImmF<PickImm<2>(3)>(v);
    }
  }
}
// Bytes of weight codes per vector; f32 lanes per vector.
constexpr int64_t kBytes = DH_IDOT_BITS / 8;
constexpr int kLanes = DH_IDOT_BITS / 32;
constexpr int64_t kXBlock = 32;  // x columns per quantization block (QuantizeActs)

// How the weight scales map onto the lanes of one vector of codes: one scale for the row, one
// per vector (a group spans whole vectors), or several per vector (permuted onto their lanes).
// kBlock32 (256-bit kernels, groups of exactly 32 columns: the defaults int8 and int4): a
// weight group is one x block, so the product x_scale * w_scale is formed once per group, for
// kLanes groups at a time, and each chunk only broadcasts or permutes it onto its lanes.
enum class ScaleMode { kOne, kPerChunk, kPermute, kBlock32 };

inline ScaleMode ModeFor(bool int4, int64_t k, int64_t g) {
  if (g >= k) return ScaleMode::kOne;
  if (g % (int4 ? 2 * kBytes : kBytes) == 0) return ScaleMode::kPerChunk;
  return ScaleMode::kPermute;
}

// The first min(count, left) of `count` (1, 2, 4, 8 or, on 512 bits, 16) f16 scales at s,
// widened, in the low lanes, with plain loads of 2-32 bytes (masked loads were slow on Zen 5);
// the other lanes are zero and never selected.
DH_IDOT_TARGET inline VecF LoadScales(const uint16_t* s, int count, int64_t left) {
  if (left < count) {
    alignas(64) uint16_t t[kLanes] = {};
    for (int64_t i = 0; i < left; ++i) t[i] = s[i];
    return WidenHalves(t);
  }
  __m128i h;
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
      return WidenHalves(s);
  }
  return WidenHalves8(h);
}

// (zero nibble + offset) * scale of the kLanes groups from g (a multiple of kLanes), their
// scales already widened in `scales`.
DH_IDOT_TARGET inline __attribute__((always_inline)) VecF ZeroTimesScale(const uint8_t* z,
                                                                         int64_t g, VecF off,
                                                                         VecF scales) {
  const __m128i low4 = _mm_set1_epi8(0x0f);
  uint64_t zw = 0;  // kLanes zero nibbles
  std::memcpy(&zw, z + g / 2, kLanes / 2);
  const __m128i zb = _mm_cvtsi64_si128(static_cast<int64_t>(zw));
  const __m128i nib =
      _mm_unpacklo_epi8(_mm_and_si128(zb, low4), _mm_and_si128(_mm_srli_epi16(zb, 4), low4));
  return MulF(AddF(ToF(WidenBytes(nib)), off), scales);  // z + offset exact: small integers
}

// The int4 zero-point term, sum over the n groups of min[g] * gsum_r[g] with min[g] =
// -(zero nibble + offset) * scale[g], for MR rows of x at once: the min vector of each kLanes
// groups is formed once (z * scale is exact in f32: at most 16 significant bits) and subtracted
// lane-wise into facc[r] (only the accumulators' lane sum is used); tail[r] gets the last
// groups'. Groups [g0, n) only: g0 is a multiple of kLanes, the groups before it the caller's.
template <int MR>
DH_IDOT_TARGET inline __attribute__((always_inline)) void AddMins(
    const uint16_t* s, const uint8_t* z, int offset, const float* const* gsum, int64_t g0,
    int64_t n, VecF* facc, float* tail) {
  const VecF off = SetF(static_cast<float>(offset));
  int64_t g = g0;
  for (; g + kLanes <= n; g += kLanes) {
    const VecF zs = ZeroTimesScale(z, g, off, WidenHalves(s + g));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) facc[r] = FnmaF(zs, LoadF(gsum[r] + g), facc[r]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) tail[r] = 0.0f;
  for (; g < n; ++g) {
    const float zs = static_cast<float>(ZeroNibble(z, g) + offset) * _cvtsh_ss(s[g]);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) tail[r] -= zs * gsum[r][g];
  }
}

// The low and high nibbles of each byte of v: int4 codes of the even and odd columns.
DH_IDOT_TARGET inline __attribute__((always_inline)) void SplitNibbles(VecI v, VecI* lo,
                                                                       VecI* hi) {
  const VecI low4 = SetI8(0x0f);
  *lo = AndI(v, low4);
  *hi = AndI(Shr4(v), low4);
}

#if !DH_IDOT_VNNI
// Marks v as computed here, in a register: an add chain through it stays a chain. Without it
// GCC reassociates a row's 8 vpmaddubsw + vpaddw of a packed block into a tree, loads the 8 x
// broadcasts of the tree at once, and with 16 registers the block's 8 code vectors and the rows'
// sums then spill: 17 vector loads and stores per row and block against 13, and vector loads
// issue at 2 per cycle (Zen 5, scratch loop in L1: 7.95-8.30 -> 6.74-6.80 cycles per row, block
// and 8 weight rows, against 6 by the multiply pipes; bench/README.md "Zen 5, session 37").
DH_IDOT_TARGET inline __attribute__((always_inline)) void KeepChain(VecI& v) {
  asm("" : "+x"(v));
}

// AVX2: the int16 pair sums of one int4 chunk (nibbles lo, hi) against x's codes of the even and
// odd columns (xe, xo).
DH_IDOT_TARGET inline __attribute__((always_inline)) VecI PairSumsInt4(VecI lo, VecI hi, VecI xe,
                                                                       VecI xo) {
  return _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
}
#endif

// One vector of codes v (bytes [b, b + kBytes) of the weight row) times MR rows of quantized x,
// added to facc with the per-lane scales x_scale * wsl. The i32 lane dots are exact on every
// path (quant_int256.h shows why AVX2's saturating pair sums never saturate here).
//   int8: x codes as stored (u8 = q + 128): dot(x + 128, w) - 128 * sum(w); AVX2 instead takes
//         |w| as the unsigned operand against x (stored as q, QuantizedActs::int8_signed) with
//         w's sign applied.
//   int4: codes 0..15 (unsigned) against the signed x codes of the even and odd columns.
// comb == nullptr: the per-lane scale of row r is x's lane scales times wsl; else comb[r].
template <int MR, bool kInt4>
DH_IDOT_TARGET inline __attribute__((always_inline)) void Chunk(
    VecI v, VecF wsl, int64_t b, int64_t half, const uint8_t* const* xc,
    const float* const* xl, VecF* facc, const VecF* comb_in = nullptr) {
  const int64_t lane0 = b / 4;
  auto comb_of = [&](int r) DH_IDOT_TARGET {
    return comb_in != nullptr ? comb_in[r] : MulF(LoadF(xl[r] + lane0), wsl);
  };
  if constexpr (kInt4) {
    VecI lo, hi;
    SplitNibbles(v, &lo, &hi);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const VecI xe = LoadI(xc[r] + b), xo = LoadI(xc[r] + half + b);
#if DH_IDOT_VNNI
      const VecI acc = Dpbusd(Dpbusd(ZeroI(), lo, xe), hi, xo);
#else
      const VecI acc = _mm256_madd_epi16(PairSumsInt4(lo, hi, xe, xo), _mm256_set1_epi16(1));
#endif
      const VecF comb = comb_of(r);
      facc[r] = FmaF(ToF(acc), comb, facc[r]);
    }
  } else {
#if DH_IDOT_VNNI
    const VecI corr = Shl7I32(Dpbusd(ZeroI(), SetI8(1), v));
#else
    const VecI absw = _mm256_abs_epi8(v);  // -128 -> 0x80 = 128 as the unsigned operand
#endif
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const VecI xq = LoadI(xc[r] + b);
#if DH_IDOT_VNNI
      const VecI acc = SubI32(Dpbusd(ZeroI(), xq, v), corr);
#else
      const VecI pairs = _mm256_maddubs_epi16(absw, _mm256_sign_epi8(xq, v));
      const VecI acc = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
      const VecF comb = comb_of(r);
      facc[r] = FmaF(ToF(acc), comb, facc[r]);
    }
  }
}

constexpr int64_t ChunkColsOf(bool int4) { return int4 ? 2 * kBytes : kBytes; }

#if !DH_IDOT_VNNI
// A run of 4 chunks (8 groups of 32, 128 code bytes at q) against one row of x (even and odd
// columns' codes at xe, xo): the i32 dot of each group, in the lane order [0 2 4 6 | 1 3 5 7]
// (the runs' arranged scale products). Each chunk's vpmaddubsw pair sums (int16, 8 lanes per
// group) are folded with three vphaddw, so one vpmaddwd serves the run instead of one per
// chunk. Called once per row of x, which reloads the run's codes from L1. Zen 1, 8960 x 1536
// from memory, two threads: one row 592-626 -> 568-575 us, 4 rows 1769-1814 -> 1610-1626, 8 rows
// 3597-3722 -> 3178-3268 (bench/README.md "Benchmark weights in huge pages, int4 decoding").
// No int16 lane overflows: after the folds each holds 16 of its group's 32 products of codes
// 0..15 and x codes -127..127, at most 16 * 15 * 127 = 30480 in magnitude
// (IntegerDotExtremeCodesExact reaches it).
DH_IDOT_TARGET inline __attribute__((always_inline)) VecI RunDotsAvx2(const uint8_t* q,
                                                                      const uint8_t* xe,
                                                                      const uint8_t* xo) {
  VecI pairs[4];
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    VecI lo, hi;
    SplitNibbles(LoadI(q + c * kBytes), &lo, &hi);
    pairs[c] = PairSumsInt4(lo, hi, LoadI(xe + c * kBytes), LoadI(xo + c * kBytes));
  }
  const VecI folded = _mm256_hadd_epi16(_mm256_hadd_epi16(pairs[0], pairs[1]),
                                        _mm256_hadd_epi16(pairs[2], pairs[3]));
  return _mm256_madd_epi16(folded, _mm256_set1_epi16(1));
}
#endif

// One row of x streams each weight row once, and the hardware prefetcher alone left the
// two-thread M = 1 kernels well below their in-cache rate from memory, so they prefetch the codes
// kPrefetchAhead bytes ahead (rows lie back to back, so this runs into the next rows): the
// 256-bit kernels in their runs of chunks, the 512-bit kernel in its two-chunk steps.
// Zen 1 (256 bits), bench_quant M = 1, 8960 x 1536, two threads, 512 / 1024 / 2048 bytes ahead
// alternated twice: int8 1073-1121 / 997-1021 / 978-1002 us, int4 639-648 / 618-621 / 608-642 us
// (none: int8 1149, int4 682-708; bench/README.md "Zen 1, session 12").
// Zen 5 (512 bits), alternated (bench/README.md "Zen 5, session 17"): the same bench_quant call,
// five rounds, medians int8 266 -> 209 us, int4 147 -> 131 (4096 ahead: 224 and 131);
// Qwen2-1.5B decode tg32, four rounds, int8 18.9-34.1 -> 31.5-40.3 and int4 38.2-52.6 ->
// 37.9-59.2 tokens/s; V2-Lite's 4-layer shape int4 decode, three rounds, 122-135 -> 143-150. In
// cache (--n 512 --mb 1, one thread) it costs 1-2 %.
constexpr int64_t kPrefetchAhead = DH_IDOT_BITS == 512 ? 8192 : 1024;
DH_IDOT_TARGET inline __attribute__((always_inline)) void PrefetchCodes(const uint8_t* p,
                                                                        int64_t bytes) {
#pragma GCC unroll 8
  for (int64_t i = 0; i < bytes; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchAhead + i), _MM_HINT_T0);
  }
}

// Output rows [n_begin, n_end) for x rows [r0, r0 + MR): each vector of weight codes is loaded
// once and multiplied with the MR rows of quantized x. kMode is a template parameter so the chunk
// loop has no branches. kPer (kPermute only): the groups per chunk when known at compile time
// (2 or 4, the common group sizes); then kLanes / kPer chunks in a row share one vector of
// scales, loaded and widened once and permuted onto each chunk's lanes with a constant index.
// kPer = 0 computes the scales of every chunk from its offset.
template <int MR, bool kInt4, ScaleMode kMode, int kPer = 0>
DH_IDOT_TARGET void DotRows(const QuantMatMulArgs& a, const QuantizedActs& x, int64_t r0,
                            int64_t n_begin, int64_t n_end) {
  const int64_t k = a.k, g = a.group_size < k ? a.group_size : k;
  const int64_t row_len = kInt4 ? (k + 1) / 2 : k;  // bytes of codes per weight row
  const int64_t full = row_len / kBytes * kBytes;
  constexpr int64_t kChunkCols = ChunkColsOf(kInt4), kLaneCols = kInt4 ? 8 : 4;
  const int64_t ngroups = (k + g - 1) / g;
  constexpr bool kPermLike = kMode == ScaleMode::kPermute || kMode == ScaleMode::kBlock32;
  const int per_chunk = kPermLike ? static_cast<int>(kChunkCols / g) : 1;
  static_assert(kPer == 0 || (kMode == ScaleMode::kPermute && kLanes % kPer == 0));
  constexpr int kSuper = kPer > 0 ? kLanes / kPer : 1;  // chunks per vector of scales
  // Lane i of chunk c takes group c * kPer + i * kPer / kLanes of the run's kLanes groups. On 256
  // bits the run's scales are first arranged so that every chunk finds its groups within each
  // 128-bit half (half_order: half h holds, chunk after chunk, the groups of the chunk's half h),
  // and each chunk picks them with an immediate in-half permute (PickInHalvesF) instead of
  // crossing halves; on 512 bits each chunk permutes the run's scales by its own index vector.
  [[maybe_unused]] VecI super_idx[kSuper];
  [[maybe_unused]] VecI half_order = ZeroI();
  // int4 groups of one x block (kPer 2 on 256 bits, 4 on 512): the run forms the products
  // x_scale * w_scale once per group (the same f32 products each chunk formed from x's lane
  // scales before).
  constexpr bool kRunComb = kInt4 && kPer > 0 && ChunkColsOf(kInt4) / kPer == kXBlock;
  if constexpr (kPer > 0 && DH_IDOT_BITS == 256) {
    constexpr int kHalf = kLanes / 2;
    alignas(64) int32_t order[kLanes];
    for (int c = 0; c < kSuper; ++c) {
      for (int i = 0; i < kLanes; ++i) {
        const int h = i / kHalf, slot = c * kPer / 2 + (i % kHalf) * kPer / kLanes;
        order[h * kHalf + slot] = c * kPer + i * kPer / kLanes;  // PickImm's slot for lane i
      }
    }
    half_order = LoadI(order);
  } else if constexpr (kPer > 0) {
    for (int c = 0; c < kSuper; ++c) {
      alignas(64) int32_t lanes[kLanes];
      for (int i = 0; i < kLanes; ++i) lanes[i] = c * kPer + i * kPer / kLanes;
      super_idx[c] = LoadI(lanes);
    }
  }
  const int64_t chunks_per_group = kMode == ScaleMode::kPerChunk ? g / kChunkCols : 1;
  alignas(64) int32_t idx_lanes[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    idx_lanes[i] = kPermLike ? static_cast<int32_t>(i * kLaneCols / g) : 0;
  }
  const VecI idx = LoadI(idx_lanes);
  // kBlock32 (int8 on 256 bits, DotRowsAnyMode): one group per 32-byte chunk, kLanes per run.
  constexpr int kRun32 = kLanes;
  static_assert(kMode != ScaleMode::kBlock32 || (DH_IDOT_BITS == 256 && !kInt4));
  const int64_t half = x.row_bytes / 2;
  const uint8_t* xc[MR];
  const float* xl[MR];
  const float* gs[MR];
  const float* xb[MR];  // x block scales (one per 32 columns)
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    xb[r] = x.block_scales.data() + (r0 + r) * x.blocks;
    xc[r] = x.codes.data() + (r0 + r) * x.row_bytes;
    xl[r] = x.lane_scales.data() + (r0 + r) * x.lanes;
    gs[r] = x.group_sums.data() + (r0 + r) * x.groups;
  }
  // kPer runs: a run's kLanes values laid out for its chunks (arrange, once per run), and chunk
  // c's lanes picked from them (pick): on 256 bits through half_order and an in-half permute.
  auto arrange = [&](VecF v) DH_IDOT_TARGET {
    if constexpr (DH_IDOT_BITS == 256) return PermuteF(v, half_order);
    return v;
  };
  auto pick = [&](VecF arranged, int c) DH_IDOT_TARGET {
    if constexpr (DH_IDOT_BITS == 256 && kPer > 0) return PickInHalvesF<kPer>(arranged, c);
    return PermuteF(arranged, super_idx[c]);
  };
  [[maybe_unused]] const VecF zero_offset = SetF(static_cast<float>(a.zero_offset));
  const uint8_t* qbase = static_cast<const uint8_t*>(a.q);
  for (int64_t j = n_begin; j < n_end; ++j) {
    const uint8_t* q = qbase + j * a.q_stride;
    const uint16_t* s = a.scales + j * a.scale_stride;
    VecF facc[MR], facc2[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) facc[r] = facc2[r] = ZeroF();
    // Scales of the chunk at byte b. kPerChunk: gi, the group of its first column, advanced
    // without divisions; kPermute: its groups start at (b / kBytes) * per_chunk, computed from
    // b so no counter is carried from chunk to chunk. in_row: the chunk's groups all exist
    // (every chunk but a partial last one).
    int64_t gi = 0, chunk_in_group = 0;
    const VecF one_scale = SetF(_cvtsh_ss(s[0]));
    auto scales_at = [&](int64_t b, bool in_row) DH_IDOT_TARGET {
      if constexpr (kMode == ScaleMode::kOne) {
        return one_scale;
      } else if constexpr (kMode == ScaleMode::kPerChunk) {
        const VecF w = SetF(_cvtsh_ss(s[gi]));
        if (++chunk_in_group == chunks_per_group) {
          chunk_in_group = 0;
          ++gi;
        }
        return w;
      } else {
        const int64_t g0 = b / kBytes * per_chunk;
        return PermuteF(LoadScales(s + g0, per_chunk, in_row ? per_chunk : ngroups - g0), idx);
      }
    };
    int64_t b = 0;
    if constexpr (kMode == ScaleMode::kBlock32) {
      // Runs of kLanes groups (kRun32 chunks): x block scale times weight scale once per group,
      // then broadcast onto each chunk's lanes.
      for (; b + kRun32 * kBytes <= full; b += kRun32 * kBytes) {
        PrefetchCodes(q + b, kRun32 * kBytes);
        const int64_t g0 = b / kBytes;  // one group per chunk
        const VecF ws = WidenHalves(s + g0);
        // One group per chunk (int8): each chunk broadcasts its product from the half that holds
        // it in both halves, an in-half permute (a store and 8 broadcast reloads per run cost
        // 12-16 of 94 us in bench_quant on Zen 1; this 94 -> 89 us).
        VecF low_twice[MR], high_twice[MR];
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const VecF run_comb = MulF(ws, LoadF(xb[r] + g0));
          low_twice[r] = BothHalvesF(run_comb, false);
          high_twice[r] = BothHalvesF(run_comb, true);
        }
#pragma GCC unroll 16
        for (int c = 0; c < kRun32; ++c) {
          VecF comb[MR];
#pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            comb[r] = PickInHalvesF<2>(c < kLanes / 2 ? low_twice[r] : high_twice[r],
                                       c % (kLanes / 2));
          }
          Chunk<MR, kInt4>(LoadI(q + b + c * kBytes), ZeroF(), b + c * kBytes, half, xc, xl,
                           (c & 1) != 0 ? facc2 : facc, comb);
        }
      }
    }
    [[maybe_unused]] int64_t mins_done = 0;  // int4: groups whose zero-point term is in facc2
    if constexpr (kPer > 0) {  // whole runs of kSuper chunks: kLanes groups, all in the row
      [[maybe_unused]] const uint8_t* z = kInt4 ? a.zeros + j * a.zero_stride : nullptr;
      for (; b + kSuper * kBytes <= full; b += kSuper * kBytes) {
        const int64_t g0 = b / kBytes * kPer;
        PrefetchCodes(q + b, kSuper * kBytes);
        const VecF sv = WidenHalves(s + g0);
        if constexpr (kInt4) {  // the run's zero-point term, from the scales widened here
          const VecF zs = ZeroTimesScale(z, g0, zero_offset, sv);
#pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) facc2[r] = FnmaF(zs, LoadF(gs[r] + g0), facc2[r]);
          mins_done = g0 + kLanes;
        }
        // int4 groups of 32 = x blocks (kRunComb): the products x_scale * w_scale once per
        // group for the run, each chunk picking its own (AVX2: the run's dots folded first, one
        // FMA per run); else each chunk its weight scales.
        constexpr int kPicked = kRunComb ? MR : 1;  // products per x row, or the scales once
        VecF arranged[kPicked];
#pragma GCC unroll 16
        for (int r = 0; r < kPicked; ++r) {
          arranged[r] = arrange(kRunComb ? MulF(sv, LoadF(xb[r] + g0)) : sv);
        }
#if !DH_IDOT_VNNI
        if constexpr (kRunComb) {
#pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            facc[r] = FmaF(ToF(RunDotsAvx2(q + b, xc[r] + b, xc[r] + half + b)), arranged[r],
                           facc[r]);
          }
          continue;
        }
#endif
#pragma GCC unroll 16
        for (int c = 0; c < kSuper; ++c) {
          VecF comb[kPicked];
#pragma GCC unroll 16
          for (int r = 0; r < kPicked; ++r) comb[r] = pick(arranged[r], c);
          Chunk<MR, kInt4>(LoadI(q + b + c * kBytes), kRunComb ? ZeroF() : comb[0],
                           b + c * kBytes, half, xc, xl, (c & 1) != 0 ? facc2 : facc,
                           kRunComb ? comb : nullptr);
        }
      }
    }
    for (; b + 2 * kBytes <= full; b += 2 * kBytes) {  // two chunks, two accumulator sets
      if constexpr (DH_IDOT_BITS == 512) PrefetchCodes(q + b, 2 * kBytes);  // 256: in the runs
      const VecI v0 = LoadI(q + b), v1 = LoadI(q + b + kBytes);
      const VecF w0 = scales_at(b, true);
      const VecF w1 = scales_at(b + kBytes, true);
      Chunk<MR, kInt4>(v0, w0, b, half, xc, xl, facc);
      Chunk<MR, kInt4>(v1, w1, b + kBytes, half, xc, xl, facc2);
    }
    if (b < full) {
      Chunk<MR, kInt4>(LoadI(q + b), scales_at(b, true), b, half, xc, xl, facc);
      b += kBytes;
    }
    if (b < row_len) {  // partial last chunk: a zero-padded copy (x codes past k add nothing)
      alignas(64) uint8_t tail[kBytes] = {};
      for (int64_t i = 0; i < row_len - b; ++i) tail[i] = q[b + i];
      Chunk<MR, kInt4>(LoadI(tail), scales_at(b, false), b, half, xc, xl, facc2);
    }
    const float bias = a.bias ? a.bias[j] : 0.0f;
    float min_tail[MR] = {};
    if constexpr (kInt4) {
      AddMins<MR>(s, a.zeros + j * a.zero_stride, a.zero_offset, gs, mins_done, ngroups, facc2,
                  min_tail);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      a.out[(r0 + r) * a.out_stride + j] = SumF(AddF(facc[r], facc2[r])) + min_tail[r] + bias;
    }
  }
}

template <int MR, bool kInt4>
void DotRowsAnyMode(const QuantMatMulArgs& a, const QuantizedActs& x, int64_t r0,
                    int64_t n_begin, int64_t n_end) {
  // int8 groups of 32 on 256 bits, one row of x (bench/README.md "Zen 1"): the scale products
  // once per group, M = 1 int8 in cache 126-133 -> 102-107 us. Not for int4 (no change), for
  // more rows (int8 M = 4: 404-423 -> 500 us) or on 512 bits (not measured).
  if constexpr (DH_IDOT_BITS == 256 && !kInt4 && MR == 1) {
    if (a.group_size == 32 && a.k > 32) {
      return DotRows<MR, kInt4, ScaleMode::kBlock32>(a, x, r0, n_begin, n_end);
    }
  }
  switch (ModeFor(kInt4, a.k, a.group_size < a.k ? a.group_size : a.k)) {
    case ScaleMode::kOne: return DotRows<MR, kInt4, ScaleMode::kOne>(a, x, r0, n_begin, n_end);
    case ScaleMode::kPerChunk:
      return DotRows<MR, kInt4, ScaleMode::kPerChunk>(a, x, r0, n_begin, n_end);
    case ScaleMode::kBlock32:  // ModeFor never picks it
    case ScaleMode::kPermute:
      // The shared scale vector pays on 256 bits (AVX2 int4 group 32: 7.8 -> 6.5 us per call in
      // bench_quant). On 512 bits only int4 groups of one x block take it (Zen 5, in cache, M = 1
      // 13.1-14.3 -> 10.8-11.2 us; docs/kernels.md): int8 runs measured slower (7.7 -> 11.5 us)
      // and other int4 groups were not measured.
      const int64_t g = a.group_size < a.k ? a.group_size : a.k;
      switch (DH_IDOT_BITS == 256 || (kInt4 && g == kXBlock) ? ChunkColsOf(kInt4) / g : 0) {
        case 2: return DotRows<MR, kInt4, ScaleMode::kPermute, 2>(a, x, r0, n_begin, n_end);
        case 4: return DotRows<MR, kInt4, ScaleMode::kPermute, 4>(a, x, r0, n_begin, n_end);
        default: return DotRows<MR, kInt4, ScaleMode::kPermute>(a, x, r0, n_begin, n_end);
      }
  }
}

// ---- Packed tiles: the integer GEMM for many rows of x (prefill, batches) ----
// kLanes weight rows are packed side by side: step t of a tile is one vector whose lane i holds
// bytes [4t, 4t + 4) of weight row j0 + i, so one vpdpbusd against the 4 x codes of those
// columns (the same 4 bytes in every lane) advances kLanes dot products at once. An x block of
// 32 columns (4 steps of int4 nibble pairs, 8 steps of int8) ends with its kLanes exact i32 dots
// in one vector, so one conversion, one scale product and one FMA per x row and block serve
// kLanes outputs (the per-row kernel above spends them per 4 or 8 columns), and the outputs come
// out as a vector of kLanes adjacent columns: no horizontal sums. A tile is packed once per call
// (in-register transposes) and used by every row of x.
//
// int4: step t's low nibbles are the even columns 8t', 8t'+2, .. of the block and match 4 bytes
// of x's even half, the high nibbles its odd half (QuantizedActs keeps them apart), as above.
// int8 (VNNI): x holds q + 128, so each block's sum starts from -128 * (the block's code sum)
// per lane, kept with the tile. int8 (AVX2): |w| against x (q, not offset) with w's sign, as in
// Chunk.
// Numerics: each block's dot is exact in i32 and scaled once (x scale * weight scale); the
// error bound of quant_vnni.h holds with fewer f32 roundings.

// One packed tile of kLanes weight rows (lanes past the last row hold zeros).
struct PackedTile {
  std::vector<int32_t> codes;  // [steps][kLanes]
  std::vector<float> scales;   // [groups][kLanes]
  std::vector<float> zs;       // int4: [groups][kLanes], (zero + offset) * scale
  std::vector<int32_t> corr;   // int8 with VNNI: [blocks][kLanes], -128 * the block's code sum
};

template <bool kInt4>
constexpr int64_t StepsPerBlock() {
  return kInt4 ? kXBlock / 8 : kXBlock / 4;
}

// Packs weight rows [j0, j0 + rows) (rows <= kLanes) into t: whole kLanes x kLanes blocks of
// dwords by in-register transposes, the rest (a row's last bytes, a partial tile) byte by byte.
// Scales (and int4 zero terms) are widened row by row into scratch and transposed the same way.
// The transposes read kLanes rows at once, a pattern the hardware prefetchers do not follow from
// memory, so the next tile's rows are prefetched. kSpreadPrefetch (512 bits): each transpose
// prefetches the same 64 columns of the next tile's next_rows rows, so those lines arrive spread
// over this tile's packing. Otherwise (256 bits) PackedAll prefetches the next tile in one burst,
// line by line, after PackTile (Zen 1: int8 M = 8 from memory 1225 -> 782 us against none). On
// Zen 5 the spread form beat the burst on 512 bits (bench_quant --threads 2 --m 8, 8960 x 1536,
// three rounds alternated: int4 672-704 -> 587-591 us, int8 813-876 -> 741-757) and was no
// faster on 256 bits (DH_CPU_TIER=avx2 int4 pp512 120-122 against 116-120 tokens/s;
// bench/README.md "Zen 5, session 16").
constexpr bool kSpreadPrefetch = DH_IDOT_BITS == 512;

template <bool kInt4>
DH_IDOT_TARGET void PackTile(const QuantMatMulArgs& a, int64_t j0, int64_t rows,
                             int64_t next_rows, PackedTile* t) {
  const int64_t k = a.k, g = a.group_size < k ? a.group_size : k;
  const int64_t row_len = kInt4 ? (k + 1) / 2 : k;
  const int64_t nblocks = (k + kXBlock - 1) / kXBlock;
  const int64_t steps = nblocks * StepsPerBlock<kInt4>();
  const int64_t ngroups = (k + g - 1) / g;
  const int64_t groups_up = (ngroups + kLanes - 1) / kLanes * kLanes;
  t->codes.resize(static_cast<size_t>(steps * kLanes));
  t->scales.resize(static_cast<size_t>(groups_up * kLanes));
  if (kInt4) t->zs.resize(static_cast<size_t>(groups_up * kLanes));
  const uint8_t* q0 = static_cast<const uint8_t*>(a.q) + j0 * a.q_stride;
  int32_t* codes = t->codes.data();
  int64_t s = 0;
  if (rows == kLanes) {
    const uint8_t* next = q0 + kLanes * a.q_stride;
    for (; 4 * (s + kLanes) <= row_len; s += kLanes) {
      if constexpr (kSpreadPrefetch) {
        for (int64_t i = 0; i < next_rows; ++i) {
          __builtin_prefetch(next + i * a.q_stride + 4 * s, 0, 3);
        }
      }
      TransposeDwords(q0 + 4 * s, a.q_stride, codes + s * kLanes);
    }
  }
  for (; s < steps; ++s) {  // zero past the row and past the last row
    for (int i = 0; i < kLanes; ++i) {
      uint8_t bytes[4] = {};
      for (int64_t c = 4 * s; c < 4 * s + 4 && c < row_len && i < rows; ++c) {
        bytes[c - 4 * s] = q0[i * a.q_stride + c];
      }
      std::memcpy(codes + s * kLanes + i, bytes, 4);
    }
  }
  // Scales and zero terms, [row][group] in scratch (zero past the groups and rows), transposed.
  thread_local std::vector<float> sc, zs;
  sc.assign(static_cast<size_t>(kLanes * groups_up), 0.0f);
  if (kInt4) zs.assign(static_cast<size_t>(kLanes * groups_up), 0.0f);
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const VecF off = SetF(static_cast<float>(a.zero_offset));
  for (int64_t i = 0; i < rows; ++i) {
    const uint16_t* h = a.scales + (j0 + i) * a.scale_stride;
    const uint8_t* z = kInt4 ? a.zeros + (j0 + i) * a.zero_stride : nullptr;
    float* srow = sc.data() + i * groups_up;
    float* zrow = kInt4 ? zs.data() + i * groups_up : nullptr;
    int64_t gi = 0;
    for (; gi + kLanes <= ngroups; gi += kLanes) {
      const VecF v = WidenHalves(h + gi);
      StoreF(srow + gi, v);
      if constexpr (kInt4) {  // kLanes zero nibbles, low first, widened (exact small integers)
        uint64_t zw = 0;
        std::memcpy(&zw, z + gi / 2, kLanes / 2);
        const __m128i zb = _mm_cvtsi64_si128(static_cast<int64_t>(zw));
        const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(zb, low4),
                                              _mm_and_si128(_mm_srli_epi16(zb, 4), low4));
        StoreF(zrow + gi, MulF(AddF(ToF(WidenBytes(nib)), off), v));
      }
    }
    for (; gi < ngroups; ++gi) {
      srow[gi] = _cvtsh_ss(h[gi]);
      if constexpr (kInt4) {
        zrow[gi] = static_cast<float>(ZeroNibble(z, gi) + a.zero_offset) * srow[gi];
      }
    }
  }
  for (int64_t gi = 0; gi < groups_up; gi += kLanes) {
    TransposeDwords(reinterpret_cast<const uint8_t*>(sc.data() + gi), groups_up * 4,
                    reinterpret_cast<int32_t*>(t->scales.data() + gi * kLanes));
    if constexpr (kInt4) {
      TransposeDwords(reinterpret_cast<const uint8_t*>(zs.data() + gi), groups_up * 4,
                      reinterpret_cast<int32_t*>(t->zs.data() + gi * kLanes));
    }
  }
#if DH_IDOT_VNNI
  if constexpr (!kInt4) {
    t->corr.resize(static_cast<size_t>(nblocks * kLanes));
    for (int64_t b = 0; b < nblocks; ++b) {
      VecI sum = ZeroI();
      for (int64_t st = 0; st < StepsPerBlock<false>(); ++st) {
        sum = Dpbusd(sum, SetI8(1), LoadI(codes + (b * StepsPerBlock<false>() + st) * kLanes));
      }
      StoreI(t->corr.data() + b * kLanes, SubI32(ZeroI(), Shl7I32(sum)));
    }
  }
#endif
}

// The codes of one whole prepacked tile (16 rows at q0, q_stride apart; quant_vnni.h
// PrepackTiles) by dword transposes (one of 16 x 16 on 512 bits, two of 8 x 8 on 256), as far as
// whole runs of kBytes of the rows go; returns the steps written (the caller writes the rest).
[[maybe_unused]] DH_IDOT_TARGET int64_t PrepackTileCodes(const uint8_t* q0, int64_t q_stride,
                                                         int64_t row_bytes, int32_t* codes) {
  static_assert(kPrepackedRows % kLanes == 0);
  int64_t s = 0;
  for (; 4 * (s + kLanes) <= row_bytes; s += kLanes) {
    for (int64_t v = 0; v < kPrepackedRows; v += kLanes) {
      TransposeDwords(q0 + v * q_stride + 4 * s, q_stride, codes + s * kPrepackedRows + v,
                      kPrepackedRows);
    }
  }
  return s;
}

// How far ahead of the block being read PackedRows prefetches a prepacked weight's stream
// (Zen 5, one thread, M = 1: 1024 bytes 504 us, 4096 460, 8192 462, 16384 349; 32768 no
// better than 16384 on two threads).
constexpr int64_t kTileAhead = 16384;

// Where PackedRows finds a tile: packed by this call (PackedTile: f32 scales and zero terms,
// kLanes dwords per step) or prepacked at load (quant_vnni.h, PrepackedLayout: f16 scales and
// zero nibbles, 16 dwords per step, this kernel's lanes from lane0).
struct TileRef {
  const int32_t* codes = nullptr;  // step s of this tile's lanes at codes + s * (lanes per step)
  const float* scales = nullptr;   // per call: [group][kLanes]
  const float* zs = nullptr;       // per call, int4: [group][kLanes]
  const int32_t* corr = nullptr;   // int8 with VNNI: [block][lanes per step]
  const uint16_t* h = nullptr;     // prepacked: f16 scales, group g's from h + 16 * g
  const uint8_t* z = nullptr;      // prepacked int4: zero nibbles, group g's from z + 8 * g
  // Prepacked: where block b prefetches, ahead + b * ahead_step: the tile's whole stream (codes,
  // scales, zero points or block sums) spread evenly over its blocks, kTileAhead bytes on.
  const char* ahead = nullptr;
  int64_t ahead_step = 0;  // a multiple of 64
};

DH_IDOT_TARGET inline TileRef RefOf(const PackedTile& t) {
  TileRef r;
  r.codes = t.codes.data();
  r.scales = t.scales.data();
  r.zs = t.zs.data();
  r.corr = t.corr.data();
  return r;
}

// A prepacked tile's stream ahead of block b: the block's share of it (TileRef::ahead).
DH_IDOT_TARGET inline __attribute__((always_inline)) void PrefetchAhead(const TileRef& t,
                                                                        int64_t b) {
  const char* p = t.ahead + b * t.ahead_step;
  for (int64_t o = 0; o < t.ahead_step; o += 64) __builtin_prefetch(p + o, 0, 3);
}

// One block of 32 columns of one tile against MR rows of x: facc[r] += (the block's i32 dots of
// row r) * ws * (row r's x scale for the block). wb: the block's codes (step dwords apart); xb[h]:
// quad h's codes of the block; xs[h]: quad h's 4 scales of the block; corr: int8 VNNI's block
// sums (kLanes of them), else unused.
template <int MR, bool kInt4>
DH_IDOT_TARGET inline __attribute__((always_inline)) void BlockDots(const int32_t* wb, int64_t step,
                                                                    const uint8_t* const* xb,
                                                                    const float* const* xs,
                                                                    const int32_t* corr, VecF ws,
                                                                    VecF* facc) {
  constexpr int64_t kSteps = StepsPerBlock<kInt4>();
#if !DH_IDOT_VNNI
  if constexpr (!kInt4) {
    // AVX2 int8, step by step over each quad of x rows: a step's codes are loaded and their
    // magnitudes formed once for the quad's 4 rows, whose i32 sums stay in registers.
    static_assert(MR <= 4 || MR % 4 == 0, "whole quads of x rows, or one partial quad");
    (void)corr;
    const VecI ones16 = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int h = 0; h < (MR + 3) / 4; ++h) {
      constexpr int kRows = MR < 4 ? MR : 4;
      VecI acc[kRows];
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) acc[r] = ZeroI();
#pragma GCC unroll 8
      for (int d = 0; d < 8; ++d) {
        const VecI wd = LoadI(wb + d * step);
        const VecI aw = _mm256_abs_epi8(wd);
#pragma GCC unroll 4
        for (int r = 0; r < kRows; ++r) {
          const VecI xq = BroadcastDword(xb[h] + r * 4 + 16 * d);  // q itself
          const VecI pairs = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq, wd));
          acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(pairs, ones16));
          KeepChain(acc[r]);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) {
        facc[4 * h + r] = FmaF(ToF(acc[r]), MulF(ws, SetF(xs[h][r])), facc[4 * h + r]);
      }
    }
    return;
  }
#endif
  VecI w[8];  // int4: low then high nibbles of each step (dword 2 * step + half); int8: steps
  if constexpr (kInt4) {
#pragma GCC unroll 8
    for (int st = 0; st < kSteps; ++st) {
      SplitNibbles(LoadI(wb + st * step), &w[2 * st], &w[2 * st + 1]);
    }
  } else {
#pragma GCC unroll 8
    for (int st = 0; st < kSteps; ++st) w[st] = LoadI(wb + st * step);
  }
#if DH_IDOT_VNNI
  VecI start = ZeroI();
  if constexpr (!kInt4) start = LoadI(corr);
#else
  (void)corr;
  const VecI ones16 = _mm256_set1_epi16(1);
#endif
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    const uint8_t* x = xb[r / 4] + (r % 4) * 4;  // dword d at x + 16 * d
#if DH_IDOT_VNNI
    // Two chains of 4 (even and odd dwords) halve the dependent vpdpbusd latency.
    VecI acc = start, acc2 = ZeroI();
#pragma GCC unroll 8
    for (int d = 0; d < 8; d += 2) {
      if constexpr (kInt4) {
        acc = Dpbusd(acc, w[d], BroadcastDword(x + 16 * d));
        acc2 = Dpbusd(acc2, w[d + 1], BroadcastDword(x + 16 * (d + 1)));
      } else {
        acc = Dpbusd(acc, BroadcastDword(x + 16 * d), w[d]);
        acc2 = Dpbusd(acc2, BroadcastDword(x + 16 * (d + 1)), w[d + 1]);
      }
    }
    acc = AddI32(acc, acc2);
#else
    // int4 (AVX2 int8 went step by step above). i16 pair sums: 8 dwords x 2 * 15 * 127 = 30480
    // at most: exact.
    VecI pairs = _mm256_maddubs_epi16(w[0], BroadcastDword(x));
#pragma GCC unroll 8
    for (int d = 1; d < 8; ++d) {
      pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[d], BroadcastDword(x + 16 * d)));
      KeepChain(pairs);
    }
    const VecI acc = _mm256_madd_epi16(pairs, ones16);
#endif
    facc[r] = FmaF(ToF(acc), MulF(ws, SetF(xs[r / 4][r % 4])), facc[r]);
  }
}

// int4: group gi's (zero + offset) * scale of the tile's rows times each x row's sum over the
// group, off the outputs. gs[h]: quad h's 4 sums of the group.
template <int MR, bool kPre>
DH_IDOT_TARGET inline __attribute__((always_inline)) void ZeroTerms(const TileRef& t,
                                                                    const float* const* gs,
                                                                    int64_t gi, VecF off, VecF ws,
                                                                    VecF* facc) {
  // Prepacked: (zero nibble + offset) * scale of this group's kLanes rows, formed here.
  const VecF zs = kPre ? ZeroTimesScale(t.z + gi * (kPrepackedRows / 2), 0, off, ws)
                       : LoadF(t.zs + gi * kLanes);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) facc[r] = FnmaF(zs, SetF(gs[r / 4][r % 4]), facc[r]);
}

// Outputs [j0, j0 + rows) of x rows [4 * q0, 4 * q0 + MR) (packed QuantizedActs; rows past a.m
// are padding and not stored) from one tile. All x addresses are fixed offsets from one pointer
// per quad. kPre: the tile is prepacked.
template <int MR, bool kInt4, bool kPre>
DH_IDOT_TARGET void PackedRows(const QuantMatMulArgs& a, const QuantizedActs& x, const TileRef& t,
                               int64_t q0, int64_t j0, int64_t rows) {
  constexpr int kQuads = (MR + 3) / 4;
  const int64_t k = a.k, g = a.group_size < k ? a.group_size : k;
  const int64_t nblocks = x.blocks;
  const int64_t ngroups = (k + g - 1) / g;
  const int64_t blocks_per_group = g >= k ? nblocks : g / kXBlock;
  constexpr int64_t kSteps = StepsPerBlock<kInt4>();
  // Quad q0's codes, scales and sums; quad q0 + h's lie h quad strides on.
  const uint8_t* xc = x.codes.data() + q0 * nblocks * 128;
  const float* xs = x.lane_scales.data() + q0 * nblocks * 4;
  const float* gs = kInt4 ? x.group_sums.data() + q0 * ngroups * 4 : nullptr;
  const int64_t quad_codes = nblocks * 128, quad_scales = nblocks * 4, quad_sums = ngroups * 4;
  VecF facc[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) facc[r] = ZeroF();
  const int32_t* codes = t.codes;
  const int64_t step = kPre ? kPrepackedRows : kLanes;
  const VecF off = SetF(static_cast<float>(a.zero_offset));
  const uint8_t* xb[kQuads];
  const float* xsb[kQuads];
  const float* gsb[kQuads];
  if (DH_IDOT_BITS == 512 && blocks_per_group == 1) {
    // One block per group (group size 32, the default) on 512 bits: one flat loop, every pointer
    // a fixed stride per block, so fewer of them spill than in the loop over groups below
    // (Zen 5, in cache, medians: int4 M = 8 34.6 -> 32.2 us, M = 4 21.0 -> 17.7; the 256-bit
    // kernels' int4 ran 2-5 % slower in it, so they keep the loop below; bench/README.md "Zen 5,
    // session 23").
    // Sums strided like the scales (groups == blocks here): one stride register, not two
    // (bench/README.md "Zen 5, session 23": in cache, int4 / int8 M = 8 minimums 32.2 -> 30.2 /
    // 32.4 -> 30.4 us against a pointer per quad and array).
    for (int64_t b = 0; b < nblocks; ++b) {
      const VecF ws = kPre ? WidenHalves(t.h + b * kPrepackedRows) : LoadF(t.scales + b * kLanes);
      if constexpr (kPre) PrefetchAhead(t, b);
#pragma GCC unroll 4
      for (int h = 0; h < kQuads; ++h) {
        xb[h] = xc + b * 128 + h * quad_codes;
        xsb[h] = xs + b * 4 + h * quad_scales;
        if constexpr (kInt4) gsb[h] = gs + b * 4 + h * quad_scales;
      }
      BlockDots<MR, kInt4>(codes + b * kSteps * step, step, xb, xsb,
                           kInt4 ? nullptr : t.corr + b * step, ws, facc);
      if constexpr (kInt4) ZeroTerms<MR, kPre>(t, gsb, b, off, ws, facc);
    }
  } else {
    for (int64_t gi = 0; gi < ngroups; ++gi) {
      const VecF ws = kPre ? WidenHalves(t.h + gi * kPrepackedRows) : LoadF(t.scales + gi * kLanes);
      const int64_t b_end =
          (gi + 1) * blocks_per_group < nblocks ? (gi + 1) * blocks_per_group : nblocks;
      for (int64_t b = gi * blocks_per_group; b < b_end; ++b) {
        if constexpr (kPre) PrefetchAhead(t, b);
#pragma GCC unroll 4
        for (int h = 0; h < kQuads; ++h) {
          xb[h] = xc + b * 128 + h * quad_codes;
          xsb[h] = xs + b * 4 + h * quad_scales;
        }
        BlockDots<MR, kInt4>(codes + b * kSteps * step, step, xb, xsb,
                             kInt4 ? nullptr : t.corr + b * step, ws, facc);
      }
      if constexpr (kInt4) {
#pragma GCC unroll 4
        for (int h = 0; h < kQuads; ++h) gsb[h] = gs + gi * 4 + h * quad_sums;
        ZeroTerms<MR, kPre>(t, gsb, gi, off, ws, facc);
      }
    }
  }
  alignas(64) float bias[kLanes] = {};
  if (a.bias != nullptr) {
    for (int64_t i = 0; i < rows; ++i) bias[i] = a.bias[j0 + i];
  }
  const VecF vb = LoadF(bias);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    const int64_t row = q0 * 4 + r;
    if (row >= a.m) break;  // padding rows of the last quad
    float* o = a.out + row * a.out_stride + j0;
    if (rows == kLanes) {
      StoreF(o, AddF(facc[r], vb));
    } else {
      alignas(64) float tmp[kLanes];
      StoreF(tmp, AddF(facc[r], vb));
      for (int64_t i = 0; i < rows; ++i) o[i] = tmp[i];
    }
  }
}

// Quads of x rows per pass over a packed tile: two (8 rows) on every width. The 256-bit kernels
// took one (4 rows, their 16 registers cannot hold 8 rows' sums beside a block's 8 code vectors)
// until session 35: with two the sums spill, but each pass splits the tile's nibbles and reads
// its lines for twice the rows. Zen 5 under DH_CPU_TIER=avx2, bench_quant --threads 2 from
// memory, 4 -> 8 rows per pass, three rounds (bench/README.md "Zen 5, session 35"): int4 tiles
// 8960 x 1536 M = 8 AVX2 1028-1069 -> 879-900 us, AVX-VNNI 907-957 -> 735-772; M = 32
// 3694-3950 -> 3296-3345, 2958-3098 -> 2764-2890; V2-Lite's whole-model pp512 56.8-61.3 ->
// 62.8-68.6 tokens/s. (One thread in cache the 8-row passes ran as fast as the 4-row ones in
// four of six runs and 1.2x faster in two.)
constexpr int kPackedQuads = 2;

// Every row of x (packed) over one tile: up to 4 rows in one pass of MR = m rows (decode and
// small batches), more in passes of kPackedQuads quads and one of a quad.
template <bool kInt4, bool kPre>
DH_IDOT_TARGET void PassesOverTile(const QuantMatMulArgs& a, const QuantizedActs& x,
                                   const TileRef& t, int64_t j0, int64_t rows) {
  switch (a.m) {
    case 1: return PackedRows<1, kInt4, kPre>(a, x, t, 0, j0, rows);
    case 2: return PackedRows<2, kInt4, kPre>(a, x, t, 0, j0, rows);
    case 3: return PackedRows<3, kInt4, kPre>(a, x, t, 0, j0, rows);
    default: break;
  }
  const int64_t quads = (a.m + 3) / 4;
  int64_t q = 0;
  for (; q + kPackedQuads <= quads; q += kPackedQuads) {
    PackedRows<4 * kPackedQuads, kInt4, kPre>(a, x, t, q, j0, rows);
  }
  if (q < quads) PackedRows<4, kInt4, kPre>(a, x, t, q, j0, rows);
}

// How many times PassesOverTile reads a tile for m rows of x.
constexpr int64_t PassesFor(int64_t m) {
  return m <= 3 ? 1 : ((m + 3) / 4 + kPackedQuads - 1) / kPackedQuads;
}

// Every row of x (packed) over weight rows [n_begin, n_end), one packed tile of kLanes rows at a
// time.
template <bool kInt4>
DH_IDOT_TARGET void PackedAll(const QuantMatMulArgs& a, const QuantizedActs& x, int64_t n_begin,
                              int64_t n_end) {
  thread_local PackedTile tile;  // grown once per thread
  for (int64_t j0 = n_begin; j0 < n_end; j0 += kLanes) {
    const int64_t rows = n_end - j0 < kLanes ? n_end - j0 : kLanes;
    const int64_t after = n_end - j0 - rows;  // rows of the next tiles
    const int64_t next_rows = after < kLanes ? after : kLanes;
    PackTile<kInt4>(a, j0, rows, next_rows, &tile);
    if (!kSpreadPrefetch && next_rows > 0) {  // the burst (PackTile says why and when)
      const uint8_t* p = static_cast<const uint8_t*>(a.q) + (j0 + kLanes) * a.q_stride;
      const int64_t row_len = kInt4 ? (a.k + 1) / 2 : a.k;
      for (int64_t i = 0; i < next_rows; ++i) {
        for (int64_t c = 0; c < row_len; c += 64) __builtin_prefetch(p + i * a.q_stride + c, 0, 3);
      }
    }
    PassesOverTile<kInt4, false>(a, x, RefOf(tile), j0, rows);
  }
}

// Passes over a tile from which the 256-bit kernels read a prepacked tile's halves from a copy
// (PrepackedAll): 8, 64 rows of x in passes of 8. It was chosen as 32 rows in passes of 4, where
// they took tiles packed per call before prepacking; passes of 8 without the copy then ran M = 32
// and 48 faster than passes of 4 with it (bench_quant --threads 2, 2048 x 1408, AVX2 768-806 ->
// 696-716 us and 1100-1180 -> 932-1062; bench/README.md "Zen 5, session 35"), so the count of
// passes was kept. With passes of 4 on Zen 5, bench_quant --threads 2, copy on / off alternated
// in one process (medians of 20 bursts; bench/README.md "Zen 5, session 34"), AVX2, 2048 x
// 2048 / 1408 x 2048 / 8960 x 1536: M = 8 276 / 240, 237 / 210, 900 / 804 us; M = 16 503 /
// 468, 358 / 336, 1668 / 1577; M = 48 1374 / 1408, 946 / 956, 5377 / 6136; M = 512 13835 /
// 15068, 9655 / 10319, 51239 / 61149.
constexpr int64_t kCopyHalfTileMinPasses = 8;

// Sizes `out` for CopyHalfTile's copies of a layout's half tiles (once per call).
template <bool kInt4>
void SizeHalfTile(const PrepackedLayout& l, PackedTile* out) {
  out->codes.resize(static_cast<size_t>(l.blocks * l.steps_per_block * kLanes));
  out->scales.resize(static_cast<size_t>(l.groups * kLanes));
  if constexpr (kInt4) out->zs.resize(static_cast<size_t>(l.groups * kLanes));
  if constexpr (!kInt4) out->corr.resize(static_cast<size_t>(l.blocks * kLanes));
}

// The kLanes lanes of a prepacked tile that `ref` points at (PrepackedAll), copied into `out`
// (sized by SizeHalfTile) as PackTile lays out a tile: codes [step][kLanes], f32 scales and int4
// zero terms ((zero nibble + offset) * scale, as ZeroTerms forms them; off: the offset), int8
// block sums [block][kLanes].
template <bool kInt4>
DH_IDOT_TARGET void CopyHalfTile(const PrepackedLayout& l, VecF off, const TileRef& ref,
                                 PackedTile* out) {
  const int64_t steps = l.blocks * l.steps_per_block;
  for (int64_t s = 0; s < steps; ++s) {
    StoreI(out->codes.data() + s * kLanes, LoadI(ref.codes + s * kPrepackedRows));
  }
  for (int64_t gi = 0; gi < l.groups; ++gi) {
    const VecF ws = WidenHalves(ref.h + gi * kPrepackedRows);
    StoreF(out->scales.data() + gi * kLanes, ws);
    if constexpr (kInt4) {
      StoreF(out->zs.data() + gi * kLanes,
             ZeroTimesScale(ref.z + gi * (kPrepackedRows / 2), 0, off, ws));
    }
  }
  if constexpr (!kInt4) {
    for (int64_t b = 0; b < l.blocks; ++b) {
      StoreI(out->corr.data() + b * kLanes, LoadI(ref.corr + b * kPrepackedRows));
    }
  }
}

// Every row of x (packed) over weight rows [n_begin, n_end) of a prepacked weight (a.tiles;
// n_begin a multiple of kPrepackedRows), tile by tile: the 512-bit kernel takes a tile's 16
// lanes at once, the 256-bit ones in two halves of 8. Consecutive tiles are one stream, which
// PackedRows prefetches kTileAhead bytes ahead; a tile's scales and zero points, read from its
// first block on, are prefetched when it starts. Zen 5, bench_quant --threads 2 --m 1,8 int4
// 8960 x 1536 from memory, vnni512 (bench/README.md "Zen 5, session 18"): without either
// prefetch the tiles ran M = 1 at 264 us and M = 8 at 930 (the row kernel 197 / 636); with
// both, 155-185 and 300-356 (rows 136-179 / 545-578). Each block prefetches its even share of
// the whole tile (ahead_step bytes): session 18's form took the block's own code lines only, so
// the pointer ran 1.9 KiB short per int4 tile (scales and zero points) and the first 2 KiB of
// every tile were never asked for. Zen 5, the same call with --threads 1 --packed-min-rows 1,
// four alternations (bench/README.md "Zen 5, session 19"): M = 1 359-376 -> 303-343 us, M = 8
// 490-548 -> 521-547 (unchanged within the machine's drift).
template <bool kInt4>
DH_IDOT_TARGET void PrepackedAll(const QuantMatMulArgs& a, const QuantizedActs& x,
                                 int64_t n_begin, int64_t n_end) {
  const PrepackedLayout l = PrepackedLayoutOf(kInt4, a.k, a.group_size);
  const int64_t ahead_step = (l.tile_bytes / l.blocks + 63) / 64 * 64;
  // 256 bits, many passes over each tile (prefill): each half tile is first copied as PackTile
  // lays a tile out (CopyHalfTile), so that every pass reads 8 contiguous lanes, not every other
  // 32 bytes of the tile's lines (which, with x streaming through L1, came back from L2 twice
  // as often).
  constexpr bool kHalfTiles = kPrepackedRows != kLanes;
  const bool copy = kHalfTiles && PassesFor(a.m) >= kCopyHalfTileMinPasses;
  thread_local PackedTile half;  // grown once per thread
  if (copy) SizeHalfTile<kInt4>(l, &half);
  const VecF off = SetF(static_cast<float>(a.zero_offset));
  for (int64_t t0 = n_begin; t0 < n_end; t0 += kPrepackedRows) {
    const uint8_t* tile = a.tiles + t0 / kPrepackedRows * l.tile_bytes;
    // This tile's scales and zero points, wanted from its first block on, in one burst.
    for (int64_t o = l.scale_offset; o < l.tile_bytes; o += 64) __builtin_prefetch(tile + o, 0, 3);
    for (int64_t lane0 = 0; lane0 < kPrepackedRows && t0 + lane0 < n_end; lane0 += kLanes) {
      TileRef ref;
      ref.ahead = reinterpret_cast<const char*>(tile) + kTileAhead;
      ref.ahead_step = ahead_step;
      ref.codes = reinterpret_cast<const int32_t*>(tile) + lane0;
      ref.h = reinterpret_cast<const uint16_t*>(tile + l.scale_offset) + lane0;
      if constexpr (kInt4) {
        ref.z = tile + l.extra_offset + lane0 / 2;
      } else {
        ref.corr = reinterpret_cast<const int32_t*>(tile + l.extra_offset) + lane0;
      }
      const int64_t rows = n_end - t0 - lane0 < kLanes ? n_end - t0 - lane0 : kLanes;
      if constexpr (kHalfTiles) {
        if (copy) {
          CopyHalfTile<kInt4>(l, off, ref, &half);
          PassesOverTile<kInt4, false>(a, x, RefOf(half), t0 + lane0, rows);
          continue;
        }
      }
      PassesOverTile<kInt4, true>(a, x, ref, t0 + lane0, rows);
    }
  }
}

// One step (a dword of 8 int4 codes per lane: nibbles lo, hi) of a block's dots against x's
// codes of the matching even (xl) and odd (xh) columns, broadcast: VNNI adds each nibble's
// vpdpbusd into its own chain; AVX2 adds both nibbles' vpmaddubsw pair sums into acc in int16
// (hi_acc unused). NibbleDots then gives the block's i32 lane dots.
DH_IDOT_TARGET inline __attribute__((always_inline)) void NibbleStep(VecI lo, VecI hi, VecI xl,
                                                                     VecI xh, VecI* acc,
                                                                     VecI* hi_acc) {
#if DH_IDOT_VNNI
  *acc = Dpbusd(*acc, lo, xl);
  *hi_acc = Dpbusd(*hi_acc, hi, xh);
#else
  (void)hi_acc;
  *acc = _mm256_add_epi16(*acc, PairSumsInt4(lo, hi, xl, xh));
#endif
}
DH_IDOT_TARGET inline __attribute__((always_inline)) VecI NibbleDots(VecI acc, VecI hi_acc) {
#if DH_IDOT_VNNI
  return AddI32(acc, hi_acc);
#else
  (void)hi_acc;
  return _mm256_madd_epi16(acc, _mm256_set1_epi16(1));
#endif
}

// The i32 dots of block b of one prepacked int4 tile (its codes at wb) against MR rows of x
// (codes at xc[r], the odd columns' half bytes on): dots[r][v] for the tile's v-th vector of
// kLanes weight rows. First prefetches block b's share of the stream ahead (ahead_step bytes
// from ahead + b * ahead_step).
template <int MR>
DH_IDOT_TARGET inline __attribute__((always_inline)) void FewRowsBlockDots(
    const int32_t* wb, const uint8_t* const* xc, int64_t b, int64_t half, const char* ahead,
    int64_t ahead_step, VecI (*dots)[kPrepackedRows / kLanes]) {
  constexpr int kHalves = static_cast<int>(kPrepackedRows / kLanes);
  for (int64_t o = 0; o < ahead_step; o += 64) __builtin_prefetch(ahead + b * ahead_step + o, 0, 3);
  VecI hi_acc[MR][kHalves];  // VNNI's second chain (AVX2: unused)
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < kHalves; ++v) dots[r][v] = hi_acc[r][v] = ZeroI();
  }
#pragma GCC unroll 4
  for (int st = 0; st < 4; ++st) {
#pragma GCC unroll 2
    for (int v = 0; v < kHalves; ++v) {
      VecI lo, hi;
      SplitNibbles(LoadI(wb + st * kPrepackedRows + v * kLanes), &lo, &hi);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const uint8_t* xr = xc[r] + b * 16 + 4 * st;
        NibbleStep(lo, hi, BroadcastDword(xr), BroadcastDword(xr + half), &dots[r][v],
                   &hi_acc[r][v]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < kHalves; ++v) dots[r][v] = NibbleDots(dots[r][v], hi_acc[r][v]);
  }
}

// MR (1 or 2) rows of x from r0, quantized by rows as the per-row kernels take them, over weight
// rows [n_begin, n_end) of an int4 prepacked weight (n_begin a multiple of kPrepackedRows): the
// tiles' 16 lanes are 16 weight rows (one vector on 512 bits, two of 8 on 256), so each x dword
// is broadcast and no output row needs a horizontal sum. Decode reads the tiles with this
// kernel, so that a weight needs no row layout once its tiles are made (CpuBackend::PrepareWeight
// releases it). Per block, like the per-row kernel: the i32 dots of the low and high nibbles
// times x's block scale, summed over the group in f32 and times the weight scale; the zero
// points' term from x's group sums. AVX2 adds each block's vpmaddubsw pair sums in int16 and
// widens them with one vpmaddwd per block (16 products of codes 0..15 and x codes -127..127 per
// int16 lane, at most 30480 in magnitude). Zen 5, bench_quant --threads 2 --m 1 from memory,
// three rounds, against the per-row kernel over the row layout: a V2-Lite expert's down (2048 x
// 1408) 39.4-45.0 against 46.0-56.6 us, 8960 x 1536 172.8-194.1 against 211.4-225.7; there
// rows longer than kFewRowsTilesMaxK keep the row layout (bench/README.md "Zen 5, session 30").
// The 256-bit form, one run: AVX2 1408 x 2048 52.6 -> 37.7 us, 8960 x 1536 173.9 -> 160.2
// (AVX-VNNI 46.2 -> 34.1, 168.0 -> 138.0; bench/README.md "Zen 5, session 34"), and at every
// row length (FewRowsTakeTiles; session 44).
template <int MR>
DH_IDOT_TARGET void PrepackedFewRowsInt4(const QuantMatMulArgs& a, const QuantizedActs& x,
                                         int64_t r0, int64_t n_begin, int64_t n_end) {
  constexpr int kHalves = static_cast<int>(kPrepackedRows / kLanes);  // vectors per tile row
  const PrepackedLayout l = PrepackedLayoutOf(true, a.k, a.group_size);
  const int64_t blocks_per_group = a.group_size >= a.k ? l.blocks : a.group_size / kXBlock;
  const int64_t ahead_step = (l.tile_bytes / l.blocks + 63) / 64 * 64;
  const int64_t half = x.row_bytes / 2;  // int4 x: the even columns' codes, then the odd ones'
  const VecF off = SetF(static_cast<float>(a.zero_offset));
  const uint8_t* xc[MR];
  const float* xs[MR];
  const float* gs[MR];
  for (int r = 0; r < MR; ++r) {
    xc[r] = x.codes.data() + (r0 + r) * x.row_bytes;
    xs[r] = x.block_scales.data() + (r0 + r) * x.blocks;
    gs[r] = x.group_sums.data() + (r0 + r) * x.groups;
  }
  for (int64_t t0 = n_begin; t0 < n_end; t0 += kPrepackedRows) {
    const uint8_t* tile = a.tiles + t0 / kPrepackedRows * l.tile_bytes;
    // This tile's scales and zero points, wanted from its first block on, in one burst.
    for (int64_t o = l.scale_offset; o < l.tile_bytes; o += 64) __builtin_prefetch(tile + o, 0, 3);
    const auto* codes = reinterpret_cast<const int32_t*>(tile);
    const auto* h = reinterpret_cast<const uint16_t*>(tile + l.scale_offset);
    const uint8_t* z = tile + l.extra_offset;
    const char* ahead = reinterpret_cast<const char*>(tile) + kTileAhead;
    VecF facc[MR][kHalves], zacc[MR][kHalves];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
      for (int v = 0; v < kHalves; ++v) facc[r][v] = zacc[r][v] = ZeroF();
    }
    if (blocks_per_group == 1) {
      // One block per group (group size 32, the default): one flat loop, the group's sum of
      // one block formed in registers rather than carried across a loop over the group's
      // blocks (which spilled and reloaded every accumulator per block). The same f32 steps.
      for (int64_t b = 0; b < l.blocks; ++b) {
        VecI dots[MR][kHalves];
        FewRowsBlockDots<MR>(codes + b * 4 * kPrepackedRows, xc, b, half, ahead, ahead_step, dots);
#pragma GCC unroll 2
        for (int v = 0; v < kHalves; ++v) {
          const VecF ws = WidenHalves(h + b * kPrepackedRows + v * kLanes);
          const VecF zs = ZeroTimesScale(z + b * (kPrepackedRows / 2), v * kLanes, off, ws);
#pragma GCC unroll 4
          for (int r = 0; r < MR; ++r) {
            facc[r][v] = FmaF(MulF(ToF(dots[r][v]), SetF(xs[r][b])), ws, facc[r][v]);
            zacc[r][v] = FnmaF(zs, SetF(gs[r][b]), zacc[r][v]);
          }
        }
      }
    }
    for (int64_t gi = 0; blocks_per_group > 1 && gi < l.groups; ++gi) {
      VecF ws[kHalves], gacc[MR][kHalves];
#pragma GCC unroll 2
      for (int v = 0; v < kHalves; ++v) {
        ws[v] = WidenHalves(h + gi * kPrepackedRows + v * kLanes);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) gacc[r][v] = ZeroF();
      }
      const int64_t b_end = (gi + 1) * blocks_per_group < l.blocks ? (gi + 1) * blocks_per_group
                                                                    : l.blocks;
      for (int64_t b = gi * blocks_per_group; b < b_end; ++b) {
        VecI dots[MR][kHalves];
        FewRowsBlockDots<MR>(codes + b * 4 * kPrepackedRows, xc, b, half, ahead, ahead_step, dots);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          const VecF s = SetF(xs[r][b]);
#pragma GCC unroll 2
          for (int v = 0; v < kHalves; ++v) gacc[r][v] = FmaF(ToF(dots[r][v]), s, gacc[r][v]);
        }
      }
#pragma GCC unroll 2
      for (int v = 0; v < kHalves; ++v) {
        const VecF zs = ZeroTimesScale(z + gi * (kPrepackedRows / 2), v * kLanes, off, ws[v]);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          facc[r][v] = FmaF(gacc[r][v], ws[v], facc[r][v]);
          zacc[r][v] = FnmaF(zs, SetF(gs[r][gi]), zacc[r][v]);
        }
      }
    }
    for (int v = 0; v < kHalves; ++v) {
      const int64_t j0 = t0 + v * kLanes;
      if (j0 >= n_end) break;
      const int64_t rows = n_end - j0 < kLanes ? n_end - j0 : kLanes;
      for (int r = 0; r < MR; ++r) {
        alignas(64) float sums[kLanes];
        StoreF(sums, AddF(facc[r][v], zacc[r][v]));
        float* out = a.out + (r0 + r) * a.out_stride + j0;
        for (int64_t i = 0; i < rows; ++i) out[i] = sums[i] + (a.bias ? a.bias[j0 + i] : 0.0f);
      }
    }
  }
}

// All rows of x over weight rows [n_begin, n_end), in tiles of ~32 KiB of weight codes that stay
// in L1/L2 while every block of 4 x rows passes over them: a batch reads each weight byte from
// memory once.
template <bool kInt4>
void DotAll(const QuantMatMulArgs& a, const QuantizedActs& x, int64_t n_begin, int64_t n_end) {
  if (x.packed) {
    if (a.tiles != nullptr) return PrepackedAll<kInt4>(a, x, n_begin, n_end);
    return PackedAll<kInt4>(a, x, n_begin, n_end);
  }
  if constexpr (kInt4) {
    // Rows of x by rows (fewer than PrepackedMinRows) over int4 tiles: ReadsPrepackedTiles.
    if (FewRowsReadTiles(kPath, a)) {
      int64_t r0 = 0;
      for (; r0 + 2 <= a.m; r0 += 2) PrepackedFewRowsInt4<2>(a, x, r0, n_begin, n_end);
      if (r0 < a.m) PrepackedFewRowsInt4<1>(a, x, r0, n_begin, n_end);
      return;
    }
  }
  int64_t row_bytes = kInt4 ? (a.k + 1) / 2 : a.k;
  if (row_bytes < 1) row_bytes = 1;
  int64_t tile = a.m <= 4 ? n_end - n_begin : (32 << 10) / row_bytes;
  if (tile < 1) tile = 1;
  for (int64_t j0 = n_begin; j0 < n_end; j0 += tile) {
    const int64_t j1 = j0 + tile < n_end ? j0 + tile : n_end;
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

}  // namespace DH_IDOT_NS
