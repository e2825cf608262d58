// The tiled GEMM (backend/cpu/gemm.h) against ReferenceBackend::MatMul on every SIMD target
// compiled in that the CPU supports: odd shapes (M, N, K not multiples of the micro-tile, K = 1,
// K split into several blocks), M = 1..17 and larger, with and without bias, strided x and out,
// f32 / bf16 / f16 weights, and weights supplied by a row callback (the dequantizing hook).
//
// Tolerance: |got - want| <= 1e-5 * max(1, max|want|) (ExpectClose). The GEMM sums in f32 in a
// different order than the reference (double); with |x|, |w| < 1 and K <= 2100 the f32 rounding
// of a dot product stays far below 1e-5 of the output's scale. Where the AVX512-BF16 kernel
// (gemm_bf16.h) takes a bf16 call (the AVX3 targets on a CPU with the instruction) x is rounded
// to bf16 by the kernel, so the reference gets the same rounded x and the same 1e-5 holds (bf16
// products are exact in f32); Bf16Dot* tests bound the error against the exact f32 x.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_bf16.h"
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

// f32 -> bf16 -> f32 with round to nearest even, as vcvtneps2bf16 does for finite values.
float RoundToBf16(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  float r;
  std::memcpy(&r, &b, 4);
  return r;
}

// The GEMM's arguments for m contiguous f32 rows of x (k columns) against n contiguous bf16
// weight rows, into m contiguous rows of out.
cpu::GemmArgs Bf16GemmArgs(const float* x, int64_t m, int64_t n, int64_t k, const void* w,
                           float* out) {
  cpu::GemmArgs a;
  a.x = x;
  a.x_stride = k;
  a.m = m;
  a.n = n;
  a.k = k;
  a.w = w;
  a.wtype = cpu::WType::kBF16;
  a.w_stride = k;
  a.out = out;
  a.out_stride = n;
  return a;
}

// Random f32 x [m, heads, k] and bf16 weights [heads, n, k], one dense Weight per head (the
// operands of MatMul and BatchedMatMul); x0 is head 0's rows of x, [m, k], rows heads * k apart.
struct Bf16Heads {
  Bf16Heads(Rng& rng, int64_t m, int64_t n, int64_t k, int64_t heads)
      : x(DType::kF32, {m, heads, k}), w(DType::kBF16, {heads, n, k}) {
    rng.Fill(x);
    rng.Fill(w);
    for (int64_t h = 0; h < heads; ++h) ws.push_back(Weight::Dense(w.t.Select(0, h)));
    x0 = x.t.Select(1, 0);
  }
  Owned x, w;
  std::vector<Weight> ws;
  Tensor x0;
};

class GemmTest : public ::testing::Test {
 protected:
  // These tests check the bf16 dot-product GEMM wherever it applies, whatever DH_BF16_DOT says.
  const cpu::ScopedBf16DotForTest bf16_dot_{cpu::Bf16Dot::kAuto};
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
      EXPECT_TRUE(cn <= cpu::kGemmKcMax || (c0 == 0 && cn == k)) << c0 << "+" << cn;
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
    // The reference sees x as the kernel does (rounded to bf16 by the AVX512-BF16 kernel).
    const bool bf16dot = cpu::UseBf16Dot(a);
    Owned xr(DType::kF32, {m, k});
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const float v = x.f32()[r * (k + x_pad) + c];
        xr.f32()[r * k + c] = bf16dot ? RoundToBf16(v) : v;
      }
    }
    Owned want(DType::kF32, {m, n});
    ref_.MatMul(xr.t, Weight::Dense(w.t), with_bias ? bias.t : Tensor(), want.t);
    cpu::Gemm(a, pool);

    std::vector<float> got(m * n);
    int pad_changed = 0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) got[r * n + c] = out[r * (n + out_pad) + c];
      for (int64_t c = n; c < n + out_pad; ++c)
        pad_changed += out[r * (n + out_pad) + c] != kSentinel;
    }
    const std::string what = fmt::format("gemm {} M={} N={} K={} bias={} callback={} bf16dot={}",
                                         DTypeName(wt), m, n, k, with_bias, callback, bf16dot);
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
  // several row blocks with ragged ends; 5-8 rows whose whole rows overflow the L1 x tile (passed
  // over each block in two halves on AVX3, the second half of 1-4 rows).
  // From GemmPackedMinRows rows the 16-register targets pack the weights into panels: ragged
  // panels (n not a multiple of 16 or 8), columns left over from the 8 x 8 / 4 x 4 squares, row
  // tiles of 1-5, more rows than one pass over a block (kPackMc).
  const Shape shapes[] = {{9, 50, 1030},  {20, 97, 2100}, {33, 13, 700},   {48, 200, 64},
                          {8, 301, 1500}, {64, 6, 16},    {17, 145, 4099}, {4, 49, 31},
                          {6, 40, 1536},  {7, 31, 1100},  {5, 23, 2048},   {100, 70, 530},
                          {203, 97, 300}, {65, 101, 1030}};
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    ForEachTarget([&] {
      for (const Shape& s : shapes) {
        CheckShape(s.m, s.n, s.k, DType::kBF16, true, false, pool);
        CheckShape(s.m, s.n, s.k, DType::kF32, false, false, pool);
        // bf16 weights on the f32 GEMM also where the bf16 dot kernel would take them (the
        // default, DH_BF16_DOT=off).
        cpu::SetBf16DotForTest(cpu::Bf16Dot::kOff);
        CheckShape(s.m, s.n, s.k, DType::kBF16, false, false, pool);
        cpu::SetBf16DotForTest(cpu::Bf16Dot::kAuto);
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
    CheckShape(70, 50, 1100, DType::kBF16, true, true, pool);  // packed panels from f32 rows
  });
}

