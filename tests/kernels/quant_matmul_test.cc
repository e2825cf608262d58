// Int8 / int4 MatMul kernels (backend/cpu/quant_matmul) against the reference backend's MatMul
// over the same codes, on every SIMD target compiled in that the CPU supports, for odd shapes,
// partial last groups, per-row groups, odd column counts (int4: a half-filled last byte), M = 1
// and M > 1 (each dequantized weight vector used for up to 4 rows of x), with bias and strided
// x / out rows; and the f32 rows DequantizeRows hands to the tiled GEMM.
//
// Tolerance: |got - want| <= 2e-5 * max(1, max|want|) (f32 SIMD accumulation in a different
// order than the reference's sums; the dequantized weights are the same f32 products).
#include "backend/cpu/quant_matmul.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/reference/reference_backend.h"
#include "backend/reference/reference_ops.h"
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

struct RandomWeight {
  Owned q, scales, mins, bias;
  Weight w;
  RandomWeight(Rng& rng, const Case& c)
      : q(c.int4 ? DType::kU8 : DType::kI8, {c.n, c.int4 ? (c.k + 1) / 2 : c.k}),
        scales(DType::kF32, {c.n, (c.k + c.group - 1) / c.group}),
        mins(DType::kF32, {c.n, (c.k + c.group - 1) / c.group}),
        bias(DType::kF32, {c.n}) {
    rng.Fill(q);
    rng.Fill(scales, 0.001f, 0.05f);
    rng.Fill(mins, -0.4f, 0.1f);
    rng.Fill(bias);
    w.format = c.int4 ? WeightFormat::kInt4 : WeightFormat::kInt8;
    w.rows = c.n;
    w.cols = c.k;
    w.group_size = static_cast<int>(c.group);
    w.data = q.t;
    w.scales = scales.t;
    if (c.int4) w.mins = mins.t;
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
        a.int4 = c.int4;
        a.q = rw.q.t.data;
        a.q_stride = rw.q.t.shape[1];
        a.scales = rw.scales.f32();
        a.scale_stride = rw.scales.t.shape[1];
        a.mins = c.int4 ? rw.mins.f32() : nullptr;
        a.min_stride = rw.mins.t.shape[1];
        a.k = c.k;
        a.group_size = c.group;
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
}

// DequantizeRows (the f32 rows the tiled GEMM consumes) equals the reference decoding exactly.
TEST_F(QuantMatMulTest, DequantizeRowsMatchesReference) {
  Rng rng(13);
  ForEachTarget([&] {
    for (const Case& c : kCases) {
      RandomWeight rw(rng, c);
      cpu::QuantMatMulArgs a;
      a.int4 = c.int4;
      a.q = rw.q.t.data;
      a.q_stride = rw.q.t.shape[1];
      a.scales = rw.scales.f32();
      a.scale_stride = rw.scales.t.shape[1];
      a.mins = rw.mins.f32();
      a.min_stride = rw.mins.t.shape[1];
      a.k = c.k;
      a.group_size = c.group;
      const int64_t begin = c.n / 3, count = c.n - c.n / 3;
      std::vector<float> got(count * c.k), want(count * c.k);
      cpu::DequantizeRows(a, begin, count, got.data());
      for (int64_t i = 0; i < count; ++i) ref::DecodeWeightRow(rw.w, begin + i, &want[i * c.k]);
      ExpectClose(got, want, 1e-6f, "dequantize " + Name(c));
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
