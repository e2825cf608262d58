// Int8 / int4 MatMul kernels (backend/cpu/quant_matmul) against the reference backend's MatMul
// over the same codes, on every SIMD target compiled in that the CPU supports, for odd shapes,
// partial last groups, per-row groups, odd column counts (int4: a half-filled last byte), M = 1
// and M > 1 (each dequantized weight vector used for up to 4 rows of x), with bias and strided
// x / out rows; and the f32 rows DequantizeRows hands to the tiled GEMM.
//
// Tolerance: |got - want| <= 2e-5 * max(1, max|want|) (f32 SIMD accumulation in a different
// order than the reference's sums; the dequantized weights are the same f32 products).
// Also: every integer kernel the CPU has (AVX2, AVX-VNNI, AVX512-VNNI; quant_vnni.h, x quantized
// to int8) against its stated error bound, directly and through CpuBackend with the path forced
// on, against each other, at the extreme codes and over batch tiles; the FP8 e4m3 GEMV and row
// decoder (f16 widening) against the reference, the decoder bit for bit over every code.
#include "backend/buffer_chunks.h"
#include "backend/cpu/quant_matmul.h"
#include "backend/cpu/quant_vnni.h"
#include "backend/cpu/quant_int256.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/reference/reference_backend.h"
#include "backend/reference/reference_ops.h"
#include "base/memory_info.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kernels/kernel_test_util.h"

namespace dh {
namespace {

using test::ExpectClose;
using test::Owned;
using test::Rng;

struct Case {
  bool int4;
  int64_t m, n, k, group;
};

const Case kCases[] = {
    {false, 1, 1, 1, 1},      {false, 1, 7, 45, 32},   {false, 3, 17, 96, 32},
    {false, 1, 33, 257, 257}, {false, 5, 64, 130, 32}, {false, 8, 9, 300, 128},
    {false, 2, 5, 19, 19},    {true, 1, 1, 2, 2},      {true, 1, 7, 45, 32},
    {true, 3, 17, 96, 32},    {true, 1, 33, 257, 257}, {true, 5, 64, 130, 32},
    {true, 8, 9, 300, 128},   {true, 1, 40, 256, 128}, {true, 2, 11, 37, 37},
    {true, 4, 13, 70, 16},    {false, 6, 21, 64, 32},  {true, 7, 21, 96, 32},
    {false, 2, 10, 200, 64},  {true, 3, 10, 300, 64},  {true, 1, 9, 600, 256},
    {false, 1, 6, 100, 8},    {true, 1, 20, 1536, 32}, {false, 1, 20, 1536, 1536},
    {false, 9, 12, 160, 32},  {true, 10, 7, 129, 128}, {false, 1, 5, 100, 48},
    // M > 8 with K > 1024: the tiled GEMM cuts K, so the backend decodes column slices.
    {false, 12, 9, 2100, 32}, {true, 17, 10, 2600, 128}, {false, 20, 5, 1300, 1300},
    {true, 9, 6, 1100, 1100},
    // Runs of chunks sharing one vector of scales, then 2-chunk steps, a single chunk and a
    // partial one (int4 groups of 32 and 16 on the 256-bit kernels, 32 on 512 bits; groups of 64
    // beside them keep the per-chunk form; 1408 columns: V2-Lite's expert down projection).
    {true, 5, 7, 1000, 32},   {true, 3, 9, 600, 16},   {true, 2, 9, 1200, 64},
    {true, 1, 5, 1408, 32},
    // int8 groups of 32 on one row of x (alone and after 4-row blocks): runs of 8 groups with
    // their scale products formed once, then single chunks and a partial one.
    {false, 1, 9, 600, 32},   {false, 5, 7, 1100, 32},
    // Groups that do not divide the GEMM's K blocks (multiples of 256): the f32 path decodes
    // whole rows and keeps each block's slice (several blocks of 6 rows; then the same single
    // block in two calls in a row, int8 then int4).
    {false, 10, 20, 1300, 40}, {false, 10, 6, 1300, 40}, {true, 10, 6, 1300, 40},
};

class QuantMatMulTest : public ::testing::Test {
 protected:
  template <typename Body>
  void ForEachTarget(Body body) {
    const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
    ASSERT_FALSE(targets.empty());
    for (int64_t target : targets) {
      hwy::SetSupportedTargetsForTest(target);
      SCOPED_TRACE(hwy::TargetName(target));
      body();
      if (HasFatalFailure()) break;
    }
    hwy::SetSupportedTargetsForTest(0);
  }

  ReferenceBackend ref_{BackendOptions{}};
  CpuBackend cpu_{BackendOptions{.num_threads = 2}};
};

// Random codes, f16 scales and (int4) random zero points; the GPTQ v1 zero offset of 1 on
// weights with an odd number of rows, so both offsets are covered.
struct RandomWeight {
  Owned q, scales, zeros, bias;
  Weight w;
  RandomWeight(Rng& rng, const Case& c)
      : q(c.int4 ? DType::kU8 : DType::kI8, {c.n, c.int4 ? (c.k + 1) / 2 : c.k}),
        scales(DType::kF16, {c.n, (c.k + c.group - 1) / c.group}),
        zeros(DType::kU8, {c.n, ((c.k + c.group - 1) / c.group + 1) / 2}),
        bias(DType::kF32, {c.n}) {
    rng.Fill(q);
    rng.Fill(scales, 0.001f, 0.05f);
    rng.Fill(zeros);
    rng.Fill(bias);
    w.format = c.int4 ? WeightFormat::kInt4 : WeightFormat::kInt8;
    w.rows = c.n;
    w.cols = c.k;
    w.group_size = static_cast<int>(c.group);
    w.data = q.t;
    w.scales = scales.t;
    if (c.int4) {
      w.zeros = zeros.t;
      w.zero_offset = static_cast<int>(c.n % 2);
    }
  }
  // The weight fields of kernel arguments.
  void SetArgs(cpu::QuantMatMulArgs& a) const {
    a.int4 = w.format == WeightFormat::kInt4;
    a.q = q.t.data;
    a.q_stride = q.t.shape[1];
    a.scales = reinterpret_cast<const uint16_t*>(scales.bytes.data());
    a.scale_stride = scales.t.shape[1];
    a.zeros = a.int4 ? zeros.bytes.data() : nullptr;
    a.zero_stride = zeros.t.shape[1];
    a.zero_offset = w.zero_offset;
    a.group_size = w.group_size;
  }
};

std::string Name(const Case& c) {
  return fmt::format("{} M={} N={} K={} group={}", c.int4 ? "int4" : "int8", c.m, c.n, c.k,
                     c.group);
}

TEST_F(QuantMatMulTest, KernelMatchesReference) {
  Rng rng(11);
  ForEachTarget([&] {
    for (const Case& c : kCases) {
      ASSERT_TRUE(cpu::QuantMatMulSupports(c.int4, c.k, c.group)) << Name(c);
      RandomWeight rw(rng, c);
      // x and out rows with padding between them (strides larger than the row).
      Owned x(DType::kF32, {c.m, c.k + 3}), got(DType::kF32, {c.m, c.n + 5}),
          want(DType::kF32, {c.m, c.n});
      rng.Fill(x, -2.0f, 2.0f);
      for (bool with_bias : {false, true}) {
        cpu::QuantMatMulArgs a;
        a.x = x.f32();
        a.x_stride = c.k + 3;
        a.m = c.m;
        rw.SetArgs(a);
        a.k = c.k;
        a.bias = with_bias ? rw.bias.f32() : nullptr;
        a.out = got.f32();
        a.out_stride = c.n + 5;
        // Two ranges, as the thread pool would split them.
        cpu::QuantMatMulRange(a, 0, c.n / 2);
        cpu::QuantMatMulRange(a, c.n / 2, c.n);
        ref_.MatMul(x.t.Narrow(1, 0, c.k), rw.w, with_bias ? rw.bias.t : Tensor(), want.t);
        std::vector<float> g;
        for (int64_t r = 0; r < c.m; ++r) {
          for (int64_t j = 0; j < c.n; ++j) g.push_back(got.f32()[r * (c.n + 5) + j]);
        }
        ExpectClose(g, want.ToVector(), 2e-5f, Name(c) + (with_bias ? " bias" : ""));
      }
    }
  });
}

// The same shapes through CpuBackend::MatMul (whichever kernel it picks for quantized weights).
TEST_F(QuantMatMulTest, BackendMatchesReference) {
  Rng rng(12);
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kOff);  // f32 products: tight tolerance
  ForEachTarget([&] {
    for (const Case& c : kCases) {
      RandomWeight rw(rng, c);
      Owned x(DType::kF32, {c.m, c.k}), got(DType::kF32, {c.m, c.n}), want(DType::kF32, {c.m, c.n});
      rng.Fill(x, -2.0f, 2.0f);
      cpu_.MatMul(x.t, rw.w, rw.bias.t, got.t);
      ref_.MatMul(x.t, rw.w, rw.bias.t, want.t);
      ExpectClose(got.ToVector(), want.ToVector(), 2e-5f, "backend " + Name(c));
    }
  });
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kAuto);
}