// Which calls take the packed panels: the 16-register targets from GemmPackedMinRows rows (32
// for bf16 / f16 weights, 64 for f32 ones and rows from a callback), never AVX3.
TEST_F(GemmTest, PackedPanelsFromTheirRowCountOnSixteenRegisterTargets) {
  ForEachTarget([&] {
    const bool avx3 = cpu::DispatchesAvx512();  // the dispatcher, not hwy::SupportedTargets()
    EXPECT_EQ(cpu::GemmUsesPanels(32, cpu::WType::kBF16, false), !avx3);
    EXPECT_EQ(cpu::GemmUsesPanels(512, cpu::WType::kF16, false), !avx3);
    EXPECT_FALSE(cpu::GemmUsesPanels(31, cpu::WType::kBF16, false));
    EXPECT_EQ(cpu::GemmUsesPanels(64, cpu::WType::kF32, false), !avx3);
    EXPECT_FALSE(cpu::GemmUsesPanels(63, cpu::WType::kF32, false));
    EXPECT_EQ(cpu::GemmUsesPanels(64, cpu::WType::kBF16, true), !avx3);
    EXPECT_FALSE(cpu::GemmUsesPanels(63, cpu::WType::kBF16, true));
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
      // Where the bf16 GEMM rounds x, the GEMV of 1-3 rows rounds it too (gemm_bf16.h).
      if (cpu::Bf16DotRoundsX()) {
        for (float& v : std::span<float>(x.f32(), m * 300)) v = RoundToBf16(v);
      }
      ref_.MatMul(x.t, Weight::Dense(w.t), bias.t, want.t);
      ExpectClose(got.ToVector(), want.ToVector(), kTol, fmt::format("backend matmul M={}", m));
    }
  });
}

// A row's result must not depend on the rows beside it (batch size, tensor parallelism): bf16
// weights through CpuBackend::MatMul and BatchedMatMul, 20 rows at once (the bf16 GEMM where it
// applies, else the f32 GEMM) against each row alone and in twos and threes (the GEMV), within
// 1e-5 of the output's scale (f32 sums in another order) on every target; where x is rounded to
// bf16, some outputs must differ from those of the exact x by more than that.
TEST_F(GemmTest, Bf16RowsDoNotDependOnTheRowsBesideThem) {
  CpuBackend cpu(BackendOptions{.num_threads = 2});
  constexpr int64_t m = 20, n = 90, k = 1100, heads = 3;
  const Bf16Heads in(rng_, m, n, k, heads);
  const Tensor& x0 = in.x0;
  const std::vector<Weight>& ws = in.ws;
  ForEachTarget([&] {
    Owned all(DType::kF32, {m, n}), all_b(DType::kF32, {m, heads, n});
    cpu.MatMul(x0, ws[0], Tensor(), all.t);
    cpu.BatchedMatMul(in.x.t, ws, all_b.t);
    float scale = 1.0f;
    for (float v : all.ToVector()) scale = std::max(scale, std::fabs(v));
    int moved = 0;
    for (int64_t rows = 1; rows <= cpu::kGemvMaxRows; ++rows) {
      for (int64_t r0 = 0; r0 + rows <= m; r0 += rows) {
        SCOPED_TRACE(fmt::format("rows [{}, {})", r0, r0 + rows));
        Owned part(DType::kF32, {rows, n}), part_b(DType::kF32, {rows, heads, n});
        cpu.MatMul(x0.Slice0(r0, rows), ws[0], Tensor(), part.t);
        cpu.BatchedMatMul(in.x.t.Slice0(r0, rows), ws, part_b.t);
        const std::vector<float> got = part.ToVector(), got_b = part_b.ToVector();
        const std::vector<float> want = all.ToVector(), want_b = all_b.ToVector();
        for (int64_t i = 0; i < rows * n; ++i) {
          EXPECT_NEAR(got[i], want[r0 * n + i], kTol * scale) << "matmul " << i;
        }
        for (int64_t i = 0; i < rows * heads * n; ++i) {
          EXPECT_NEAR(got_b[i], want_b[r0 * heads * n + i], kTol * scale) << "batched " << i;
        }
        if (rows == 1) {  // against the exact x
          Owned exact(DType::kF32, {1, n});
          ref_.MatMul(x0.Slice0(r0, 1), ws[0], Tensor(), exact.t);
          for (int64_t i = 0; i < n; ++i) moved += std::fabs(got[i] - exact.f32()[i]) > kTol * scale;
        }
      }
    }
    if (cpu::Bf16DotRoundsX()) {
      EXPECT_GT(moved, 0) << "x was not rounded to bf16 in the GEMV";
    } else {
      EXPECT_EQ(moved, 0) << "x was changed with the bf16 GEMM off";
    }
  });
}

