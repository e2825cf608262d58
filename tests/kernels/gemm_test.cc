// The tiled GEMM (backend/cpu/gemm.h) against ReferenceBackend::MatMul on every SIMD target
// compiled in that the CPU supports: odd shapes (M, N, K not multiples of the micro-tile, K = 1,
// K split into several blocks), M = 1..17 and larger, with and without bias, strided x and out,
// f32 / bf16 / f16 weights, and weights supplied by a row callback (the dequantizing hook).
//
// Tolerance: |got - want| <= 1e-5 * max(1, max|want|) (ExpectClose). The GEMM sums in f32 in a
// different order than the reference (double); with |x|, |w| < 1 and K <= 2100 the f32 rounding
// of a dot product stays far below 1e-5 of the output's scale.
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/membw.h"
#include "backend/reference/reference_backend.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kernels/kernel_test_util.h"

namespace dh {
namespace {

using test::ExpectClose;
using test::Owned;
using test::Rng;

constexpr float kTol = 1e-5f;

class GemmTest : public ::testing::Test {
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

  cpu::WType WTypeOf(DType d) {
    return d == DType::kF32 ? cpu::WType::kF32
                            : (d == DType::kBF16 ? cpu::WType::kBF16 : cpu::WType::kF16);
  }

  // cpu::Gemm with x rows x_pad and out rows out_pad elements longer than needed; checks the
  // padding of out is untouched and the rest matches the reference.
  void CheckShape(int64_t m, int64_t n, int64_t k, DType wt, bool with_bias, bool callback,
                  ThreadPool& pool) {
    constexpr int64_t x_pad = 3, out_pad = 5;
    constexpr float kSentinel = 12345.0f;
    Owned x(DType::kF32, {m, k + x_pad}), w(wt, {n, k}), bias(DType::kF32, {n});
    rng_.Fill(x);
    rng_.Fill(w);
    rng_.Fill(bias);
    Tensor xv = x.t;
    xv.shape[1] = k;
    Owned want(DType::kF32, {m, n});
    ref_.MatMul(xv, Weight::Dense(w.t), with_bias ? bias.t : Tensor(), want.t);
    std::vector<float> out(m * (n + out_pad), kSentinel);

    // The weight as f32 rows, for the callback.
    Owned wf(DType::kF32, {n, k});
    ref_.Copy(w.t, wf.t);
    std::vector<int> served(n * k, 0);
    std::mutex mu;
    const cpu::WeightRowsFn rows_fn = [&](int64_t r0, int64_t count, int64_t c0, int64_t cn,
                                          float* dst) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_LE(count, cpu::GemmMaxBlockRows());
      EXPECT_LE(cn, cpu::kGemmKcMax);
      EXPECT_EQ(c0 % cpu::kGemmKcUnit, 0);
      for (int64_t r = 0; r < count; ++r) {
        for (int64_t c = 0; c < cn; ++c) {
          dst[r * cn + c] = wf.f32()[(r0 + r) * k + c0 + c];
          ++served[(r0 + r) * k + c0 + c];
        }
      }
    };
    cpu::GemmArgs a;
    a.x = x.f32();
    a.x_stride = k + x_pad;
    a.m = m;
    a.n = n;
    a.k = k;
    a.w = w.bytes.data();
    a.wtype = WTypeOf(wt);
    a.w_stride = k;
    a.rows_fn = callback ? &rows_fn : nullptr;
    a.bias = with_bias ? bias.f32() : nullptr;
    a.out = out.data();
    a.out_stride = n + out_pad;
    cpu::Gemm(a, pool);

    std::vector<float> got(m * n);
    int pad_changed = 0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) got[r * n + c] = out[r * (n + out_pad) + c];
      for (int64_t c = n; c < n + out_pad; ++c) pad_changed += out[r * (n + out_pad) + c] != kSentinel;
    }
    const std::string what = fmt::format("gemm {} M={} N={} K={} bias={} callback={}",
                                         DTypeName(wt), m, n, k, with_bias, callback);
    EXPECT_EQ(pad_changed, 0) << what;
    ExpectClose(got, want.ToVector(), kTol, what);
    if (callback) {
      int wrong = 0;
      for (int v : served) wrong += v != 1;
      EXPECT_EQ(wrong, 0) << what << ": weight elements not requested exactly once";
    }
  }

  Rng rng_{11};
  ReferenceBackend ref_{BackendOptions{}};
};

TEST_F(GemmTest, SmallMOddShapesAllWeightTypes) {
  ThreadPool pool(2);
  ForEachTarget([&] {
    for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t m = 1; m <= 17; ++m) {
        CheckShape(m, 29, 37, wt, m % 2 == 0, false, pool);
        if (HasFatalFailure()) return;
      }
      CheckShape(5, 7, 1, wt, true, false, pool);   // K = 1
      CheckShape(1, 1, 1, wt, false, false, pool);  // one dot product
    }
  });
}

TEST_F(GemmTest, LargerShapesSeveralKBlocks) {
  struct Shape {
    int64_t m, n, k;
  };
  // K > kGemmKcMax (split into blocks, the last one ragged), m > 8 (several row tiles), n over
  // several row blocks with ragged ends.
  const Shape shapes[] = {{9, 50, 1030}, {20, 97, 2100}, {33, 13, 700}, {48, 200, 64},
                          {8, 301, 1500}, {64, 6, 16}};
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    ForEachTarget([&] {
      for (const Shape& s : shapes) {
        CheckShape(s.m, s.n, s.k, DType::kBF16, true, false, pool);
        CheckShape(s.m, s.n, s.k, DType::kF32, false, false, pool);
      }
    });
  }
}

TEST_F(GemmTest, WeightRowsFromCallback) {
  ThreadPool pool(2);
  ForEachTarget([&] {
    CheckShape(4, 29, 37, DType::kBF16, true, true, pool);
    CheckShape(17, 100, 1300, DType::kF32, false, true, pool);
    CheckShape(40, 7, 2500, DType::kF16, true, true, pool);
  });
}

// CpuBackend::MatMul sends dense weights with m > kGemvMaxRows here; same answers as the
// reference on each side of the switch.
TEST_F(GemmTest, BackendMatMulAroundTheGemvCrossover) {
  CpuBackend cpu(BackendOptions{.num_threads = 2});
  ForEachTarget([&] {
    for (int64_t m = 1; m <= cpu::kGemvMaxRows + 3; ++m) {
      Owned x(DType::kF32, {m, 300}), w(DType::kBF16, {70, 300}), bias(DType::kF32, {70});
      rng_.Fill(x);
      rng_.Fill(w);
      rng_.Fill(bias);
      Owned got(DType::kF32, {m, 70}), want(DType::kF32, {m, 70});
      cpu.MatMul(x.t, Weight::Dense(w.t), bias.t, got.t);
      ref_.MatMul(x.t, Weight::Dense(w.t), bias.t, want.t);
      ExpectClose(got.ToVector(), want.ToVector(), kTol, fmt::format("backend matmul M={}", m));
    }
  });
}

TEST_F(GemmTest, FmaPeakProbeIsPositive) {
  ThreadPool pool(2);
  ForEachTarget([&] {
    EXPECT_GT(cpu::FmaProbeFlops(10), 0);
    EXPECT_GT(MeasureFmaPeakGflops(pool), 0.0);
  });
}

}  // namespace
}  // namespace dh