// Checks an integer-dot result against the reference (exact f32 x): each x element is quantized
// per block of 32 columns to round(x / s), s = max|x_block| / 127, so it is off by at most s / 2;
// an output is then off by at most sum_c |q_c * scale_c| * s(c) / 2 (the int4 zero-point term uses
// exact sums of x), plus f32 accumulation error (2e-5 of the output scale, as for the f32 kernels).
void ExpectWithinQuantBound(const Case& c, const Weight& w, const Owned& x, int64_t x_stride,
                            const bool with_bias, const Owned& bias, const float* got,
                            int64_t got_stride, const std::vector<float>& want,
                            const std::string& what) {
  float scale = 1.0f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  std::vector<float> row(c.k);
  int bad = 0;
  const float* xf = reinterpret_cast<const float*>(x.bytes.data());
  for (int64_t j = 0; j < c.n; ++j) {
    ref::DecodeWeightRow(w, j, row.data());
    if (c.int4) {  // drop the zero-point term: only q * scale meets the quantized x
      const uint8_t* z = w.zeros.as<const uint8_t>() + j * w.zeros.stride[0];
      const uint16_t* s = w.scales.as<const uint16_t>() + j * w.scales.stride[0];
      for (int64_t col = 0; col < c.k; ++col) {
        const int64_t g = col / c.group;
        row[col] += static_cast<float>(ZeroNibble(z, g) + w.zero_offset) * F16ToF32(s[g]);
      }
    }
    for (int64_t r = 0; r < c.m; ++r) {
      double bound = 0.0;
      for (int64_t b0 = 0; b0 < c.k; b0 += 32) {
        const int64_t b1 = std::min<int64_t>(c.k, b0 + 32);
        float amax = 0.0f;
        double wsum = 0.0;
        for (int64_t col = b0; col < b1; ++col) {
          amax = std::max(amax, std::fabs(xf[r * x_stride + col]));
          wsum += std::fabs(row[col]);
        }
        bound += wsum * amax / 127.0 / 2.0;
      }
      const float g = got[r * got_stride + j], want_v = want[r * c.n + j];
      const double tol = bound * 1.001 + 2e-5 * scale;
      if (!(std::fabs(g - want_v) <= tol) && ++bad <= 5) {
        ADD_FAILURE() << what << (with_bias ? " bias" : "") << ": row " << r << " col " << j
                      << " got " << g << " want " << want_v << " (bound " << tol << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
  (void)bias;
}

// The integer kernels available on this CPU (AVX2, AVX-VNNI, AVX512-VNNI).
std::vector<cpu::IntegerDotPath> AvailablePaths() {
  std::vector<cpu::IntegerDotPath> paths;
  for (auto p : {cpu::IntegerDotPath::kAvx2, cpu::IntegerDotPath::kAvxVnni,
                 cpu::IntegerDotPath::kVnni512}) {
    if (cpu::IntegerDotPathAvailable(p)) paths.push_back(p);
  }
  return paths;
}

cpu::QuantMatMulArgs ArgsFor(const Case& c, const RandomWeight& rw, const Owned& x,
                             int64_t x_stride, bool with_bias, Owned& out, int64_t out_stride) {
  cpu::QuantMatMulArgs a;
  a.x = reinterpret_cast<const float*>(x.bytes.data());
  a.x_stride = x_stride;
  a.m = c.m;
  rw.SetArgs(a);
  a.k = c.k;
  a.bias = with_bias ? rw.bias.t.as<const float>() : nullptr;
  a.out = out.f32();
  a.out_stride = out_stride;
  return a;
}

// Every integer kernel the CPU has (x quantized to int8 per 32 columns) against the reference,
// within the bound above, over two ranges as the thread pool splits them.
TEST_F(QuantMatMulTest, IntegerDotWithinQuantizationBound) {
  const auto paths = AvailablePaths();
  if (paths.empty()) GTEST_SKIP() << "CPU has no integer-dot kernel (no AVX2)";
  Rng rng(14);
  int tested = 0;
  for (const Case& c : kCases) {
    if (!cpu::IntegerDotSupports(c.int4, c.k, c.group)) continue;
    ++tested;
    RandomWeight rw(rng, c);
    Owned x(DType::kF32, {c.m, c.k + 3}), got(DType::kF32, {c.m, c.n + 5}),
        want(DType::kF32, {c.m, c.n});
    rng.Fill(x, -2.0f, 2.0f);
    for (bool with_bias : {false, true}) {
      ref_.MatMul(x.t.Narrow(1, 0, c.k), rw.w, with_bias ? rw.bias.t : Tensor(), want.t);
      for (cpu::IntegerDotPath path : paths) {
        const cpu::QuantMatMulArgs a = ArgsFor(c, rw, x, c.k + 3, with_bias, got, c.n + 5);
        cpu::QuantizedActs acts;
        cpu::QuantizeActs(a, &acts, nullptr, path);
        cpu::IntegerDotRangeOn(path, a, acts, 0, c.n / 2);
        cpu::IntegerDotRangeOn(path, a, acts, c.n / 2, c.n);
        ExpectWithinQuantBound(c, rw.w, x, c.k + 3, with_bias, rw.bias, got.f32(), c.n + 5,
                               want.ToVector(),
                               std::string(cpu::IntegerDotPathName(path)) + " " + Name(c));
      }
    }
  }
  EXPECT_GT(tested, 10);
}

// QuantizeActs (vectorized on AVX2 CPUs) against its definition: per block of 32 columns the
// scale is max|x| / 127 and the code nearbyint(x * 127 / max|x|) (a zero block: scale 0, codes
// 0); int8 rows hold code + 128 (the code itself for the AVX2 kernel), int4 rows the even
// columns' codes then the odd ones'; padding is 128 (AVX2: 0) / 0; the int4 group sums within
// 1e-6 of the sum of |x| over the group (f32 order).
TEST_F(QuantMatMulTest, QuantizedActsFollowTheDefinition) {
  Rng rng(21);
  cpu::SetPackedMinRowsForTest(int64_t{1} << 40);  // the by-rows layout at every M
  for (const Case& c : kCases) {
    RandomWeight rw(rng, c);
    Owned x(DType::kF32, {c.m, c.k + 3}), out(DType::kF32, {c.m, c.n});
    rng.Fill(x, -2.0f, 2.0f);
    float* xd = x.f32();
    if (c.k >= 64) {
      for (int64_t i = 32; i < 64; ++i) xd[i] = 0.0f;  // a zero block in row 0
    }
    if (c.m > 1) xd[c.k + 3 + 5 % c.k] = 300.0f;  // an outlier in row 1's first block
    const cpu::QuantMatMulArgs a = ArgsFor(c, rw, x, c.k + 3, false, out, c.n);
    // int8 x codes offset by 128 (the VNNI kernels) and as they are (AVX2).
    for (cpu::IntegerDotPath path : {cpu::IntegerDotPath::kVnni512, cpu::IntegerDotPath::kAvx2}) {
      // Buffers left over from a larger call (QuantizeActs reuses them without clearing): every
      // element must be rewritten, padding included.
      cpu::QuantizedActs acts;
      acts.codes.assign(static_cast<size_t>((c.m + 1) * (c.k + 256)), 0x5a);
      acts.lane_scales.assign(static_cast<size_t>((c.m + 1) * (c.k + 256)), NAN);
      acts.group_sums.assign(static_cast<size_t>((c.m + 1) * (c.k + 256)), NAN);
      cpu::QuantizeActs(a, &acts, nullptr, path);
      ASSERT_EQ(acts.int8_signed, !c.int4 && path == cpu::IntegerDotPath::kAvx2) << Name(c);
      const int offset = acts.int8_signed ? 0 : 128;
      const int64_t lane_cols = c.int4 ? 8 : 4, half = acts.row_bytes / 2;
      for (int64_t r = 0; r < c.m; ++r) {
        const float* xr = xd + r * (c.k + 3);
        const uint8_t* codes = acts.codes.data() + r * acts.row_bytes;
        for (int64_t b0 = 0; b0 < c.k; b0 += 32) {
          const int64_t n = std::min<int64_t>(32, c.k - b0);
          float amax = 0.0f;
          for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(xr[b0 + i]));
          const float scale = amax / 127.0f;
          for (int64_t l = b0 / lane_cols; l < (b0 + 32) / lane_cols; ++l) {  // the block's lanes
            ASSERT_EQ(acts.lane_scales[r * acts.lanes + l], scale) << Name(c) << " lane " << l;
          }
          for (int64_t i = 0; i < n; ++i) {
            const int64_t col = b0 + i;
            const int want =
                amax > 0.0f ? static_cast<int>(std::nearbyint(xr[col] * (127.0f / amax))) : 0;
            const int got = c.int4 ? static_cast<int8_t>(codes[(col & 1) * half + col / 2])
                                   : static_cast<int8_t>(static_cast<uint8_t>(codes[col] - offset));
            ASSERT_EQ(got, want) << Name(c) << " row " << r << " column " << col;
          }
        }
        // Lanes past the blocks.
        for (int64_t l = (c.k + 31) / 32 * 32 / lane_cols; l < acts.lanes; ++l) {
          ASSERT_EQ(acts.lane_scales[r * acts.lanes + l], 0.0f) << Name(c) << " lane " << l;
        }
        if (!c.int4) {
          for (int64_t col = c.k; col < acts.row_bytes; ++col) ASSERT_EQ(codes[col], offset);
          continue;
        }
        for (int64_t col = c.k; col < acts.row_bytes; ++col) {
          ASSERT_EQ(codes[(col & 1) * half + col / 2], 0) << Name(c) << " padding " << col;
        }
        const int64_t g = std::min(c.group, c.k);
        for (int64_t gi = 0; gi * g < c.k; ++gi) {
          double sum = 0, mag = 0;
          for (int64_t col = gi * g; col < std::min(c.k, (gi + 1) * g); ++col) {
            sum += xr[col];
            mag += std::fabs(xr[col]);
          }
          ASSERT_NEAR(acts.group_sums[r * acts.groups + gi], sum, 1e-6 * mag) << Name(c);
        }
      }
    }
  }
  cpu::SetPackedMinRowsForTest(0);
}

// The packed layout holds the same codes, block scales and group sums as the by-rows one, dealt
// into quads of rows (quant_vnni.h): dword d of row r in block b at quad r / 4, position
// (b * 8 + d) * 4 + r % 4; the padding rows of the last quad are zero (int8: code 128, or 0
// where the codes are not offset).
TEST_F(QuantMatMulTest, PackedActsHoldTheRowsCodes) {
  Rng rng(22);
  int tested = 0;
  for (const Case& c : kCases) {
    if (!cpu::PackedTilesSupport(c.k, c.group)) continue;
    ++tested;
    RandomWeight rw(rng, c);
    Owned x(DType::kF32, {c.m, c.k}), out(DType::kF32, {c.m, c.n});
    rng.Fill(x, -2.0f, 2.0f);
    const cpu::QuantMatMulArgs a = ArgsFor(c, rw, x, c.k, false, out, c.n);
    // int8 x codes offset (VNNI) and not (AVX2), by turns.
    const cpu::IntegerDotPath path =
        tested % 2 == 0 ? cpu::IntegerDotPath::kVnni512 : cpu::IntegerDotPath::kAvx2;
    cpu::QuantizedActs rows, packed;
    cpu::SetPackedMinRowsForTest(int64_t{1} << 40);
    cpu::QuantizeActs(a, &rows, nullptr, path);
    cpu::SetPackedMinRowsForTest(1);
    packed.codes.assign(static_cast<size_t>(4 * (c.m + 4) * (c.k + 64)), 0x5a);  // stale data
    cpu::QuantizeActs(a, &packed, nullptr, path);
    cpu::SetPackedMinRowsForTest(0);
    ASSERT_EQ(packed.int8_signed, rows.int8_signed);
    ASSERT_FALSE(rows.packed);
    ASSERT_TRUE(packed.packed);
    const int64_t nb = packed.blocks, half = rows.row_bytes / 2;
    const int64_t lanes_per_block = 32 / (c.int4 ? 8 : 4);
    for (int64_t r = 0; r < (c.m + 3) / 4 * 4; ++r) {
      const int64_t quad = r / 4, lane = r % 4;
      for (int64_t b = 0; b < nb; ++b) {
        for (int64_t d = 0; d < 8; ++d) {
          const uint8_t* got = packed.codes.data() + quad * nb * 128 + (b * 8 + d) * 16 + lane * 4;
          for (int64_t i = 0; i < 4; ++i) {
            int want = c.int4 || packed.int8_signed ? 0 : 128;
            if (r < c.m) {
              const int64_t src = c.int4 ? (d & 1) * half + b * 16 + (d >> 1) * 4 + i
                                         : b * 32 + d * 4 + i;
              want = rows.codes[r * rows.row_bytes + src];
            }
            ASSERT_EQ(got[i], want) << Name(c) << " row " << r << " block " << b << " dword " << d;
          }
        }
        const float want_scale =
            r < c.m ? rows.lane_scales[r * rows.lanes + b * lanes_per_block] : 0.0f;
        ASSERT_EQ(packed.lane_scales[(quad * nb + b) * 4 + lane], want_scale) << Name(c);
      }
      for (int64_t gi = 0; gi < rows.groups; ++gi) {
        const float want_sum = r < c.m ? rows.group_sums[r * rows.groups + gi] : 0.0f;
        ASSERT_EQ(packed.group_sums[(quad * rows.groups + gi) * 4 + lane], want_sum) << Name(c);
      }
    }
  }
  EXPECT_GT(tested, 15);
}

// Per output column j: sum over the row of 2 |w| + 2 (|x| <= 2; covers the int4 min term) plus
// |bias_j|, the scale of the f32 summation-order tolerance between integer kernels.
std::vector<double> TermMagnitudes(const Case& c, const RandomWeight& rw) {
  std::vector<float> row(c.k);
  std::vector<double> mag(c.n);
  for (int64_t j = 0; j < c.n; ++j) {
    ref::DecodeWeightRow(rw.w, j, row.data());
    for (float v : row) mag[j] += 2.0 * std::fabs(v) + 2.0;
    mag[j] += std::fabs(rw.bias.t.as<const float>()[j]);
  }
  return mag;
}

// got and want (c.m rows of c.n outputs, `stride` apart) within 1e-5 * mag[j] of each other.
void ExpectNearPerRow(const Case& c, Owned& got, Owned& want, int64_t stride,
                      const std::vector<double>& mag, const std::string& what) {
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t j = 0; j < c.n; ++j) {
      const float g = got.f32()[r * stride + j], p = want.f32()[r * stride + j];
      ASSERT_LE(std::fabs(g - p), 1e-5 * mag[j]) << what << " row " << r << " col " << j;
    }
  }
}