// The unpacked dot tiles sum each output over its own row of x only, in the same order for any
// number of rows: a row of a 4-16 row call (batched decode) gives the same bits whatever rows share
// the call and wherever it sits among them (one pass of 8 rows or the second of two).
TEST_F(GemmTest, Bf16DotTileRowsDoNotDependOnTheRowsBesideThem) {
  if (!cpu::Bf16DotAvailable()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  if (!cpu::DispatchesAvx512()) GTEST_SKIP() << "the AVX-512 targets are off (DH_CPU_TIER)";
  ThreadPool pool(2);
  constexpr int64_t m = 16, n = 77, k = 2500;
  Owned x(DType::kF32, {m, k}), w(DType::kBF16, {n, k});
  rng_.Fill(x);
  rng_.Fill(w);
  auto run = [&](int64_t r0, int64_t rows) {
    std::vector<float> out(rows * n);
    const cpu::GemmArgs a = Bf16GemmArgs(x.f32() + r0 * k, rows, n, k, w.bytes.data(), out.data());
    EXPECT_TRUE(cpu::UseBf16Dot(a));
    cpu::Gemm(a, pool);
    return out;
  };
  const std::vector<float> all = run(0, m);
  for (int64_t rows = 4; rows <= m; ++rows) {
    for (const int64_t r0 : {int64_t{0}, m - rows}) {
      SCOPED_TRACE(fmt::format("rows [{}, {})", r0, r0 + rows));
      const std::vector<float> part = run(r0, rows);
      int differ = 0;
      for (int64_t i = 0; i < rows * n; ++i) differ += part[i] != all[r0 * n + i];
      EXPECT_EQ(differ, 0) << "outputs not bit-equal to the 16-row call";
    }
  }
}

// Rows longer than 4096 columns of a bf16 weight take the dot tiles at every row count, the GEMV's
// 1-3 rows included (cpu_matmul.cc, kBf16GemvMaxCols): through CpuBackend::MatMul and
// BatchedMatMul each row gives the same bits alone or with up to 15 others.
TEST_F(GemmTest, LongBf16RowsGiveTheSameBitsAtEveryBatchSize) {
  if (!cpu::Bf16DotAvailable()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  if (!cpu::DispatchesAvx512()) GTEST_SKIP() << "the AVX-512 targets are off (DH_CPU_TIER)";
  CpuBackend cpu(BackendOptions{.num_threads = 2});
  constexpr int64_t m = 16, n = 45, k = 5000, heads = 2;
  const Bf16Heads in(rng_, m, n, k, heads);
  const Tensor& x0 = in.x0;
  const std::vector<Weight>& ws = in.ws;
  Owned all(DType::kF32, {m, n}), all_b(DType::kF32, {m, heads, n});
  cpu.MatMul(x0, ws[0], Tensor(), all.t);
  cpu.BatchedMatMul(in.x.t, ws, all_b.t);
  const std::vector<float> want = all.ToVector(), want_b = all_b.ToVector();
  for (int64_t rows = 1; rows <= m; ++rows) {
    const int64_t r0 = m - rows;
    SCOPED_TRACE(fmt::format("rows [{}, {})", r0, m));
    Owned part(DType::kF32, {rows, n}), part_b(DType::kF32, {rows, heads, n});
    cpu.MatMul(x0.Slice0(r0, rows), ws[0], Tensor(), part.t);
    cpu.BatchedMatMul(in.x.t.Slice0(r0, rows), ws, part_b.t);
    const std::vector<float> got = part.ToVector(), got_b = part_b.ToVector();
    int differ = 0;
    for (int64_t i = 0; i < rows * n; ++i) differ += got[i] != want[r0 * n + i];
    for (int64_t i = 0; i < rows * heads * n; ++i) differ += got_b[i] != want_b[r0 * heads * n + i];
    EXPECT_EQ(differ, 0) << "outputs not bit-equal to the 16-row call";
  }
}

// A bf16 weight marked exact_x (an FP8 tensor-parallel slice, backend/weight.h) is multiplied by
// exact x at every row count: against the reference within 1e-5 of the scale on every target.
TEST_F(GemmTest, Bf16WeightMarkedExactXKeepsXExact) {
  CpuBackend cpu(BackendOptions{.num_threads = 2});
  constexpr int64_t n = 70, k = 700;
  Owned w(DType::kBF16, {n, k});
  rng_.Fill(w);
  Weight weight = Weight::Dense(w.t);
  weight.exact_x = true;
  ForEachTarget([&] {
    for (int64_t m : {1, 3, 8, 40}) {
      Owned x(DType::kF32, {m, k}), got(DType::kF32, {m, n}), want(DType::kF32, {m, n});
      rng_.Fill(x);
      cpu.MatMul(x.t, weight, Tensor(), got.t);
      ref_.MatMul(x.t, Weight::Dense(w.t), Tensor(), want.t);
      ExpectClose(got.ToVector(), want.ToVector(), kTol, fmt::format("exact_x M={}", m));
    }
  });
}

// The AVX512-BF16 kernel against the exact f32 x: each output within its rounding bound
// sum_i |x_i - bf16(x_i)| * |w_i| (<= 2^-8 sum_i |x_i w_i|) plus 1e-5 of the output's scale; and
// with the kernel turned off the same call is exact again.
TEST_F(GemmTest, Bf16DotWithinRoundingBoundOfExactX) {
  if (!cpu::Bf16DotAvailable()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  if (!cpu::DispatchesAvx512()) GTEST_SKIP() << "the AVX-512 targets are off (DH_CPU_TIER)";
  ThreadPool pool(2);
  // The unpacked dot tiles (1-8 rows in one pass, 9-16 in two, whose blocks shrink with k so
  // the second pass finds its block in L2) and the packed GEMM.
  struct Case {
    int64_t m, k;
  };
  for (const Case cs : {Case{1, 1537}, Case{3, 1537}, Case{8, 1537}, Case{11, 1537},
                        Case{16, 1537}, Case{11, 5000}, Case{37, 1537}}) {
    const int64_t m = cs.m, n = 101, k = cs.k;
    SCOPED_TRACE(fmt::format("M={} K={}", m, k));
    Owned x(DType::kF32, {m, k}), w(DType::kBF16, {n, k});
    rng_.Fill(x);
    rng_.Fill(w);
    Owned want(DType::kF32, {m, n}), wf(DType::kF32, {n, k});
    ref_.MatMul(x.t, Weight::Dense(w.t), Tensor(), want.t);
    ref_.Copy(w.t, wf.t);
    std::vector<float> got(m * n);
    const cpu::GemmArgs a = Bf16GemmArgs(x.f32(), m, n, k, w.bytes.data(), got.data());
    ASSERT_TRUE(cpu::UseBf16Dot(a));  // the CPU has it and the AVX-512 targets are on
    cpu::Gemm(a, pool);
    float scale = 1.0f;
    for (float v : want.ToVector()) scale = std::max(scale, std::fabs(v));
    int outside = 0, moved = 0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        double bound = 0;
        for (int64_t i = 0; i < k; ++i) {
          const float xi = x.f32()[r * k + i];
          bound += std::fabs(xi - RoundToBf16(xi)) * std::fabs(wf.f32()[c * k + i]);
        }
        const double err = std::fabs(got[r * n + c] - want.f32()[r * n + c]);
        outside += err > bound + 1e-5 * scale;
        moved += err > 1e-5 * scale;
      }
    }
    EXPECT_EQ(outside, 0) << "outputs outside the bf16 rounding bound";
    EXPECT_GT(moved, 0) << "x was not rounded: is the bf16 kernel running?";
    cpu::SetBf16DotForTest(cpu::Bf16Dot::kOff);
    EXPECT_FALSE(cpu::UseBf16Dot(a));
    cpu::Gemm(a, pool);
    cpu::SetBf16DotForTest(cpu::Bf16Dot::kAuto);
    ExpectClose(got, want.ToVector(), kTol, "DH_BF16_DOT=off");
  }
}

// Narrower Highway targets (an AVX2 machine, DH_CPU_TIER=avx2) keep the f32 GEMM.
TEST_F(GemmTest, Bf16DotOnlyWithAnAvx512Target) {
  cpu::GemmArgs a;
  a.m = 8;
  a.k = 64;
  a.wtype = cpu::WType::kBF16;
  ForEachTarget([&] {
    EXPECT_EQ(cpu::UseBf16Dot(a), cpu::DispatchesAvx512() && cpu::Bf16DotAvailable());
  });
  a.wtype = cpu::WType::kF32;
  EXPECT_FALSE(cpu::UseBf16Dot(a));
}

TEST_F(GemmTest, Bf16PeakProbe) {
  ThreadPool pool(2);
  if (!cpu::Bf16DotAvailable()) {
    EXPECT_EQ(cpu::Bf16DotProbeFlops(10), 0);
    EXPECT_EQ(MeasureBf16PeakGflops(pool), 0.0);
    return;
  }
  EXPECT_EQ(cpu::Bf16DotProbeFlops(10), 10 * 16 * 64);
  EXPECT_GT(MeasureBf16PeakGflops(pool), 0.0);
}

TEST_F(GemmTest, FmaPeakProbeIsPositive) {
  ThreadPool pool(2);
  ForEachTarget([&] {
    EXPECT_GT(cpu::FmaProbeFlops(10), 0);
    EXPECT_GT(MeasureFmaPeakGflops(pool), 0.0);
  });
}

// DH_CPU_TIER=avx2 disables the AVX-512 targets once (hwy::DisableTargets); bf16 matmuls must
// not put them back. They did: the bf16 kernel choice asked hwy::SupportedTargets(), which in
// Highway 1.0 re-detects the CPU and resets the dispatch to its best target, so a bf16 model under
// DH_CPU_TIER=avx2 ran its later ops on AVX-512 (and each call paid a cpuid, a VM exit under KVM).
TEST_F(GemmTest, Bf16MatMulsKeepTheTierTheTargetsWereCutTo) {
#if HWY_ARCH_X86
  if (!cpu::DispatchesAvx512()) GTEST_SKIP() << "no AVX-512 target to cut";
  hwy::DisableTargets(HWY_AVX2 - 1);  // as ApplyCpuTierFromEnv does for DH_CPU_TIER=avx2
  ASSERT_FALSE(cpu::DispatchesAvx512());
  const std::string tier = cpu::DispatchedTargetName();
  CpuBackend cpu(BackendOptions{.num_threads = 2});
  const int64_t n = 40, k = 96;
  Owned w(DType::kBF16, {n, k});
  rng_.Fill(w);
  for (int64_t m : {1, 3, 8, 20}) {
    Owned x(DType::kF32, {m, k}), got(DType::kF32, {m, n}), want(DType::kF32, {m, n});
    rng_.Fill(x);
    cpu.MatMul(x.t, Weight::Dense(w.t), Tensor(), got.t);
    ref_.MatMul(x.t, Weight::Dense(w.t), Tensor(), want.t);
    ExpectClose(got.ToVector(), want.ToVector(), kTol, fmt::format("M={}", m));  // x exact
    EXPECT_EQ(std::string(cpu::DispatchedTargetName()), tier) << "M=" << m;
    EXPECT_FALSE(cpu::DispatchesAvx512()) << "M=" << m;
  }
  hwy::DisableTargets(0);
  EXPECT_TRUE(cpu::DispatchesAvx512());
#else
  GTEST_SKIP() << "x86 only";
#endif
}

// The read probe's best run is its fastest and the median a middle one: best >= median > 0.
TEST_F(GemmTest, ReadBandwidthProbeBestAndMedian) {
  ThreadPool pool(2);
  const ReadBandwidth bw = MeasureReadBandwidth(pool, size_t{16} << 20);
  EXPECT_GT(bw.median_gbs, 0.0);
  EXPECT_GE(bw.best_gbs, bw.median_gbs);
  EXPECT_GT(MeasureReadBandwidthGBs(pool, size_t{16} << 20), 0.0);
}

}  // namespace
}  // namespace dh
