// BatchedMatMul (one weight per head, MLA's absorbed W_uk^T / W_uv) and the broadcast view
// (Tensor::Broadcast read by Copy): CpuBackend against ReferenceBackend on every SIMD target
// compiled into this binary that the CPU supports, with strided inputs and outputs shaped as
// deepseek.cc passes them.
//
// Tolerance: |cpu - ref| <= 2e-5 * max(1, max|ref|), as for MatMul (f32 SIMD sums vs the
// reference's double sums). The reference itself must equal its own per-head MatMul exactly.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/reference/reference_backend.h"
#include "base/log.h"
#include "hwy/targets.h"
#include "kernels/kernel_test_util.h"

namespace dh {
namespace {

using test::ExpectClose;
using test::Owned;
using test::Rng;

class BatchedMatMulTest : public ::testing::Test {
 protected:
  template <typename Body>
  void ForEachTarget(Body body) {
    const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
    ASSERT_FALSE(targets.empty());
    for (int64_t target : targets) {
      hwy::SetSupportedTargetsForTest(target);
      SCOPED_TRACE(hwy::TargetName(target));
      ASSERT_STREQ(cpu::DispatchedTargetName(), hwy::TargetName(target));
      body();
      if (HasFatalFailure()) break;
    }
    hwy::SetSupportedTargetsForTest(0);
  }

  ReferenceBackend ref_{BackendOptions{}};
  CpuBackend cpu_{BackendOptions{.num_threads = 2}};
};

// Per-head weights [n, k] of `dtype`, random.
struct HeadWeights {
  std::vector<std::unique_ptr<Owned>> storage;
  std::vector<Weight> w;
  HeadWeights(Rng& rng, DType dtype, int64_t heads, int64_t n, int64_t k) {
    for (int64_t h = 0; h < heads; ++h) {
      storage.push_back(std::make_unique<Owned>(dtype, std::initializer_list<int64_t>{n, k}));
      rng.Fill(*storage.back());
      w.push_back(Weight::Dense(storage.back()->t));
    }
  }
};

TEST_F(BatchedMatMulTest, CpuMatchesReferenceOnStridedViews) {
  struct Shape {
    int64_t t, heads, n, k;
  };
  // T <= 3 takes the fused GEMV path, larger T the heads' tiled GEMMs at once (GemmBatched)
  // where x is taken as it is, else one MatMul per head.
  const Shape shapes[] = {{1, 1, 1, 1},  {1, 3, 7, 5},   {1, 16, 33, 24}, {2, 4, 17, 129},
                          {3, 5, 40, 64}, {4, 2, 9, 31}, {7, 3, 24, 48},  {17, 2, 23, 65}};
  Rng rng(11);
  // Exact kernels (2e-5); the AVX512-BF16 GEMM rounds x to bf16 (its bound: gemm_test.cc).
  const cpu::ScopedBf16DotForTest exact_x(cpu::Bf16Dot::kOff);
  ForEachTarget([&] {
    for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (const Shape& s : shapes) {
        const std::string what = fmt::format("{} T={} H={} N={} K={}", DTypeName(wt), s.t,
                                             s.heads, s.n, s.k);
        HeadWeights w(rng, wt, s.heads, s.n, s.k);
        // x is the first k of k + 5 per head (like q3.Narrow(2, 0, nope)); out the first n of
        // n + 3 (like q_full.Narrow(2, 0, kv_lora)); the padding must stay untouched.
        Owned xs(DType::kF32, {s.t, s.heads, s.k + 5});
        rng.Fill(xs);
        const Tensor x = xs.t.Narrow(2, 0, s.k);
        Owned got(DType::kF32, {s.t, s.heads, s.n + 3}), want(DType::kF32, {s.t, s.heads, s.n + 3});
        for (Owned* o : {&got, &want}) {
          for (int64_t i = 0; i < o->t.numel(); ++i) o->f32()[i] = -7.0f;
        }
        cpu_.BatchedMatMul(x, w.w, got.t.Narrow(2, 0, s.n));
        ref_.BatchedMatMul(x, w.w, want.t.Narrow(2, 0, s.n));
        ExpectClose(got.ToVector(), want.ToVector(), 2e-5f, what);
        for (int64_t r = 0; r < s.t * s.heads; ++r) {
          for (int64_t c = s.n; c < s.n + 3; ++c) {
            ASSERT_EQ(got.f32()[r * (s.n + 3) + c], -7.0f) << what << " wrote padding";
          }
        }
      }
    }
  });
}

// CpuBackend::MatMuls over dense weights (q, k and v shaped, with biases) runs MatMul one by one
// (only the integer dot products share x): each weight's MatMul bits, on every SIMD target, on
// the GEMV's rows, the dot tiles' long bf16 rows and the GEMM's 5 rows.
TEST_F(BatchedMatMulTest, MatMulsOfDenseWeightsGiveEachWeightsMatMulBits) {
  Rng rng(14);
  ForEachTarget([&] {
    for (DType wt : {DType::kF32, DType::kBF16}) {
      for (int64_t k : {96, 5000}) {
        HeadWeights w(rng, wt, 3, 70, k);
        w.w[1].rows = w.w[2].rows = 20;  // the first 20 rows: k and v beside a larger q
        w.w[1].data = w.w[1].data.Narrow(0, 0, 20);
        w.w[2].data = w.w[2].data.Narrow(0, 0, 20);
        Owned bias0(DType::kF32, {70}), bias1(DType::kF32, {20});
        rng.Fill(bias0);
        rng.Fill(bias1);
        const Tensor biases[] = {bias0.t, bias1.t, Tensor()};
        for (int64_t m : {1, 2, 3, 5}) {
          const std::string what = fmt::format("{} M={} K={}", DTypeName(wt), m, k);
          Owned x(DType::kF32, {m, k});
          rng.Fill(x);
          std::vector<std::unique_ptr<Owned>> got, want;
          std::vector<MatMulTarget> targets;
          for (int i = 0; i < 3; ++i) {
            const int64_t n = w.w[i].rows;
            got.push_back(std::make_unique<Owned>(DType::kF32, std::initializer_list<int64_t>{m, n}));
            want.push_back(std::make_unique<Owned>(DType::kF32, std::initializer_list<int64_t>{m, n}));
            cpu_.MatMul(x.t, w.w[i], biases[i], want.back()->t);
            targets.push_back({&w.w[i], biases[i], got.back()->t});
          }
          const uint64_t before = cpu_.shared_x_products();
          cpu_.MatMuls(x.t, targets);
          EXPECT_EQ(cpu_.shared_x_products() - before, 0u) << what;
          for (int i = 0; i < 3; ++i) {
            EXPECT_EQ(std::memcmp(got[i]->bytes.data(), want[i]->bytes.data(),
                                  got[i]->bytes.size()), 0) << what << " weight " << i;
          }
        }
      }
    }
  });
}

TEST_F(BatchedMatMulTest, ReferenceIsItsMatMulPerHead) {
  Rng rng(12);
  const int64_t T = 3, H = 4, N = 6, K = 10;
  HeadWeights w(rng, DType::kBF16, H, N, K);
  Owned x(DType::kF32, {T, H, K}), out(DType::kF32, {T, H, N});
  rng.Fill(x);
  ref_.BatchedMatMul(x.t, w.w, out.t);
  for (int64_t h = 0; h < H; ++h) {
    Owned xh(DType::kF32, {T, K}), oh(DType::kF32, {T, N});
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < K; ++i) xh.f32()[t * K + i] = x.f32()[(t * H + h) * K + i];
    }
    ref_.MatMul(xh.t, w.w[h], Tensor(), oh.t);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < N; ++j) {
        EXPECT_EQ(out.f32()[(t * H + h) * N + j], oh.f32()[t * N + j]) << h << " " << t << " " << j;
      }
    }
  }
}