// The packed tiles (kLanes weight rows side by side, quant_int_dot-inl.h) on every integer
// kernel, forced at every M: within the quantization bound of the reference, and within f32
// summation order of the per-row kernel (both take exact i32 dots of the same codes; here the
// tolerance is 1e-5 of sum |w| * max|x| + |min term| + |bias| per output). Ranges are split
// inside a tile and at odd rows so partial tiles are packed too.
TEST_F(QuantMatMulTest, PackedTilesMatchPerRowKernel) {
  const auto paths = AvailablePaths();
  if (paths.empty()) GTEST_SKIP() << "CPU has no integer-dot kernel (no AVX2)";
  Rng rng(23);
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  for (const Case& c : {Case{true, 13, 40, 1536, 32}, Case{false, 11, 35, 1536, 32},
                        Case{true, 9, 33, 640, 128}, Case{false, 6, 48, 640, 640},
                        Case{true, 5, 17, 1111, 1111}, Case{true, 20, 16, 256, 64},
                        Case{false, 3, 50, 2048, 128}}) {
    cases.push_back(c);
  }
  int tested = 0;
  for (const Case& c : cases) {
    if (!cpu::IntegerDotSupports(c.int4, c.k, c.group) ||
        !cpu::PackedTilesSupport(c.k, c.group)) {
      continue;
    }
    ++tested;
    RandomWeight rw(rng, c);
    Owned x(DType::kF32, {c.m, c.k}), per_row(DType::kF32, {c.m, c.n + 3}),
        got(DType::kF32, {c.m, c.n + 3}), want(DType::kF32, {c.m, c.n});
    rng.Fill(x, -2.0f, 2.0f);
    ref_.MatMul(x.t, rw.w, rw.bias.t, want.t);
    const std::vector<double> mag = TermMagnitudes(c, rw);
    for (cpu::IntegerDotPath path : paths) {
      const std::string what = std::string(cpu::IntegerDotPathName(path)) + " " + Name(c);
      for (bool packed : {false, true}) {
        cpu::SetPackedMinRowsForTest(packed ? 1 : int64_t{1} << 40);
        const cpu::QuantMatMulArgs a =
            ArgsFor(c, rw, x, c.k, true, packed ? got : per_row, c.n + 3);
        cpu::QuantizedActs acts;
        cpu::QuantizeActs(a, &acts, nullptr, path);
        ASSERT_EQ(acts.packed, packed);
        const int64_t cut = std::min<int64_t>(c.n, 5), cut2 = std::max(cut, c.n - 3);
        cpu::IntegerDotRangeOn(path, a, acts, 0, cut);
        cpu::IntegerDotRangeOn(path, a, acts, cut, cut2);
        cpu::IntegerDotRangeOn(path, a, acts, cut2, c.n);
      }
      cpu::SetPackedMinRowsForTest(0);
      ExpectWithinQuantBound(c, rw.w, x, c.k, true, rw.bias, got.f32(), c.n + 3,
                             want.ToVector(), "packed " + what);
      ASSERT_NO_FATAL_FAILURE(
          ExpectNearPerRow(c, got, per_row, c.n + 3, mag, "packed vs per-row " + what));
    }
  }
  EXPECT_GT(tested, 20);
}

// Prepacked tiles (quant_vnni.h, PrepackTiles: what CpuBackend::PrepareWeight makes), int8 and
// int4, on every integer kernel, forced at every M: within the quantization bound of the
// reference and within f32 summation order of the per-row kernel, as the tiles packed per call
// above; ranges split at tile boundaries as the backend splits them, partial last tiles, odd K,
// both zero offsets. The 256-bit kernels read each tile as two halves, from 64 rows (8 passes
// of 8) through a contiguous copy of each half (65 and 69 rows here).
TEST_F(QuantMatMulTest, PrepackedTilesMatchPerRowKernel) {
  const auto paths = AvailablePaths();
  if (paths.empty()) GTEST_SKIP() << "CPU has no integer-dot kernel (no AVX2)";
  Rng rng(29);
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  for (const Case& c : {Case{true, 1, 40, 1536, 32}, Case{true, 2, 47, 2048, 32},
                        Case{false, 1, 40, 1536, 32}, Case{false, 3, 47, 2048, 2048},
                        Case{false, 8, 33, 640, 128}, Case{false, 5, 17, 1111, 1111},
                        Case{true, 3, 33, 640, 128}, Case{true, 8, 16, 256, 64},
                        Case{true, 9, 65, 1111, 1111}, Case{true, 4, 31, 1408, 32},
                        Case{true, 12, 18, 96, 96}, Case{true, 1, 20, 8960, 32},
                        Case{true, 2, 33, 8192, 128}, Case{true, 33, 40, 512, 32},
                        Case{false, 37, 24, 640, 128}, Case{true, 65, 40, 512, 32},
                        Case{false, 69, 24, 640, 128}}) {
    cases.push_back(c);
  }
  int tested = 0;
  for (const Case& c : cases) {
    if (!cpu::PrepackSupports(c.int4, c.k, c.group)) continue;
    ++tested;
    RandomWeight rw(rng, c);
    const size_t bytes = cpu::PrepackedBytes(c.int4, c.n, c.k, c.group);
    ASSERT_GT(bytes, 0u) << Name(c);
    std::vector<uint8_t> tiles(bytes + 64, 0xcd);  // a canary past the end
    uint8_t* base = tiles.data();
    Owned x(DType::kF32, {c.m, c.k}), per_row(DType::kF32, {c.m, c.n + 3}),
        got(DType::kF32, {c.m, c.n + 3}), want(DType::kF32, {c.m, c.n});
    rng.Fill(x, -2.0f, 2.0f);
    {
      cpu::QuantMatMulArgs a = ArgsFor(c, rw, x, c.k, true, got, c.n + 3);
      const int64_t ntiles = (c.n + cpu::kPrepackedRows - 1) / cpu::kPrepackedRows;
      cpu::PrepackTiles(a, c.n, 0, ntiles / 2, base);  // in two calls, as the pool does
      cpu::PrepackTiles(a, c.n, ntiles / 2, ntiles, base);
      for (size_t i = bytes; i < tiles.size(); ++i) ASSERT_EQ(tiles[i], 0xcd) << Name(c);
    }
    ref_.MatMul(x.t, rw.w, rw.bias.t, want.t);
    const std::vector<double> mag = TermMagnitudes(c, rw);
    for (cpu::IntegerDotPath path : paths) {
      const std::string what = std::string(cpu::IntegerDotPathName(path)) + " " + Name(c);
      // The row layout; the tiles with packed x; the tiles with x by rows (int4 where
      // FewRowsTakeTiles: PrepackedFewRowsInt4, which serves decode; int8 and longer int4 rows
      // on vnni512: the row layout again).
      Owned by_rows(DType::kF32, {c.m, c.n + 3});
      for (int variant = 0; variant < 3; ++variant) {
        const bool tiled = variant == 1;
        cpu::SetPackedMinRowsForTest(tiled ? 1 : int64_t{1} << 40);
        Owned& dst = variant == 0 ? per_row : variant == 1 ? got : by_rows;
        cpu::QuantMatMulArgs a = ArgsFor(c, rw, x, c.k, true, dst, c.n + 3);
        if (variant > 0) a.tiles = base;
        // Only the tiles may be read where the kernel takes them at every M.
        const bool tiles_only = variant == 2 && cpu::FewRowsTakeTiles(path, c.int4, c.k);
        if (tiles_only) a.q = nullptr, a.scales = nullptr, a.zeros = nullptr;
        cpu::QuantizedActs acts;
        cpu::QuantizeActs(a, &acts, nullptr, path);
        ASSERT_EQ(acts.packed, tiled);
        const int64_t cut = std::min<int64_t>(c.n, cpu::kPrepackedRows);
        const int64_t cut2 = std::max(cut, (c.n - 1) / cpu::kPrepackedRows * cpu::kPrepackedRows);
        cpu::IntegerDotRangeOn(path, a, acts, 0, cut);
        cpu::IntegerDotRangeOn(path, a, acts, cut, cut2);
        cpu::IntegerDotRangeOn(path, a, acts, cut2, c.n);
      }
      cpu::SetPackedMinRowsForTest(0);
      ExpectWithinQuantBound(c, rw.w, x, c.k, true, rw.bias, got.f32(), c.n + 3,
                             want.ToVector(), "prepacked " + what);
      ASSERT_NO_FATAL_FAILURE(
          ExpectNearPerRow(c, got, per_row, c.n + 3, mag, "prepacked vs per-row " + what));
      ExpectWithinQuantBound(c, rw.w, x, c.k, true, rw.bias, by_rows.f32(), c.n + 3,
                             want.ToVector(), "prepacked, x by rows " + what);
      ASSERT_NO_FATAL_FAILURE(ExpectNearPerRow(c, by_rows, per_row, c.n + 3, mag,
                                               "prepacked x by rows vs per-row " + what));
    }
  }
  EXPECT_GT(tested, 30);
}

