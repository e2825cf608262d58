// The 256-bit integer-dot kernel body (quant_int256.h), included twice by quant_int256.cc: once
// with DH_I256_VNNI 0 (AVX2 + FMA target) and once with DH_I256_VNNI 1 (AVX2 + FMA + AVX-VNNI),
// each time inside its own namespace DH_I256_NS and with DH_I256_TARGET as the functions' target
// attribute. No include guard on purpose.

namespace DH_I256_NS {

// Sum of the 8 lanes.
DH_I256_TARGET inline float HSum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// The first min(count, left) of `count` (1, 2, 4 or 8) f16 scales at s, widened, in the low
// lanes; the other lanes are zero and never selected. Plain loads of 2-16 bytes in the common
// case.
DH_I256_TARGET inline __m256 LoadScales(const uint16_t* s, int count, int64_t left) {
  __m128i h;
  if (left < count) {
    alignas(16) uint16_t t[8] = {};
    for (int64_t i = 0; i < left; ++i) t[i] = s[i];
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(t));
  } else {
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
      default:
        h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
        break;
    }
  }
  return _mm256_cvtph_ps(h);
}

// sum over the n groups of min[g] * gsum[g], min[g] = -(zero nibble + offset) * scale[g]: the
// int4 zero-point term (z * scale is exact in f32).
DH_I256_TARGET inline float DotMins(const uint16_t* s, const uint8_t* z, int offset,
                                    const float* gsum, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m256i off = _mm256_set1_epi32(offset);
  int64_t g = 0;
  for (; g + 8 <= n; g += 8) {
    const __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + g)));
    int32_t zw;
    std::memcpy(&zw, z + g / 2, 4);
    const __m128i zb = _mm_cvtsi32_si128(zw);
    const __m128i nib =
        _mm_unpacklo_epi8(_mm_and_si128(zb, low4), _mm_and_si128(_mm_srli_epi16(zb, 4), low4));
    const __m256 zf = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_cvtepu8_epi32(nib), off));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(zf, sc), _mm256_loadu_ps(gsum + g), acc);
  }
  float tail = 0.0f;
  for (; g < n; ++g) {
    const int zero = ZeroNibble(z, g) + offset;
    tail += static_cast<float>(zero) * _cvtsh_ss(s[g]) * gsum[g];
  }
  return -(HSum(acc) + tail);
}

// i32 lane dots of one 32-byte chunk of weight codes v with one row of quantized x.
//   int8: xq = x codes as stored (u8 = q + 128); corr = 128 * sum(w) per lane (VNNI only).
//   int4: xe, xo = signed x codes of the even and odd columns.
DH_I256_TARGET inline __m256i LaneDotInt8(__m256i v, __m256i xq, __m256i corr, __m256i absw) {
#if DH_I256_VNNI
  (void)absw;
  return _mm256_sub_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), xq, v), corr);
#else
  (void)corr;
  const __m256i xs = _mm256_xor_si256(xq, _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i pairs = _mm256_maddubs_epi16(absw, _mm256_sign_epi8(xs, v));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

DH_I256_TARGET inline __m256i LaneDotInt4(__m256i lo, __m256i hi, __m256i xe, __m256i xo) {
#if DH_I256_VNNI
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, xe), hi, xo);
#else
  const __m256i pairs =
      _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

// One 32-byte chunk of codes v (bytes [b, b + 32) of the weight row) times MR rows of quantized
// x, added to facc with the per-lane scales x_scale * wsl.
template <int MR, bool kInt4>
DH_I256_TARGET inline __attribute__((always_inline)) void Chunk(
    __m256i v, __m256 wsl, int64_t b, int64_t half, const uint8_t* const* xc,
    const float* const* xl, __m256* facc) {
  const int64_t lane0 = b / 4;
  if constexpr (kInt4) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(v, low4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    for (int r = 0; r < MR; ++r) {
      const __m256i acc = LaneDotInt4(
          lo, hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc[r] + b)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc[r] + half + b)));
      const __m256 comb = _mm256_mul_ps(_mm256_loadu_ps(xl[r] + lane0), wsl);
      facc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), comb, facc[r]);
    }
  } else {
#if DH_I256_VNNI
    const __m256i corr = _mm256_slli_epi32(
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), v), 7);
    const __m256i absw = corr;  // unused
#else
    const __m256i absw = _mm256_abs_epi8(v);  // -128 -> 0x80 = 128 as the unsigned operand
    const __m256i corr = absw;                // unused
#endif
    for (int r = 0; r < MR; ++r) {
      const __m256i acc = LaneDotInt8(
          v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc[r] + b)), corr, absw);
      const __m256 comb = _mm256_mul_ps(_mm256_loadu_ps(xl[r] + lane0), wsl);
      facc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), comb, facc[r]);
    }
  }
}