TEST_F(BatchedMatMulTest, BroadcastViewCopiesOneRowToEveryHead) {
  Rng rng(13);
  const int64_t N = 5, H = 3, D = 4, W = 9;
  // Rows of width W; the last D columns are the shared part (MLA's rotary key).
  Owned rows(DType::kF32, {N, W});
  rng.Fill(rows);
  const Tensor shared = rows.t.Narrow(1, W - D, D).Broadcast(1, H);  // [N, H, D]
  ASSERT_EQ(shared.ndim, 3);
  EXPECT_EQ(shared.stride[1], 0);
  EXPECT_EQ(shared.stride[0], W);
  ForEachTarget([&] {
    Owned got(DType::kF32, {N, H, D + 2}), want(DType::kF32, {N, H, D + 2});
    cpu_.Copy(shared, got.t.Narrow(2, 2, D));
    ref_.Copy(shared, want.t.Narrow(2, 2, D));
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const float src = rows.f32()[n * W + (W - D) + d];
          EXPECT_EQ(got.f32()[(n * H + h) * (D + 2) + 2 + d], src);
          EXPECT_EQ(want.f32()[(n * H + h) * (D + 2) + 2 + d], src);
        }
      }
    }
  });
}

TEST(TensorViewTest, SelectDropsTheDimension) {
  std::vector<float> data(2 * 3 * 4);
  Tensor t(data.data(), DType::kF32, {2, 3, 4});
  const Tensor s = t.Select(1, 2);  // [2, 4]
  ASSERT_EQ(s.ndim, 2);
  EXPECT_EQ(s.shape[0], 2);
  EXPECT_EQ(s.shape[1], 4);
  EXPECT_EQ(s.stride[0], 12);
  EXPECT_EQ(s.stride[1], 1);
  EXPECT_EQ(s.data, static_cast<void*>(data.data() + 8));
  const Tensor last = t.Select(2, 3);  // [2, 3], stride 4 between columns
  EXPECT_EQ(last.ndim, 2);
  EXPECT_EQ(last.stride[1], 4);
  EXPECT_EQ(last.data, static_cast<void*>(data.data() + 3));
  const Tensor b = t.Select(0, 1).Broadcast(0, 5);  // [5, 3, 4], every entry the same memory
  EXPECT_EQ(b.ndim, 3);
  EXPECT_EQ(b.shape[0], 5);
  EXPECT_EQ(b.stride[0], 0);
  EXPECT_EQ(b.stride[1], 4);
  EXPECT_EQ(b.data, static_cast<void*>(data.data() + 12));
}