// UnpackTiles (a compile cache's int4 weight kept as tiles alone, whose rows a load needs) gives
// back exactly the row layout PrepackTiles packed: codes, f16 scales and zero nibbles, for int8
// and int4, partial last tiles, odd K and one group per row; in two calls, as the pool splits it.
TEST_F(QuantMatMulTest, UnpackedTilesGiveTheRowsBack) {
  Rng rng(37);
  int tested = 0;
  for (const Case& c : {Case{true, 1, 40, 1536, 32}, Case{true, 1, 47, 2048, 128},
                        Case{true, 1, 33, 1111, 1111}, Case{true, 1, 18, 96, 96},
                        Case{true, 1, 16, 8960, 32}, Case{true, 1, 5, 130, 2},
                        Case{false, 1, 40, 1536, 32}, Case{false, 1, 17, 1111, 1111},
                        Case{false, 1, 33, 640, 128}}) {
    if (!cpu::PrepackSupports(c.int4, c.k, c.group)) continue;
    ++tested;
    RandomWeight rw(rng, c);
    std::vector<uint8_t> tiles(cpu::PrepackedBytes(c.int4, c.n, c.k, c.group));
    cpu::QuantMatMulArgs a;
    rw.SetArgs(a);
    a.k = c.k;
    const int64_t ntiles = (c.n + cpu::kPrepackedRows - 1) / cpu::kPrepackedRows;
    cpu::PrepackTiles(a, c.n, 0, ntiles, tiles.data());
    RandomWeight back(rng, c);  // other random bytes, all overwritten
    cpu::QuantMatMulArgs b;
    back.SetArgs(b);
    b.k = c.k;
    b.tiles = tiles.data();
    cpu::UnpackTiles(b, c.n, 0, ntiles / 2);
    cpu::UnpackTiles(b, c.n, ntiles / 2, ntiles);
    EXPECT_EQ(back.q.bytes, rw.q.bytes) << Name(c);
    EXPECT_EQ(back.scales.bytes, rw.scales.bytes) << Name(c);
    if (c.int4) {
      const int64_t groups = (c.k + c.group - 1) / c.group, stride = rw.zeros.t.shape[1];
      for (int64_t j = 0; j < c.n; ++j) {
        for (int64_t g = 0; g < groups; ++g) {
          ASSERT_EQ(ZeroNibble(back.zeros.bytes.data() + j * stride, g),
                    ZeroNibble(rw.zeros.bytes.data() + j * stride, g))
              << Name(c) << " row " << j << " group " << g;
        }
      }
    }
  }
  EXPECT_GE(tested, 6);
}

// PrepackTiles' fast code transposes on 256 bits (two 8 x 8 per 32 bytes of the 16 rows, CPUs
// without AVX-512) put every dword where the tile layout says: step s of row i at s * 16 + i.
TEST_F(QuantMatMulTest, TileCodeTransposes256FollowTheLayout) {
  if (!cpu::CpuHasAvx2()) GTEST_SKIP() << "no AVX2";
  Rng rng(41);
  for (int64_t row_bytes : {4, 31, 32, 64, 100, 768}) {
    const int64_t stride = row_bytes + 5;
    std::vector<uint8_t> q(static_cast<size_t>(cpu::kPrepackedRows * stride));
    for (uint8_t& b : q) b = static_cast<uint8_t>(rng.Int(0, 255));
    const int64_t steps = (row_bytes + 3) / 4;
    std::vector<int32_t> codes(static_cast<size_t>(steps * cpu::kPrepackedRows), -1);
    const int64_t done = cpu::PrepackTileCodes256(q.data(), stride, row_bytes, codes.data());
    EXPECT_EQ(done, row_bytes / 32 * 8) << row_bytes;
    for (int64_t s = 0; s < done; ++s) {
      for (int64_t i = 0; i < cpu::kPrepackedRows; ++i) {
        int32_t want;
        std::memcpy(&want, q.data() + i * stride + 4 * s, 4);
        ASSERT_EQ(codes[s * cpu::kPrepackedRows + i], want)
            << row_bytes << " step " << s << " row " << i;
      }
    }
  }
}

// Whether CpuBackend::PrepareWeight gives a weight of case c its prepacked copy on the active
// kernel: PrepackWanted, and a machine with little memory left takes no chunk for the copies
// (PrepareWeight's headroom; the tests' weights are far smaller than one chunk).
bool PrepareWeightMakesTiles(const Case& c) {
  const MemoryInfo mem = ReadMemoryInfo();
  return cpu::PrepackWanted(c.int4, c.k) &&
         (mem.available == 0 || mem.available >= kBufferChunkBytes + cpu::kPrepackHeadroomBytes);
}

// CpuBackend::PrepareWeight: int8 and int4 weights get their prepacked copy where the CPU's best
// kernel is vnni512, and MatMul over the prepared weight gives the unprepared
// one's outputs within f32 summation order at every M, the default thresholds included.
TEST_F(QuantMatMulTest, PreparedWeightMatchesRowLayout) {
  Rng rng(31);
  for (const Case& c : {Case{true, 1, 70, 512, 32}, Case{true, 2, 70, 512, 32},
                        Case{true, 3, 70, 512, 32}, Case{true, 8, 70, 512, 32},
                        Case{true, 40, 37, 256, 128}, Case{true, 1, 24, 8960, 32},
                        Case{false, 1, 20, 256, 32},
                        Case{false, 3, 20, 256, 32}, Case{false, 9, 20, 256, 256}}) {
    RandomWeight rw(rng, c);
    Result<Weight> prepared = cpu_.PrepareWeight(rw.w);
    ASSERT_TRUE(prepared.ok()) << prepared.status().message();
    const bool want_tiles = PrepareWeightMakesTiles(c);
    ASSERT_EQ(!prepared->packed.empty(), want_tiles) << Name(c);
    if (want_tiles) {
      EXPECT_EQ(prepared->packed.nbytes(), cpu::PrepackedBytes(c.int4, c.n, c.k, c.group));
    }
    // int4 tiles serve every M where FewRowsTakeTiles, so the rows are released (this
    // test's own memory is not registered, so its bytes stay; the products must not read them:
    // scribbled below).
    EXPECT_EQ(prepared->rows_released,
              want_tiles && cpu::FewRowsTakeTiles(cpu::ActiveIntegerDotPath(), c.int4, c.k))
        << Name(c);
    Owned x(DType::kF32, {c.m, c.k}), a(DType::kF32, {c.m, c.n}), b(DType::kF32, {c.m, c.n});
    rng.Fill(x, -2.0f, 2.0f);
    const std::vector<double> mag = TermMagnitudes(c, rw);
    cpu_.MatMul(x.t, rw.w, rw.bias.t, a.t);
    if (prepared->rows_released) {
      std::fill(rw.q.bytes.begin(), rw.q.bytes.end(), uint8_t{0x77});
      std::fill(rw.scales.bytes.begin(), rw.scales.bytes.end(), uint8_t{0xff});  // f16 NaN
      std::fill(rw.zeros.bytes.begin(), rw.zeros.bytes.end(), uint8_t{0x99});
    }
    cpu_.MatMul(x.t, *prepared, rw.bias.t, b.t);
    ASSERT_NO_FATAL_FAILURE(ExpectNearPerRow(c, b, a, c.n, mag, "prepared vs rows " + Name(c)));
  }
  // A table the loader marks read by rows (an embedding) keeps them.
  const Case c{true, 1, 64, 256, 32};
  RandomWeight rw(rng, c);
  rw.w.read_by_rows = true;
  Result<Weight> prepared = cpu_.PrepareWeight(rw.w);
  ASSERT_TRUE(prepared.ok()) << prepared.status().message();
  EXPECT_FALSE(prepared->rows_released);
}

// Runs `weights` over one x through CpuBackend::MatMuls and through MatMul one by one: the same
// bits for every output (x prepared once, the rows of all weights handed out in one loop, must
// not change a single product). Returns how many products MatMuls ran over a shared x.
uint64_t ExpectMatMulsBitsOfMatMul(CpuBackend& cpu, Rng& rng, int64_t m,
                                   const std::vector<const Weight*>& weights,
                                   const std::vector<const Owned*>& biases,
                                   const std::string& what) {
  const int64_t k = weights[0]->cols;
  Owned x(DType::kF32, {m, k});
  rng.Fill(x, -2.0f, 2.0f);
  std::vector<std::unique_ptr<Owned>> got, want;
  std::vector<MatMulTarget> targets;
  for (size_t i = 0; i < weights.size(); ++i) {
    got.push_back(std::make_unique<Owned>(DType::kF32, std::initializer_list<int64_t>{m, weights[i]->rows}));
    want.push_back(std::make_unique<Owned>(DType::kF32, std::initializer_list<int64_t>{m, weights[i]->rows}));
    std::fill(got.back()->bytes.begin(), got.back()->bytes.end(), uint8_t{0x7f});
    const Tensor bias = biases[i] != nullptr ? biases[i]->t : Tensor();
    cpu.MatMul(x.t, *weights[i], bias, want.back()->t);
    targets.push_back({weights[i], bias, got.back()->t});
  }
  const uint64_t before = cpu.shared_x_products();
  cpu.MatMuls(x.t, targets);
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(std::memcmp(got[i]->bytes.data(), want[i]->bytes.data(), got[i]->bytes.size()), 0)
        << what << ": weight " << i << " [" << weights[i]->rows << ", " << k << "] M=" << m;
  }
  return cpu.shared_x_products() - before;
}

