// MatMul with an input permutation (Weight::perm, GPTQ act-order): out = x[:, perm] · Wᵀ.
//  - Reference backend: equals the product of the explicitly gathered x with the weight without
//    its permutation (bit for bit), and the product of x with the un-permuted dense weight
//    (W_orig[:, perm[c]] = W[:, c]) within f32 rounding.
//  - CPU backend, on every SIMD target compiled in that the CPU supports: equals the reference
//    for int4 (group 128 and 32), int8 and dense f32 weights, M = 1 (GEMV) and M > 1 (GEMM), with
//    and without bias, with strided x rows.
// Tolerance: |got - want| <= 2e-5 * max(1, max|want|) (f32 accumulation order differs).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant_vnni.h"
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

struct PermCase {
  WeightFormat format;
  int64_t m, n, k, group;
};

const PermCase kPermCases[] = {
    {WeightFormat::kInt4, 1, 24, 256, 128}, {WeightFormat::kInt4, 5, 17, 256, 128},
    {WeightFormat::kInt4, 3, 9, 96, 32},    {WeightFormat::kInt4, 1, 8, 128, 128},
    {WeightFormat::kInt8, 2, 13, 64, 32},   {WeightFormat::kDense, 1, 11, 40, 0},
    {WeightFormat::kDense, 6, 7, 128, 0},
};

std::string Name(const PermCase& c) {
  return fmt::format("{} M={} N={} K={} group={}", WeightFormatName(c.format), c.m, c.n, c.k,
                     c.group);
}

// A random weight of c's format with a random permutation of its k input columns.
struct PermWeight {
  Owned q, scales, zeros, perm;
  Weight w;
  PermWeight(Rng& rng, const PermCase& c)
      : q(c.format == WeightFormat::kInt4   ? DType::kU8
          : c.format == WeightFormat::kInt8 ? DType::kI8
                                            : DType::kF32,
          {c.n, c.format == WeightFormat::kInt4 ? c.k / 2 : c.k}),
        scales(DType::kF16, {c.n, c.group > 0 ? c.k / c.group : 1}),
        zeros(DType::kU8, {c.n, c.group > 0 ? (c.k / c.group + 1) / 2 : 1}),
        perm(DType::kI32, {c.k}) {
    rng.Fill(q);
    rng.Fill(scales, 0.001f, 0.05f);
    rng.Fill(zeros);
    std::iota(perm.i32(), perm.i32() + c.k, 0);
    for (int64_t i = c.k - 1; i > 0; --i) std::swap(perm.i32()[i], perm.i32()[rng.Int(0, i)]);
    w.format = c.format;
    w.rows = c.n;
    w.cols = c.k;
    w.data = q.t;
    if (c.format != WeightFormat::kDense) {
      w.group_size = static_cast<int>(c.group);
      w.scales = scales.t;
      if (c.format == WeightFormat::kInt4) w.zeros = zeros.t;
    }
    w.perm = perm.t;
  }
};

class PermutedMatMulTest : public ::testing::Test {
 protected:
  ReferenceBackend ref_{BackendOptions{}};
  CpuBackend cpu_{BackendOptions{.num_threads = 2}};
};

TEST_F(PermutedMatMulTest, ReferenceGathersInput) {
  Rng rng(21);
  for (const PermCase& c : kPermCases) {
    SCOPED_TRACE(Name(c));
    PermWeight pw(rng, c);
    Owned x(DType::kF32, {c.m, c.k}), gathered(DType::kF32, {c.m, c.k}),
        got(DType::kF32, {c.m, c.n}), want(DType::kF32, {c.m, c.n}),
        dense(DType::kF32, {c.n, c.k}), want_dense(DType::kF32, {c.m, c.n});
    rng.Fill(x, -2.0f, 2.0f);
    for (int64_t r = 0; r < c.m; ++r) {
      for (int64_t i = 0; i < c.k; ++i) {
        gathered.f32()[r * c.k + i] = x.f32()[r * c.k + pw.perm.i32()[i]];
      }
    }
    ref_.MatMul(x.t, pw.w, Tensor(), got.t);
    Weight plain = pw.w;
    plain.perm = Tensor();
    ref_.MatMul(gathered.t, plain, Tensor(), want.t);
    EXPECT_EQ(got.ToVector(), want.ToVector());
    // The un-permuted dense weight: column perm[i] of the original is column i of this one.
    std::vector<float> row(c.k);
    for (int64_t j = 0; j < c.n; ++j) {
      ref::DecodeWeightRow(plain, j, row.data());
      for (int64_t i = 0; i < c.k; ++i) dense.f32()[j * c.k + pw.perm.i32()[i]] = row[i];
    }
    ref_.MatMul(x.t, Weight::Dense(dense.t), Tensor(), want_dense.t);
    ExpectClose(got.ToVector(), want_dense.ToVector(), 2e-5f, "vs un-permuted dense");
  }
}

TEST_F(PermutedMatMulTest, CpuMatchesReference) {
  Rng rng(22);
  // f32 products (2e-5): the integer-dot kernel quantizes x and has its own bound test
  // (quant_matmul_test.cc).
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kOff);
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const PermCase& c : kPermCases) {
      SCOPED_TRACE(Name(c));
      PermWeight pw(rng, c);
      // x rows padded (stride k + 3) to cover a strided gather source.
      Owned xs(DType::kF32, {c.m, c.k + 3}), bias(DType::kF32, {c.n}),
          got(DType::kF32, {c.m, c.n}), want(DType::kF32, {c.m, c.n});
      rng.Fill(xs, -2.0f, 2.0f);
      rng.Fill(bias);
      const Tensor x = xs.t.Narrow(1, 0, c.k);
      for (bool with_bias : {false, true}) {
        const Tensor b = with_bias ? bias.t : Tensor();
        cpu_.MatMul(x, pw.w, b, got.t);
        ref_.MatMul(x, pw.w, b, want.t);
        ExpectClose(got.ToVector(), want.ToVector(), 2e-5f, with_bias ? "bias" : "no bias");
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kAuto);
}

TEST(PermutedWeightTest, NbytesCountsPerm) {
  Owned q(DType::kU8, {4, 64}), s(DType::kF16, {4, 4}), z(DType::kU8, {4, 2}),
      perm(DType::kI32, {128});
  Weight w;
  w.format = WeightFormat::kInt4;
  w.data = q.t;
  w.scales = s.t;
  w.zeros = z.t;
  EXPECT_EQ(w.nbytes(), 256u + 32u + 8u);
  w.perm = perm.t;
  EXPECT_EQ(w.nbytes(), 256u + 32u + 8u + 512u);
}

}  // namespace
}  // namespace dh