// More rows than the GEMV takes (batched decode, prefill): every head's f32 tiled GEMM is handed
// out to the threads at once (cpu::GemmBatched), each head cut into the blocks its own MatMul
// would use, so each head's output has MatMul's bits exactly. Heads x rows x columns large
// enough that the work spreads over both threads; MLA's exact-x bf16 copies and f32 weights.
TEST_F(BatchedMatMulTest, ManyRowsGiveEachHeadsMatMulBitsInOneGemm) {
  Rng rng(15);
  struct Shape {
    int64_t t, heads, n, k;
  };
  const Shape shapes[] = {{4, 16, 64, 128}, {8, 16, 128, 64}, {17, 3, 100, 40}};
  ForEachTarget([&] {
    for (DType wt : {DType::kBF16, DType::kF32}) {
      for (const Shape& s : shapes) {
        const std::string what = fmt::format("{} T={} H={} N={} K={}", DTypeName(wt), s.t,
                                             s.heads, s.n, s.k);
        HeadWeights w(rng, wt, s.heads, s.n, s.k);
        for (Weight& wh : w.w) wh.exact_x = true;
        Owned xs(DType::kF32, {s.t, s.heads, s.k + 5});
        rng.Fill(xs);
        const Tensor x = xs.t.Narrow(2, 0, s.k);
        Owned got(DType::kF32, {s.t, s.heads, s.n});
        cpu_.BatchedMatMul(x, w.w, got.t);
        for (int64_t h = 0; h < s.heads; ++h) {
          Owned xh(DType::kF32, {s.t, s.k}), oh(DType::kF32, {s.t, s.n});
          for (int64_t t = 0; t < s.t; ++t) {
            for (int64_t i = 0; i < s.k; ++i) {
              xh.f32()[t * s.k + i] = xs.f32()[(t * s.heads + h) * (s.k + 5) + i];
            }
          }
          cpu_.MatMul(xh.t, w.w[h], Tensor(), oh.t);
          for (int64_t t = 0; t < s.t; ++t) {
            for (int64_t j = 0; j < s.n; ++j) {
              ASSERT_EQ(got.f32()[(t * s.heads + h) * s.n + j], oh.f32()[t * s.n + j])
                  << what << " head " << h << " row " << t << " col " << j;
            }
          }
        }
      }
    }
  });
  SetLogLevel(LogLevel::kInfo);
  CpuBackend traced(BackendOptions{.num_threads = 2, .trace_kernels = true});
  HeadWeights w(rng, DType::kBF16, 4, 8, 16);
  for (Weight& wh : w.w) wh.exact_x = true;
  Owned x(DType::kF32, {5, 4, 16}), out(DType::kF32, {5, 4, 8});
  rng.Fill(x);
  ::testing::internal::CaptureStderr();
  traced.BatchedMatMul(x.t, w.w, out.t);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("batched_matmul gemm bf16 H=4 M=5 N=8 K=16"), std::string::npos) << log;
}

TEST_F(BatchedMatMulTest, TraceNamesTheFusedKernelAndSupportsSaysSo) {
  SetLogLevel(LogLevel::kInfo);
  CpuBackend traced(BackendOptions{.num_threads = 2, .trace_kernels = true});
  Rng rng(14);
  HeadWeights w(rng, DType::kBF16, 4, 8, 16);
  Owned x(DType::kF32, {1, 4, 16}), out(DType::kF32, {1, 4, 8});
  rng.Fill(x);
  ::testing::internal::CaptureStderr();
  traced.BatchedMatMul(x.t, w.w, out.t);
  const std::string log = ::testing::internal::GetCapturedStderr();
  // " x-bf16" where x is rounded to bf16 for the bf16 weights (gemm_bf16.h, Bf16DotRoundsX).
  const std::string want = fmt::format("batched_matmul gemv bf16{} H=4 M=1 N=8 K=16",
                                       cpu::Bf16DotRoundsX() ? " x-bf16" : "");
  EXPECT_NE(log.find(want), std::string::npos) << log;
  EXPECT_TRUE(cpu_.Supports({OpKind::kBatchedMatMul}));
  EXPECT_TRUE(ref_.Supports({OpKind::kBatchedMatMul}));
}

}  // namespace
}  // namespace dh