// CpuBackend::MatMuls over q, k and v shaped weights (rows that are not whole tiles of 16, so a
// thread's chunk crosses from one weight into the next): each weight's MatMul bits, on every
// integer kernel of this CPU and with the f32 products, from the row layout and from prepacked
// tiles; the shared path runs where the integer products take every weight, and weights of
// different formats go one by one.
TEST_F(QuantMatMulTest, MatMulsGiveEachWeightsMatMulBits) {
  Rng rng(33);
  const int64_t ms[] = {1, 2, 3, 8, 17};
  for (bool int4 : {true, false}) {
    std::vector<std::unique_ptr<RandomWeight>> rw;
    for (int64_t n : {70, 20, 20}) rw.push_back(std::make_unique<RandomWeight>(rng, Case{int4, 1, n, 512, 32}));
    const std::vector<const Weight*> rows = {&rw[0]->w, &rw[1]->w, &rw[2]->w};
    const std::vector<const Owned*> biases = {&rw[0]->bias, &rw[1]->bias, nullptr};
    std::vector<cpu::IntegerDotPath> paths = AvailablePaths();
    paths.push_back(cpu::IntegerDotPath::kNone);  // stands for DH_INTEGER_DOT=off below
    for (cpu::IntegerDotPath path : paths) {
      const bool off = path == cpu::IntegerDotPath::kNone;
      cpu::SetIntegerDotForTest(off ? cpu::IntegerDot::kOff : cpu::IntegerDot::kOn);
      if (!off) cpu::SetIntegerDotPathForTest(path);
      for (int64_t m : ms) {
        const std::string what = fmt::format("{} {}", int4 ? "int4" : "int8",
                                             off ? "f32 products" : cpu::IntegerDotPathName(path));
        const uint64_t shared = ExpectMatMulsBitsOfMatMul(cpu_, rng, m, rows, biases, what);
        EXPECT_EQ(shared, off ? 0u : 3u) << what << " M=" << m;
      }
    }
    cpu::SetIntegerDotPathForTest(cpu::IntegerDotPath::kNone);
    cpu::SetIntegerDotForTest(cpu::IntegerDot::kAuto);
    // Prepared weights (prepacked tiles where the best kernel reads them).
    std::vector<Weight> prepared;
    for (const Weight* w : rows) {
      Result<Weight> p = cpu_.PrepareWeight(*w);
      ASSERT_TRUE(p.ok()) << p.status().message();
      prepared.push_back(*p);
    }
    const std::vector<const Weight*> tiles = {&prepared[0], &prepared[1], &prepared[2]};
    for (int64_t m : ms) {
      const std::string what = fmt::format("{} prepared", int4 ? "int4" : "int8");
      const uint64_t shared = ExpectMatMulsBitsOfMatMul(cpu_, rng, m, tiles, biases, what);
      if (!AvailablePaths().empty()) {
        EXPECT_EQ(shared, 3u) << what << " M=" << m;
      }
    }
  }
  // int4 beside int8: two quantizations of x, so MatMul one by one.
  RandomWeight a(rng, Case{true, 1, 40, 256, 32}), b(rng, Case{false, 1, 24, 256, 32});
  EXPECT_EQ(ExpectMatMulsBitsOfMatMul(cpu_, rng, 2, {&a.w, &b.w}, {&a.bias, &b.bias}, "mixed"), 0u);
}

// An int4 weight in memory this process mapped (a backend buffer, as the loader's): PrepareWeight
// hands its row layout back to the system (the pages read as zero, not resident) and MatMul reads
// the tiles alone; under HoldReleases the bytes stay until ReleaseHeldRows.
TEST_F(QuantMatMulTest, PreparedInt4WeightReleasesItsRows) {
  if (!cpu::PrepackWanted(/*int4=*/true)) {
    GTEST_SKIP() << "no prepacked tiles with this CPU's integer kernel";
  }
  const MemoryInfo mem = ReadMemoryInfo();
  if (mem.available != 0 && mem.available < kBufferChunkBytes + cpu::kPrepackHeadroomBytes) {
    GTEST_SKIP() << "too little memory left for a chunk of prepacked tiles";
  }
  Rng rng(33);
  const Case c{true, 1, 2048, 2048, 32};  // 2 MiB of codes: a mapped buffer of its own
  RandomWeight rw(rng, c);
  Owned x(DType::kF32, {c.m, c.k}), want(DType::kF32, {c.m, c.n}), got(DType::kF32, {c.m, c.n});
  rng.Fill(x, -2.0f, 2.0f);
  cpu_.MatMul(x.t, rw.w, rw.bias.t, want.t);
  const std::vector<double> mag = TermMagnitudes(c, rw);
  for (bool hold : {false, true}) {
    auto codes = cpu_.Allocate(rw.q.t.nbytes());
    ASSERT_NE(codes, nullptr);
    std::memcpy(codes->data(), rw.q.t.data, rw.q.t.nbytes());
    Weight w = rw.w;
    w.data = Tensor(codes->data(), w.data.dtype, {c.n, c.k / 2});
    if (hold) cpu_.HoldReleases();
    Result<Weight> prepared = cpu_.PrepareWeight(w);
    ASSERT_TRUE(prepared.ok()) << prepared.status().message();
    ASSERT_FALSE(prepared->packed.empty());
    EXPECT_EQ(prepared->rows_released, !hold);
    const auto* bytes = static_cast<const uint8_t*>(codes->data());
    const size_t n = rw.q.t.nbytes();
    auto all_zero = [&] {
      for (size_t i = 0; i < n; ++i) {
        if (bytes[i] != 0) return false;
      }
      return true;
    };
    if (hold) {
      EXPECT_EQ(std::memcmp(bytes, rw.q.t.data, n), 0) << "held rows keep their bytes";
      cpu_.ReleaseHeldRows();
    }
    EXPECT_TRUE(all_zero()) << "hold " << hold << ": the rows' pages were not handed back";
    cpu_.MatMul(x.t, *prepared, rw.bias.t, got.t);
    ASSERT_NO_FATAL_FAILURE(ExpectNearPerRow(c, got, want, c.n, mag,
                                             fmt::format("released rows, hold {}", hold)));
  }
}

// A 256-bit integer kernel in use (DH_CPU_TIER=avx2|avxvnni, DH_INTEGER_DOT=avx2|avxvnni) makes
// the copies a CPU of that tier makes: int4 weights get their tiles and read them at every M (so
// their rows are released, at every row length, unlike vnni512's longer than
// kFewRowsTilesMaxK), int8 weights get tiles beside their rows (read from 5 rows of x; Zen 1's
// half-width units keep the rows of all); MatMul over the prepared weight gives the row
// layout's outputs within f32 summation order at one and two rows of x (by rows) and from three
// (int4) or five (int8) rows over the tiles, x packed.
TEST_F(QuantMatMulTest, A256BitKernelPrepacksAsItsTierDoes) {
  const cpu::IntegerDotPath before = cpu::ActiveIntegerDotPath();
  Rng rng(32);
  int tested = 0;
  for (cpu::IntegerDotPath path : {cpu::IntegerDotPath::kAvx2, cpu::IntegerDotPath::kAvxVnni}) {
    if (!cpu::IntegerDotPathAvailable(path)) continue;
    ++tested;
    cpu::SetIntegerDotPathForTest(path);
    for (const Case& c : {Case{false, 1, 70, 512, 32}, Case{false, 6, 70, 512, 32},
                          Case{false, 9, 40, 1536, 32}, Case{false, 4, 37, 256, 128},
                          Case{true, 1, 70, 512, 32}, Case{true, 2, 70, 512, 32},
                          Case{true, 3, 70, 1408, 32}, Case{true, 5, 40, 256, 128},
                          Case{true, 1, 20, 8960, 32}, Case{true, 2, 20, 8960, 32},
                          Case{true, 8, 20, 8960, 32}}) {
      const std::string what = std::string(cpu::IntegerDotPathName(path)) + " " + Name(c);
      RandomWeight rw(rng, c);
      EXPECT_EQ(cpu::PrepackWanted(c.int4, c.k), !cpu::CpuHalfWidthVectorUnits()) << what;
      Result<Weight> prepared = cpu_.PrepareWeight(rw.w);
      ASSERT_TRUE(prepared.ok()) << prepared.status().message();
      const bool want_tiles = PrepareWeightMakesTiles(c);
      ASSERT_EQ(!prepared->packed.empty(), want_tiles) << what;
      EXPECT_EQ(prepared->rows_released, want_tiles && c.int4) << what;
      Owned x(DType::kF32, {c.m, c.k}), a(DType::kF32, {c.m, c.n}), b(DType::kF32, {c.m, c.n});
      rng.Fill(x, -2.0f, 2.0f);
      const std::vector<double> mag = TermMagnitudes(c, rw);
      cpu_.MatMul(x.t, rw.w, rw.bias.t, a.t);
      if (prepared->rows_released) {  // the products must not read them
        std::fill(rw.q.bytes.begin(), rw.q.bytes.end(), uint8_t{0x77});
        std::fill(rw.scales.bytes.begin(), rw.scales.bytes.end(), uint8_t{0xff});  // f16 NaN
        std::fill(rw.zeros.bytes.begin(), rw.zeros.bytes.end(), uint8_t{0x99});
      }
      cpu_.MatMul(x.t, *prepared, rw.bias.t, b.t);
      ASSERT_NO_FATAL_FAILURE(ExpectNearPerRow(c, b, a, c.n, mag, "prepared vs rows " + what));
    }
  }
  // Put back what was forced: nothing where the best kernel was in use, else the tier's kernel.
  cpu::SetIntegerDotPathForTest(before == cpu::BestIntegerDotPath() ? cpu::IntegerDotPath::kNone
                                                                    : before);
  if (tested == 0) GTEST_SKIP() << "no 256-bit integer kernel on this CPU";
}