// Output rows [n_begin, n_end) for x rows [r0, r0 + MR): each 32-byte vector of weight codes is
// loaded once and multiplied with the MR rows of quantized x.
template <int MR, bool kInt4, ScaleMode256 kMode>
DH_I256_TARGET void DotRows(const QuantMatMulArgs& a, const QuantizedActs& x, int64_t r0,
                            int64_t n_begin, int64_t n_end) {
  const int64_t k = a.k, g = a.group_size < k ? a.group_size : k;
  const int64_t row_len = kInt4 ? (k + 1) / 2 : k;  // bytes of codes per weight row
  const int64_t full = row_len / 32 * 32;
  constexpr int64_t kChunk = kInt4 ? 64 : 32, kLane = kInt4 ? 8 : 4;
  const int64_t ngroups = (k + g - 1) / g;
  const int per_chunk = kMode == ScaleMode256::kPermute ? static_cast<int>(kChunk / g) : 1;
  const int64_t chunks_per_group = kMode == ScaleMode256::kPerChunk ? g / kChunk : 1;
  alignas(32) int32_t idx_lanes[8];
  for (int i = 0; i < 8; ++i) {
    idx_lanes[i] = kMode == ScaleMode256::kPermute ? static_cast<int32_t>(i * kLane / g) : 0;
  }
  const __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx_lanes));
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
    __m256 facc[MR], facc2[MR];
    for (int r = 0; r < MR; ++r) facc[r] = facc2[r] = _mm256_setzero_ps();
    int64_t gi = 0, chunk_in_group = 0;
    const __m256 one_scale = _mm256_set1_ps(_cvtsh_ss(s[0]));
    auto next_scales = [&]() DH_I256_TARGET {
      if constexpr (kMode == ScaleMode256::kOne) {
        return one_scale;
      } else if constexpr (kMode == ScaleMode256::kPerChunk) {
        const __m256 w = _mm256_set1_ps(_cvtsh_ss(s[gi]));
        if (++chunk_in_group == chunks_per_group) {
          chunk_in_group = 0;
          ++gi;
        }
        return w;
      } else {
        const __m256 w =
            _mm256_permutevar8x32_ps(LoadScales(s + gi, per_chunk, ngroups - gi), idx);
        gi += per_chunk;
        return w;
      }
    };
    int64_t b = 0;
    for (; b + 64 <= full; b += 64) {  // two chunks, two accumulator sets
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b + 32));
      const __m256 w0 = next_scales();
      const __m256 w1 = next_scales();
      Chunk<MR, kInt4>(v0, w0, b, half, xc, xl, facc);
      Chunk<MR, kInt4>(v1, w1, b + 32, half, xc, xl, facc2);
    }
    if (b < full) {
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b));
      Chunk<MR, kInt4>(v0, next_scales(), b, half, xc, xl, facc);
      b += 32;
    }
    if (b < row_len) {  // partial last chunk: zero-padded copy (x codes past k add nothing)
      alignas(32) uint8_t tail[32] = {};
      for (int64_t i = 0; i < row_len - b; ++i) tail[i] = q[b + i];
      const __m256i v0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
      Chunk<MR, kInt4>(v0, next_scales(), b, half, xc, xl, facc2);
    }
    const float bias = a.bias ? a.bias[j] : 0.0f;
    for (int r = 0; r < MR; ++r) {
      float sum = HSum(_mm256_add_ps(facc[r], facc2[r]));
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
  switch (ModeFor256(kInt4, a.k, a.group_size < a.k ? a.group_size : a.k)) {
    case ScaleMode256::kOne:
      return DotRows<MR, kInt4, ScaleMode256::kOne>(a, x, r0, n_begin, n_end);
    case ScaleMode256::kPerChunk:
      return DotRows<MR, kInt4, ScaleMode256::kPerChunk>(a, x, r0, n_begin, n_end);
    case ScaleMode256::kPermute:
      return DotRows<MR, kInt4, ScaleMode256::kPermute>(a, x, r0, n_begin, n_end);
  }
}

// All rows of x over weight rows [n_begin, n_end), in tiles of weight rows small enough to stay
// in L1/L2 while every block of 4 x rows passes over them: a batch reads each weight byte from
// memory once.
template <bool kInt4>
void DotAll(const QuantMatMulArgs& a, const QuantizedActs& x, int64_t n_begin, int64_t n_end) {
  const int64_t tile = a.m <= 4 ? n_end - n_begin : WeightTileRows(a);
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

}  // namespace DH_I256_NS
