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
// All lanes of f16 values at p, and the low 8 lanes from h (the rest zero), widened to f32.
DH_IDOT_TARGET inline VecF WidenHalves(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
DH_IDOT_TARGET inline VecF WidenHalves8(__m128i h) {
  return _mm512_cvtph_ps(_mm256_zextsi128_si256(h));
}
// The low bytes of b (one per lane) widened to i32 lanes.
DH_IDOT_TARGET inline VecI WidenBytes(__m128i b) { return _mm512_cvtepu8_epi32(b); }
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
DH_IDOT_TARGET inline VecF WidenHalves(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
DH_IDOT_TARGET inline VecF WidenHalves8(__m128i h) { return _mm256_cvtph_ps(h); }
DH_IDOT_TARGET inline VecI WidenBytes(__m128i b) { return _mm256_cvtepu8_epi32(b); }
#endif

// Bytes of weight codes per vector; f32 lanes per vector.
constexpr int64_t kBytes = DH_IDOT_BITS / 8;
constexpr int kLanes = DH_IDOT_BITS / 32;

// How the weight scales map onto the lanes of one vector of codes: one scale for the row, one
// per vector (a group spans whole vectors), or several per vector (permuted onto their lanes).
enum class ScaleMode { kOne, kPerChunk, kPermute };

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

// The int4 zero-point term, sum over the n groups of min[g] * gsum_r[g] with min[g] =
// -(zero nibble + offset) * scale[g], for MR rows of x at once: the min vector of each kLanes
// groups is formed once (z * scale is exact in f32: at most 16 significant bits) and subtracted
// lane-wise into facc[r] (only the accumulators' lane sum is used); tail[r] gets the last
// groups'.
template <int MR>
DH_IDOT_TARGET inline __attribute__((always_inline)) void AddMins(
    const uint16_t* s, const uint8_t* z, int offset, const float* const* gsum, int64_t n,
    VecF* facc, float* tail) {
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const VecF off = SetF(static_cast<float>(offset));
  int64_t g = 0;
  for (; g + kLanes <= n; g += kLanes) {
    uint64_t zw = 0;  // kLanes zero nibbles
    std::memcpy(&zw, z + g / 2, kLanes / 2);
    const __m128i zb = _mm_cvtsi64_si128(static_cast<int64_t>(zw));
    const __m128i nib =
        _mm_unpacklo_epi8(_mm_and_si128(zb, low4), _mm_and_si128(_mm_srli_epi16(zb, 4), low4));
    const VecF zf = AddF(ToF(WidenBytes(nib)), off);  // exact: small integers
    const VecF zs = MulF(zf, WidenHalves(s + g));
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

// One vector of codes v (bytes [b, b + kBytes) of the weight row) times MR rows of quantized x,
// added to facc with the per-lane scales x_scale * wsl. The i32 lane dots are exact on every
// path (quant_int256.h shows why AVX2's saturating pair sums never saturate here).
//   int8: x codes as stored (u8 = q + 128): dot(x + 128, w) - 128 * sum(w); AVX2 instead takes
//         |w| as the unsigned operand against x with w's sign applied.
//   int4: codes 0..15 (unsigned) against the signed x codes of the even and odd columns.
template <int MR, bool kInt4>
DH_IDOT_TARGET inline __attribute__((always_inline)) void Chunk(
    VecI v, VecF wsl, int64_t b, int64_t half, const uint8_t* const* xc,
    const float* const* xl, VecF* facc) {
  const int64_t lane0 = b / 4;
  if constexpr (kInt4) {
    const VecI low4 = SetI8(0x0f);
    const VecI lo = AndI(v, low4);
    const VecI hi = AndI(Shr4(v), low4);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const VecI xe = LoadI(xc[r] + b), xo = LoadI(xc[r] + half + b);
#if DH_IDOT_VNNI
      const VecI acc = Dpbusd(Dpbusd(ZeroI(), lo, xe), hi, xo);
#else
      const VecI pairs =
          _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
      const VecI acc = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
      const VecF comb = MulF(LoadF(xl[r] + lane0), wsl);
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
      const VecI xs = _mm256_xor_si256(xq, SetI8(static_cast<char>(0x80)));
      const VecI pairs = _mm256_maddubs_epi16(absw, _mm256_sign_epi8(xs, v));
      const VecI acc = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
      const VecF comb = MulF(LoadF(xl[r] + lane0), wsl);
      facc[r] = FmaF(ToF(acc), comb, facc[r]);
    }
  }
}

constexpr int64_t ChunkColsOf(bool int4) { return int4 ? 2 * kBytes : kBytes; }

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
  const int per_chunk = kMode == ScaleMode::kPermute ? static_cast<int>(kChunkCols / g) : 1;
  static_assert(kPer == 0 || (kMode == ScaleMode::kPermute && kLanes % kPer == 0));
  constexpr int kSuper = kPer > 0 ? kLanes / kPer : 1;  // chunks per vector of scales
  VecI super_idx[kSuper];  // lane i of chunk c: group c * kPer + i * kLaneCols / g
  if constexpr (kPer > 0) {
    for (int c = 0; c < kSuper; ++c) {
      alignas(64) int32_t lanes[kLanes];
      for (int i = 0; i < kLanes; ++i) lanes[i] = static_cast<int32_t>(c * kPer + i * kLaneCols / g);
      super_idx[c] = LoadI(lanes);
    }
  }
  const int64_t chunks_per_group = kMode == ScaleMode::kPerChunk ? g / kChunkCols : 1;
  alignas(64) int32_t idx_lanes[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    idx_lanes[i] = kMode == ScaleMode::kPermute ? static_cast<int32_t>(i * kLaneCols / g) : 0;
  }
  const VecI idx = LoadI(idx_lanes);
  const int64_t half = x.row_bytes / 2;
  const uint8_t* xc[MR];
  const float* xl[MR];
  const float* gs[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    xc[r] = x.codes.data() + (r0 + r) * x.row_bytes;
    xl[r] = x.lane_scales.data() + (r0 + r) * x.lanes;
    gs[r] = x.group_sums.data() + (r0 + r) * x.groups;
  }
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
    if constexpr (kPer > 0) {  // whole runs of kSuper chunks: kLanes groups, all in the row
      for (; b + kSuper * kBytes <= full; b += kSuper * kBytes) {
        const VecF sv = WidenHalves(s + b / kBytes * kPer);
#pragma GCC unroll 16
        for (int c = 0; c < kSuper; ++c) {
          Chunk<MR, kInt4>(LoadI(q + b + c * kBytes), PermuteF(sv, super_idx[c]), b + c * kBytes,
                           half, xc, xl, (c & 1) != 0 ? facc2 : facc);
        }
      }
    }
    for (; b + 2 * kBytes <= full; b += 2 * kBytes) {  // two chunks, two accumulator sets
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
      AddMins<MR>(s, a.zeros + j * a.zero_stride, a.zero_offset, gs, ngroups, facc2, min_tail);
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
  switch (ModeFor(kInt4, a.k, a.group_size < a.k ? a.group_size : a.k)) {
    case ScaleMode::kOne: return DotRows<MR, kInt4, ScaleMode::kOne>(a, x, r0, n_begin, n_end);
    case ScaleMode::kPerChunk:
      return DotRows<MR, kInt4, ScaleMode::kPerChunk>(a, x, r0, n_begin, n_end);
    case ScaleMode::kPermute:
      // The shared scale vector pays on 256 bits (AVX2 int4 group 32: 7.8 -> 6.5 us per call in
      // bench_quant); on 512 bits it measured slower (int8 7.7 -> 11.5 us), so it keeps kPer = 0.
      switch (DH_IDOT_BITS == 256 ? ChunkColsOf(kInt4) / (a.group_size < a.k ? a.group_size : a.k)
                                  : 0) {
        case 2: return DotRows<MR, kInt4, ScaleMode::kPermute, 2>(a, x, r0, n_begin, n_end);
        case 4: return DotRows<MR, kInt4, ScaleMode::kPermute, 4>(a, x, r0, n_begin, n_end);
        default: return DotRows<MR, kInt4, ScaleMode::kPermute>(a, x, r0, n_begin, n_end);
      }
  }
}

// All rows of x over weight rows [n_begin, n_end), in tiles of ~32 KiB of weight codes that stay
// in L1/L2 while every block of 4 x rows passes over them: a batch reads each weight byte from
// memory once.
template <bool kInt4>
void DotAll(const QuantMatMulArgs& a, const QuantizedActs& x, int64_t n_begin, int64_t n_end) {
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