// All integer kernels compute the same exact i32 lane dots, so their outputs differ only by f32
// summation order: within 1e-5 of sum |lane terms| (bounded here by sum_c |w_c| * max|x| plus
// the int4 min term's sum_g |min_g| * |sum x_g|, and the bias).
TEST_F(QuantMatMulTest, IntegerDotPathsAgree) {
  const auto paths = AvailablePaths();
  if (paths.size() < 2) GTEST_SKIP() << "fewer than two integer-dot kernels on this CPU";
  Rng rng(16);
  for (const Case& c : kCases) {
    if (!cpu::IntegerDotSupports(c.int4, c.k, c.group)) continue;
    RandomWeight rw(rng, c);
    Owned x(DType::kF32, {c.m, c.k}), first(DType::kF32, {c.m, c.n}), got(DType::kF32, {c.m, c.n});
    rng.Fill(x, -2.0f, 2.0f);
    const std::vector<double> mag = TermMagnitudes(c, rw);
    for (size_t p = 0; p < paths.size(); ++p) {
      const cpu::QuantMatMulArgs a = ArgsFor(c, rw, x, c.k, true, p == 0 ? first : got, c.n);
      cpu::QuantizedActs acts;
      cpu::QuantizeActs(a, &acts, nullptr, paths[p]);
      cpu::IntegerDotRangeOn(paths[p], a, acts, 0, c.n);
      if (p == 0) continue;
      for (int64_t r = 0; r < c.m; ++r) {
        for (int64_t j = 0; j < c.n; ++j) {
          const float g = got.f32()[r * c.n + j], want_v = first.f32()[r * c.n + j];
          ASSERT_LE(std::fabs(g - want_v), 1e-5 * mag[j])
              << cpu::IntegerDotPathName(paths[p]) << " vs " << cpu::IntegerDotPathName(paths[0])
              << " " << Name(c) << " row " << r << " col " << j;
        }
      }
    }
  }
}

// The extreme codes: int8 weights of -128 and 127 against x codes of +-127 put every vpmaddubsw
// pair at its largest (2 * 128 * 127 = 32512 on the AVX2 path, below i16 saturation). With |x|
// all equal, x quantizes exactly (code +-127, scale |x| / 127), so every path must give the exact
// product up to f32 rounding.
TEST_F(QuantMatMulTest, IntegerDotExtremeCodesExact) {
  const auto paths = AvailablePaths();
  if (paths.empty()) GTEST_SKIP() << "CPU has no integer-dot kernel (no AVX2)";
  // 3 rows of x, and one row (the AVX2 int4 kernel folds each run's int16 pair sums per row of
  // x; with codes 15 and x codes 127 every lane reaches its largest value, 16 * 15 * 127).
  for (const auto& [int4, m] : {std::pair{false, 3}, std::pair{true, 3}, std::pair{true, 1}}) {
    const Case c{int4, m, 4, 256, 32};
    Rng rng(17);
    RandomWeight rw(rng, c);
    uint8_t* q = static_cast<uint8_t*>(rw.q.t.data);
    const int64_t row_bytes = rw.q.t.shape[1];
    for (int64_t j = 0; j < c.n; ++j) {
      for (int64_t b = 0; b < row_bytes; ++b) {
        // int8: rows 0, 2 all -128, rows 1, 3 all 127; int4: all codes 15 or 0.
        q[j * row_bytes + b] = int4 ? (j % 2 ? 0x00 : 0xff) : (j % 2 ? 0x7f : 0x80);
      }
    }
    Owned x(DType::kF32, {c.m, c.k}), got(DType::kF32, {c.m, c.n}), want(DType::kF32, {c.m, c.n});
    for (int64_t r = 0; r < c.m; ++r) {
      for (int64_t col = 0; col < c.k; ++col) {
        // Row 0 all +1.5, row 1 all -1.5 (same-sign products at the maximum), row 2 alternating.
        x.f32()[r * c.k + col] = r == 0 ? 1.5f : (r == 1 ? -1.5f : (col % 2 ? 1.5f : -1.5f));
      }
    }
    ref_.MatMul(x.t, rw.w, Tensor(), want.t);
    // int4 also from prepacked tiles with x by rows (PrepackedFewRowsInt4: AVX2 adds a block's
    // 16 products per int16 lane before widening).
    std::vector<uint8_t> tiles;
    if (int4) {
      tiles.resize(cpu::PrepackedBytes(true, c.n, c.k, c.group));
      cpu::QuantMatMulArgs a = ArgsFor(c, rw, x, c.k, false, got, c.n);
      cpu::PrepackTiles(a, c.n, 0, (c.n + cpu::kPrepackedRows - 1) / cpu::kPrepackedRows,
                        tiles.data());
    }
    cpu::SetPackedMinRowsForTest(int64_t{1} << 40);
    for (cpu::IntegerDotPath path : paths) {
      for (bool tiled : {false, true}) {
        if (tiled && !int4) continue;
        cpu::QuantMatMulArgs a = ArgsFor(c, rw, x, c.k, false, got, c.n);
        if (tiled) a.tiles = tiles.data(), a.q = nullptr, a.scales = nullptr, a.zeros = nullptr;
        cpu::QuantizedActs acts;
        cpu::QuantizeActs(a, &acts, nullptr, path);
        cpu::IntegerDotRangeOn(path, a, acts, 0, c.n);
        ExpectClose(got.ToVector(), want.ToVector(), 1e-5f,
                    std::string(cpu::IntegerDotPathName(path)) + (tiled ? " tiles" : "") +
                        " extreme " + Name(c));
      }
    }
    cpu::SetPackedMinRowsForTest(0);
  }
}

// CpuBackend::MatMul with the integer kernel forced on, on each integer kernel and every
// Highway target (the f32 kernels serve the layouts the integer kernel does not take), within
// the same bound.
TEST_F(QuantMatMulTest, BackendIntegerDotWithinQuantizationBound) {
  Rng rng(15);
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kOn);
  auto paths = AvailablePaths();
  if (paths.empty()) paths.push_back(cpu::IntegerDotPath::kNone);
  for (cpu::IntegerDotPath path : paths) {
    cpu::SetIntegerDotPathForTest(path);
    ForEachTarget([&] {
      for (const Case& c : kCases) {
        RandomWeight rw(rng, c);
        Owned x(DType::kF32, {c.m, c.k}), got(DType::kF32, {c.m, c.n}),
            want(DType::kF32, {c.m, c.n});
        rng.Fill(x, -2.0f, 2.0f);
        cpu_.MatMul(x.t, rw.w, rw.bias.t, got.t);
        ref_.MatMul(x.t, rw.w, rw.bias.t, want.t);
        ExpectWithinQuantBound(c, rw.w, x, c.k, true, rw.bias, got.f32(), c.n, want.ToVector(),
                               std::string("backend ") + cpu::IntegerDotPathName(path) + " " +
                                   Name(c));
      }
    });
  }
  cpu::SetIntegerDotPathForTest(cpu::IntegerDotPath::kNone);
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kAuto);
}

// The integer kernels serve batches (M up to 16) in tiles of weight rows: M = 12 and 16 over
// more weight rows than one tile holds, against the reference within the bound.
TEST_F(QuantMatMulTest, IntegerDotBatchTiles) {
  const auto paths = AvailablePaths();
  if (paths.empty()) GTEST_SKIP() << "CPU has no integer-dot kernel (no AVX2)";
  Rng rng(18);
  for (const Case& c : {Case{false, 12, 70, 1024, 32}, Case{true, 16, 150, 1024, 128},
                        Case{true, 9, 80, 2048, 32}}) {
    RandomWeight rw(rng, c);
    Owned x(DType::kF32, {c.m, c.k}), got(DType::kF32, {c.m, c.n}), want(DType::kF32, {c.m, c.n});
    rng.Fill(x, -2.0f, 2.0f);
    ref_.MatMul(x.t, rw.w, rw.bias.t, want.t);
    for (cpu::IntegerDotPath path : paths) {
      const cpu::QuantMatMulArgs a = ArgsFor(c, rw, x, c.k, true, got, c.n);
      cpu::QuantizedActs acts;
      cpu::QuantizeActs(a, &acts, nullptr, path);
      cpu::IntegerDotRangeOn(path, a, acts, 0, c.n);
      ExpectWithinQuantBound(c, rw.w, x, c.k, true, rw.bias, got.f32(), c.n, want.ToVector(),
                             std::string(cpu::IntegerDotPathName(path)) + " batch " + Name(c));
    }
  }
}

struct Fp8Case {
  int64_t m, n, k, block_rows, block_cols;
};

// Fp8MatMulRange takes every case below; through CpuBackend::MatMul up to 8 rows of x (32 on
// 512-bit targets) take it too, more the tiled GEMM over decoded panels.
const Fp8Case kFp8Cases[] = {
    {1, 37, 70, 16, 32}, {3, 200, 300, 128, 128}, {5, 9, 129, 128, 128}, {1, 1, 1, 1, 1},
    {2, 130, 256, 128, 128}, {4, 17, 33, 8, 16}, {7, 40, 45, 128, 128},
    {8, 70, 300, 128, 128},  // tiles of 4 and 2 weight rows, then the rest
    {9, 50, 200, 6, 64},     // blocks of 6 weight rows: tiles cut at each block
    {16, 23, 257, 128, 128},
    {40, 9, 2100, 128, 128},  // tiled GEMM with K cut into slices
    {40, 7, 1300, 128, 80},   // slices that do not start a block: decoded from whole rows
};

struct RandomFp8Weight {
  Owned q, scales, bias;
  Weight w;
  RandomFp8Weight(Rng& rng, const Fp8Case& c)
      : q(DType::kF8E4M3, {c.n, c.k}),
        scales(DType::kF32, {(c.n + c.block_rows - 1) / c.block_rows,
                             (c.k + c.block_cols - 1) / c.block_cols}),
        bias(DType::kF32, {c.n}) {
    rng.Fill(q);  // every code but NaN: normals, subnormals, zeros of both signs
    rng.Fill(scales, 0.001f, 0.05f);
    rng.Fill(bias);
    w.format = WeightFormat::kFp8Block;
    w.rows = c.n;
    w.cols = c.k;
    w.block_rows = static_cast<int>(c.block_rows);
    w.block_cols = static_cast<int>(c.block_cols);
    w.data = q.t;
    w.scales = scales.t;
  }
  cpu::Fp8MatMulArgs Args(const Fp8Case& c) const {
    cpu::Fp8MatMulArgs a;
    a.q = static_cast<const uint8_t*>(q.t.data);
    a.q_stride = c.k;
    a.scales = reinterpret_cast<const float*>(scales.bytes.data());
    a.scale_stride = scales.t.shape[1];
    a.block_rows = c.block_rows;
    a.block_cols = c.block_cols;
    a.k = c.k;
    return a;
  }
};

std::string Name(const Fp8Case& c) {
  return fmt::format("fp8 M={} N={} K={} block {}x{}", c.m, c.n, c.k, c.block_rows, c.block_cols);
}

// The FP8 kernel (codes decoded by integer steps, x times the block scales) against the
// reference MatMul: the decoded weights are the same values; x * scale is rounded where the
// reference rounds the weight * scale, and the summation order differs (2e-5).
TEST_F(QuantMatMulTest, Fp8KernelMatchesReference) {
  // x exact: with AVX512-BF16 the default rounds it to bf16 (Fp8Bf16Dot* below).
  const cpu::ScopedBf16DotForTest exact_x(cpu::Bf16Dot::kOff);
  Rng rng(16);
  ForEachTarget([&] {
    for (const Fp8Case& c : kFp8Cases) {
      RandomFp8Weight rw(rng, c);
      Owned x(DType::kF32, {c.m, c.k + 3}), got(DType::kF32, {c.m, c.n + 5}),
          want(DType::kF32, {c.m, c.n});
      rng.Fill(x, -2.0f, 2.0f);
      for (bool with_bias : {false, true}) {
        cpu::Fp8MatMulArgs a = rw.Args(c);
        a.x = x.f32();
        a.x_stride = c.k + 3;
        a.m = c.m;
        a.bias = with_bias ? rw.bias.f32() : nullptr;
        a.out = got.f32();
        a.out_stride = c.n + 5;
        cpu::Fp8MatMulRange(a, 0, c.n / 2);
        cpu::Fp8MatMulRange(a, c.n / 2, c.n);
        ref_.MatMul(x.t.Narrow(1, 0, c.k), rw.w, with_bias ? rw.bias.t : Tensor(), want.t);
        std::vector<float> g;
        for (int64_t r = 0; r < c.m; ++r) {
          for (int64_t j = 0; j < c.n; ++j) g.push_back(got.f32()[r * (c.n + 5) + j]);
        }
        ExpectClose(g, want.ToVector(), 2e-5f, Name(c) + (with_bias ? " bias" : ""));
      }
      // Through CpuBackend::MatMul (the fused kernel up to Fp8FusedMaxRows rows, decoded rows +
      // the dense GEMM above).
      Owned xc(DType::kF32, {c.m, c.k}), gc(DType::kF32, {c.m, c.n}), wc(DType::kF32, {c.m, c.n});
      rng.Fill(xc, -2.0f, 2.0f);
      cpu_.MatMul(xc.t, rw.w, rw.bias.t, gc.t);
      ref_.MatMul(xc.t, rw.w, rw.bias.t, wc.t);
      ExpectClose(gc.ToVector(), wc.ToVector(), 2e-5f, "backend " + Name(c));
    }
  });
}

// Each of the first `rows` rows of x through cpu.MatMul alone: one output row per row.
std::vector<std::vector<float>> RowsAlone(CpuBackend& cpu, const Owned& x, int64_t rows,
                                          const RandomFp8Weight& rw, int64_t n) {
  std::vector<std::vector<float>> alone;
  for (int64_t r = 0; r < rows; ++r) {
    Owned one(DType::kF32, {1, n});
    cpu.MatMul(x.t.Narrow(0, r, 1), rw.w, rw.bias.t, one.t);
    alone.push_back(one.ToVector());
  }
  return alone;
}

// Through CpuBackend::MatMul, each row of up to Fp8FusedMaxRows rows of x gives the same bits as
// that row alone: the FP8 kernel sums a row the same way whatever the rows, tiles and thread
// ranges around it (docs/kernels.md "FP8 weights"), in a verification chunk as in decode.
TEST_F(QuantMatMulTest, Fp8RowDoesNotDependOnItsNeighbours) {
  const cpu::ScopedBf16DotForTest exact_x(cpu::Bf16Dot::kOff);  // the f32 tiles (bf16: below)
  Rng rng(18);
  ForEachTarget([&] {
    const int64_t max_rows = cpu::Fp8FusedMaxRows();
    ASSERT_GE(max_rows, 8);
    for (const Fp8Case& shape : {Fp8Case{0, 45, 300, 128, 128}, Fp8Case{0, 23, 129, 6, 32}}) {
      RandomFp8Weight rw(rng, shape);
      Owned x(DType::kF32, {max_rows, shape.k});
      rng.Fill(x, -2.0f, 2.0f);
      const std::vector<std::vector<float>> alone = RowsAlone(cpu_, x, max_rows, rw, shape.n);
      for (int64_t m : {int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{8}, max_rows}) {
        Owned all(DType::kF32, {m, shape.n});
        cpu_.MatMul(x.t.Narrow(0, 0, m), rw.w, rw.bias.t, all.t);
        const std::vector<float> got = all.ToVector();
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t j = 0; j < shape.n; ++j) {
            ASSERT_EQ(got[r * shape.n + j], alone[r][j])
                << Name(shape) << " M=" << m << " row " << r << " col " << j;
          }
        }
      }
    }
  });
}

// The e4m3 value of a code, from its definition (sign, 4 exponent bits biased by 7, 3 mantissa
// bits; exponent 0 subnormal).
double E4m3Value(uint8_t code) {
  const int e = (code >> 3) & 15, mant = code & 7;
  const double mag = e == 0 ? std::ldexp(mant, -9) : std::ldexp(1.0 + mant / 8.0, e - 7);
  return (code & 0x80) != 0 ? -mag : mag;
}

// f rounded to bf16 as vcvtneps2bf16 rounds it: nearest even, f32 subnormals to signed zero.
float RoundToBf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7F800000u) == 0) {
    b &= 0x80000000u;
  } else {
    b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  }
  float r;
  std::memcpy(&r, &b, 4);
  return r;
}

// What the bf16-dot FP8 kernel computes, in double: sum over columns of bf16(x * scale) * value
// (+ bias); `exact` the same with x * scale unrounded; `mag` the sum of |x * scale * value| and
// |bias|.
struct Fp8Expected {
  std::vector<double> rounded, exact, mag;
};
Fp8Expected ExpectedFp8(const Fp8Case& c, RandomFp8Weight& rw, const float* x,
                        int64_t x_stride, bool with_bias) {
  Fp8Expected e;
  const auto* q = static_cast<const uint8_t*>(rw.q.t.data);
  const auto* s = reinterpret_cast<const float*>(rw.scales.bytes.data());
  const int64_t sc = rw.scales.t.shape[1];
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t j = 0; j < c.n; ++j) {
      double rounded = with_bias ? rw.bias.f32()[j] : 0.0, exact = rounded;
      double mag = std::fabs(rounded);
      for (int64_t col = 0; col < c.k; ++col) {
        const float xs = x[r * x_stride + col] * s[(j / c.block_rows) * sc + col / c.block_cols];
        const double v = E4m3Value(q[j * c.k + col]);
        rounded += static_cast<double>(RoundToBf16(xs)) * v;
        exact += static_cast<double>(xs) * v;
        mag += std::fabs(static_cast<double>(xs) * v);
      }
      e.rounded.push_back(rounded);
      e.exact.push_back(exact);
      e.mag.push_back(mag);
    }
  }
  return e;
}

// With AVX512-BF16 under the default mode, every FP8 MatMul takes x * scale rounded to bf16 and
// the codes decoded to bf16 exactly (gemm_bf16.h), tiles up to kFp8DotTileMaxRows rows and packed
// panels beyond: each output within 2e-6 of sum |terms| of the double sum of the same rounded
// products (f32 sums), and within 2^-8 of sum |terms| (plus the same 2e-6) of the product with
// exact x. Below the AVX-512 targets, or with DH_BF16_DOT=off, x stays exact.
TEST_F(QuantMatMulTest, Fp8Bf16DotMatchesRoundedProducts) {
  if (!cpu::Bf16DotAvailable()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  Rng rng(19);
  const Fp8Case cases[] = {
      {1, 37, 70, 16, 32},    {3, 200, 300, 128, 128}, {1, 1, 1, 1, 1},
      {4, 17, 33, 8, 16},     {8, 70, 300, 128, 128},  {9, 50, 200, 6, 64},
      {16, 23, 257, 128, 128}, {40, 9, 2100, 128, 128}, {48, 45, 129, 128, 128},
      {49, 45, 129, 128, 128},  // panels from kFp8DotTileMaxRows + 1 rows
      {64, 9, 2100, 128, 128},  // two K blocks
      {57, 300, 301, 128, 80},  // odd K, blocks of rows cut into 128-row packed blocks
      {50, 50, 96, 6, 32},      // blocks of 6 weight rows: a packed block per row block
      {52, 260, 64, 200, 64},   // blocks of 200 rows: packed blocks of 96 inside them
  };
  static_assert(cpu::kFp8DotTileMaxRows == 48, "the cases above straddle the tiles' limit");
  ForEachTarget([&] {
    const bool rounds = cpu::Bf16DotRoundsX();
    EXPECT_EQ(rounds, std::string(cpu::DispatchedTargetName()).rfind("AVX3", 0) == 0);
    for (const Fp8Case& c : cases) {
      RandomFp8Weight rw(rng, c);
      Owned x(DType::kF32, {c.m, c.k}), got(DType::kF32, {c.m, c.n});
      rng.Fill(x, -2.0f, 2.0f);
      cpu_.MatMul(x.t, rw.w, rw.bias.t, got.t);
      const Fp8Expected e = ExpectedFp8(c, rw, x.f32(), c.k, true);
      const std::vector<double>& want = rounds ? e.rounded : e.exact;
      int bad = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const double g = got.f32()[i], slack = 2e-6 * e.mag[i] + 1e-30;
        const bool ok = std::fabs(g - want[i]) <= slack &&
                        std::fabs(g - e.exact[i]) <= std::ldexp(e.mag[i], -8) + slack;
        if (!ok && ++bad <= 5) {
          ADD_FAILURE() << Name(c) << " element " << i << " got " << g << " want " << want[i]
                        << " exact " << e.exact[i] << " sum|terms| " << e.mag[i];
        }
      }
      EXPECT_EQ(bad, 0) << Name(c);
      if (rounds) {
        // One flag away: x exact again.
        const cpu::ScopedBf16DotForTest off(cpu::Bf16Dot::kOff);
        Owned exact(DType::kF32, {c.m, c.n});
        cpu_.MatMul(x.t, rw.w, rw.bias.t, exact.t);
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_NEAR(exact.f32()[i], e.exact[i], 2e-6 * e.mag[i] + 1e-30) << Name(c) << " off";
        }
      }
      // A weight marked exact_x keeps x exact in every mode.
      Weight w = rw.w;
      w.exact_x = true;
      Owned keep(DType::kF32, {c.m, c.n});
      cpu_.MatMul(x.t, w, rw.bias.t, keep.t);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(keep.f32()[i], e.exact[i], 2e-6 * e.mag[i] + 1e-30) << Name(c) << " exact_x";
      }
    }
  });
}

// Through CpuBackend::MatMul on the bf16 dot: each row of up to kFp8DotTileMaxRows rows of x gives
// the same bits as that row alone (one chain per output in the tiles, whatever the tiles and
// thread ranges around it); more rows (the packed panels, sums in another order) within 1e-5 of
// the output's scale.
TEST_F(QuantMatMulTest, Fp8Bf16DotRowDoesNotDependOnItsNeighbours) {
  if (!cpu::Bf16DotAvailable()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  if (!cpu::DispatchesAvx512()) GTEST_SKIP() << "the AVX-512 targets are off (DH_CPU_TIER)";
  Rng rng(20);
  const int64_t max_rows = cpu::kFp8DotTileMaxRows;
  for (const Fp8Case& shape : {Fp8Case{0, 45, 300, 128, 128}, Fp8Case{0, 23, 129, 6, 32}}) {
    RandomFp8Weight rw(rng, shape);
    const int64_t rows = max_rows + 8;  // the panels' case
    Owned x(DType::kF32, {rows, shape.k});
    rng.Fill(x, -2.0f, 2.0f);
    const std::vector<std::vector<float>> alone = RowsAlone(cpu_, x, rows, rw, shape.n);
    for (int64_t m : {int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{8}, int64_t{9},
                      int64_t{17}, max_rows, rows}) {
      Owned all(DType::kF32, {m, shape.n});
      cpu_.MatMul(x.t.Narrow(0, 0, m), rw.w, rw.bias.t, all.t);
      const std::vector<float> got = all.ToVector();
      std::vector<float> want;
      for (int64_t r = 0; r < m; ++r) want.insert(want.end(), alone[r].begin(), alone[r].end());
      if (m > max_rows) {
        ExpectClose(got, want, 1e-5f, Name(shape) + " panels M=" + std::to_string(m));
        continue;
      }
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << Name(shape) << " M=" << m << " element " << i;
      }
    }
  }
}

// Fp8DequantizeRows equals the reference decoding bit for bit (the 2^8 moved into the scale is
// exact), including every code (normals, subnormals, +-0) with scale 1.
TEST_F(QuantMatMulTest, Fp8DequantizeRowsExact) {
  Rng rng(17);
  ForEachTarget([&] {
    for (const Fp8Case& c : kFp8Cases) {
      RandomFp8Weight rw(rng, c);
      const int64_t begin = c.n / 3, count = c.n - c.n / 3;
      std::vector<float> got(count * c.k), want(count * c.k);
      cpu::Fp8DequantizeRows(rw.Args(c), begin, count, got.data());
      for (int64_t i = 0; i < count; ++i) ref::DecodeWeightRow(rw.w, begin + i, &want[i * c.k]);
      ExpectClose(got, want, 0.0f, "fp8 dequantize " + Name(c));
      // Column slices from a block's first column.
      const int64_t bc = c.block_cols, col = bc * ((c.k - 1) / bc / 2 + 1);
      if (col < c.k) {
        const int64_t width = c.k - col;
        std::vector<float> slice(count * width), want_slice;
        cpu::Fp8DequantizeRows(rw.Args(c), begin, count, slice.data(), col, width);
        for (int64_t i = 0; i < count; ++i) {
          want_slice.insert(want_slice.end(), want.begin() + i * c.k + col,
                            want.begin() + i * c.k + c.k);
        }
        ExpectClose(slice, want_slice, 0.0f, fmt::format("fp8 {} columns from {}", Name(c), col));
      }
    }
    std::vector<uint8_t> codes;
    for (int v = 0; v < 256; ++v) {
      if ((v & 0x7f) != 0x7f) codes.push_back(static_cast<uint8_t>(v));
    }
    const float one = 1.0f;
    cpu::Fp8MatMulArgs a;
    a.q = codes.data();
    a.q_stride = static_cast<int64_t>(codes.size());
    a.scales = &one;
    a.scale_stride = 1;
    a.block_rows = 1;
    a.block_cols = static_cast<int64_t>(codes.size());
    a.k = static_cast<int64_t>(codes.size());
    std::vector<float> got(codes.size()), want(codes.size());
    cpu::Fp8DequantizeRows(a, 0, 1, got.data());
    for (size_t i = 0; i < codes.size(); ++i) {
      want[i] = F8E4M3ToF32(codes[i]);
      EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << "code " << int{codes[i]};
    }
    ExpectClose(got, want, 0.0f, "fp8 every code");
  });
}

// Layouts the integer kernel takes: lanes inside one group, groups aligned with 64-byte chunks.
TEST(IntegerDotSupportsTest, Layouts) {
  EXPECT_TRUE(cpu::IntegerDotSupports(false, 1536, 32));
  EXPECT_TRUE(cpu::IntegerDotSupports(false, 1536, 1536));
  EXPECT_TRUE(cpu::IntegerDotSupports(false, 1536, 128));
  EXPECT_TRUE(cpu::IntegerDotSupports(true, 1536, 32));
  EXPECT_TRUE(cpu::IntegerDotSupports(true, 1536, 128));
  EXPECT_TRUE(cpu::IntegerDotSupports(true, 45, 45));
  EXPECT_FALSE(cpu::IntegerDotSupports(false, 100, 48));  // 48 neither divides nor spans 64
  EXPECT_FALSE(cpu::IntegerDotSupports(true, 100, 4));    // 8-column lanes straddle groups
  EXPECT_FALSE(cpu::IntegerDotSupports(true, 45, 9));
}

// The auto policy (docs/kernels.md "When the integer path runs"): int8 from PackedMinRows()
// rows leaves the AVX2 kernel for the f32 GEMM only on CPUs with 128-bit vector units; int4,
// fewer rows and the VNNI kernels stay integer; per-row int8 at M = 1 takes f32 products.
TEST(IntegerDotPolicyTest, AutoChoice) {
  using P = cpu::IntegerDotPath;
  cpu::QuantMatMulArgs a;
  a.k = 1536;
  a.group_size = 32;
  const int64_t from = cpu::PackedMinRows();
  a.m = from;
  EXPECT_FALSE(cpu::AutoPrefersIntegerDot(a, P::kAvx2, true));
  EXPECT_TRUE(cpu::AutoPrefersIntegerDot(a, P::kAvx2, false));
  EXPECT_TRUE(cpu::AutoPrefersIntegerDot(a, P::kAvxVnni, true));
  EXPECT_TRUE(cpu::AutoPrefersIntegerDot(a, P::kVnni512, true));
  a.m = 512;
  EXPECT_FALSE(cpu::AutoPrefersIntegerDot(a, P::kAvx2, true));
  a.m = from - 1;
  EXPECT_TRUE(cpu::AutoPrefersIntegerDot(a, P::kAvx2, true));
  a.m = 1;
  EXPECT_TRUE(cpu::AutoPrefersIntegerDot(a, P::kAvx2, true));
  a.int4 = true;
  for (const int64_t m : {int64_t{1}, from - 1, from, int64_t{512}}) {
    a.m = m;
    EXPECT_TRUE(cpu::AutoPrefersIntegerDot(a, P::kAvx2, true)) << m;
  }
  a.int4 = false;
  a.group_size = a.k;
  a.m = 1;
  EXPECT_FALSE(cpu::AutoPrefersIntegerDot(a, P::kAvx2, false));
  a.m = 2;
  EXPECT_TRUE(cpu::AutoPrefersIntegerDot(a, P::kAvx2, false));
}

// DequantizeRows (the f32 rows the tiled GEMM consumes) equals the reference decoding exactly.
TEST_F(QuantMatMulTest, DequantizeRowsMatchesReference) {
  Rng rng(13);
  ForEachTarget([&] {
    for (const Case& c : kCases) {
      RandomWeight rw(rng, c);
      cpu::QuantMatMulArgs a;
      rw.SetArgs(a);
      a.k = c.k;
      const int64_t begin = c.n / 3, count = c.n - c.n / 3;
      std::vector<float> got(count * c.k), want(count * c.k);
      cpu::DequantizeRows(a, begin, count, got.data());
      for (int64_t i = 0; i < count; ++i) ref::DecodeWeightRow(rw.w, begin + i, &want[i * c.k]);
      ExpectClose(got, want, 1e-6f, "dequantize " + Name(c));
      // Column slices from the start of a group (the whole row's group when there is one): the
      // same values as the whole rows' columns.
      const int64_t g = std::min(c.group, c.k);
      for (int64_t col : {g * ((c.k / g) / 2), g * (c.k / g - 1), int64_t{256}}) {
        if (col <= 0 || col >= c.k || !cpu::DequantizeSliceAligned(a, col)) continue;
        for (int64_t width : {c.k - col, std::min<int64_t>(g, c.k - col)}) {
          std::vector<float> slice(count * width), want_slice;
          cpu::DequantizeRows(a, begin, count, slice.data(), col, width);
          for (int64_t i = 0; i < count; ++i) {
            want_slice.insert(want_slice.end(), want.begin() + i * c.k + col,
                              want.begin() + i * c.k + col + width);
          }
          ExpectClose(slice, want_slice, 1e-6f,
                      fmt::format("dequantize {} columns [{}, +{})", Name(c), col, width));
        }
      }
    }
  });
}

TEST(QuantMatMulSupportsTest, Layouts) {
  EXPECT_TRUE(cpu::QuantMatMulSupports(false, 45, 7));
  EXPECT_TRUE(cpu::QuantMatMulSupports(true, 45, 32));
  EXPECT_TRUE(cpu::QuantMatMulSupports(true, 45, 45));
  EXPECT_FALSE(cpu::QuantMatMulSupports(true, 45, 9));
  EXPECT_FALSE(cpu::QuantMatMulSupports(false, 45, 0));
}

}  // namespace
}  // namespace dh
