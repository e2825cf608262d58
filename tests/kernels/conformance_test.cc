// CpuBackend against ReferenceBackend for every accelerated op x dtype/format x shape, on every
// SIMD target compiled into this binary that the CPU supports.
//
// Tolerances (|cpu - ref| <= tol * max(1, max|ref|), see ExpectClose):
//   MatMul, all formats:      2e-5  (f32 SIMD accumulation vs the reference's double sums)
//   Attention:                2e-5  (f32 dots and Highway's Exp, 1 ULP, vs double sums)
//   RmsNorm, AddRmsNorm:      1e-5
//   SiluMul:                  1e-5  (Highway Exp and a division)
//   Add, Embedding:           0     (exact)
//   MoeExperts:               5e-5  (three chained MatMuls)
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/quant_vnni.h"
#include "backend/reference/reference_backend.h"
#include "base/log.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kernels/kernel_test_util.h"

namespace dh {
namespace {

using test::ExpectClose;
using test::Owned;
using test::Rng;

constexpr DType kWeightTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

void ListTargetsOnce(const std::vector<int64_t>& targets) {
  static bool listed = false;
  if (listed) return;
  listed = true;
  std::string names;
  for (int64_t t : targets) names += std::string(" ") + hwy::TargetName(t);
  std::fprintf(stderr, "SIMD targets under test:%s\n", names.c_str());
}

class ConformanceTest : public ::testing::Test {
 protected:
  // The exact kernels, as the reference (f32 x): the bf16 dot product, which rounds x to bf16 on
  // a CPU with AVX512-BF16, is checked against its bound in gemm_test.cc.
  const cpu::ScopedBf16DotForTest exact_x_{cpu::Bf16Dot::kOff};
  // Runs body once per SIMD target, forcing the dispatcher onto that target.
  template <typename Body>
  void ForEachTarget(Body body) {
    const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
    ASSERT_FALSE(targets.empty());
    ListTargetsOnce(targets);
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

TEST_F(ConformanceTest, MatMulDense) {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1},   {1, 7, 5},   {1, 33, 67},  {2, 17, 129}, {3, 40, 255},
                          {4, 9, 64},  {5, 31, 100}, {8, 64, 97}, {17, 23, 301}};
  Rng rng(1);
  ForEachTarget([&] {
    for (DType wt : kWeightTypes) {
      for (const Shape& s : shapes) {
        for (bool with_bias : {false, true}) {
          // x rows are padded to a larger stride to exercise strided rows.
          Owned x(DType::kF32, {s.m, s.k + 3}), w(wt, {s.n, s.k}), bias(DType::kF32, {s.n});
          rng.Fill(x);
          rng.Fill(w);
          rng.Fill(bias);
          Tensor xv = x.t;
          xv.shape[1] = s.k;
          Owned got(DType::kF32, {s.m, s.n}), want(DType::kF32, {s.m, s.n});
          const Tensor b = with_bias ? bias.t : Tensor();
          cpu_.MatMul(xv, Weight::Dense(w.t), b, got.t);
          ref_.MatMul(xv, Weight::Dense(w.t), b, want.t);
          ExpectClose(got.ToVector(), want.ToVector(), 2e-5f,
                      fmt::format("matmul {} M={} N={} K={} bias={}", DTypeName(wt), s.m, s.n,
                                  s.k, with_bias));
        }
      }
    }
  });
}

// Decode rows (up to kGemvMaxRows rows of x) give each row the same bits whether it shares the
// call with other rows or not: a sequence's logits do not depend on how many others share its
// decode step, and a speculative verification of up to 3 rows matches plain decoding.
TEST_F(ConformanceTest, GemvRowDoesNotDependOnItsNeighbours) {
  Rng rng(7);
  ForEachTarget([&] {
    for (DType wt : kWeightTypes) {
      for (int64_t k : {5, 67, 255, 1000}) {
        const int64_t n = 19;
        Owned x(DType::kF32, {3, k}), w(wt, {n, k}), bias(DType::kF32, {n});
        rng.Fill(x);
        rng.Fill(w);
        rng.Fill(bias);
        for (int64_t m = 2; m <= cpu::kGemvMaxRows; ++m) {
          Tensor xs = x.t;
          xs.shape[0] = m;
          Owned all(DType::kF32, {m, n});
          cpu_.MatMul(xs, Weight::Dense(w.t), bias.t, all.t);
          const std::vector<float> got = all.ToVector();
          for (int64_t r = 0; r < m; ++r) {
            Owned xr(DType::kF32, {1, k}), one(DType::kF32, {1, n});
            std::copy(x.f32() + r * k, x.f32() + (r + 1) * k, xr.f32());
            cpu_.MatMul(xr.t, Weight::Dense(w.t), bias.t, one.t);
            const std::vector<float> alone = one.ToVector();
            for (int64_t j = 0; j < n; ++j) {
              ASSERT_EQ(got[r * n + j], alone[j])
                  << DTypeName(wt) << " K=" << k << " M=" << m << " row " << r << " col " << j;
            }
          }
        }
      }
    }
  });
}

TEST_F(ConformanceTest, MatMulQuantized) {
  Rng rng(2);
  // f32 products here (exact weights, 2e-5); the integer-dot kernel, which quantizes x, is checked
  // against its error bound in quant_matmul_test.cc.
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kOff);
  ForEachTarget([&] {
    for (int64_t m : {1, 3, 6}) {
      // fp8 with 16x32 blocks over 37x70: partial edge blocks in both directions.
      {
        Owned q(DType::kF8E4M3, {37, 70}), sc(DType::kF32, {3, 3});
        rng.Fill(q);
        rng.Fill(sc, 0.01f, 0.1f);
        Weight w;
        w.format = WeightFormat::kFp8Block;
        w.rows = 37;
        w.cols = 70;
        w.block_rows = 16;
        w.block_cols = 32;
        w.data = q.t;
        w.scales = sc.t;
        Owned x(DType::kF32, {m, 70}), got(DType::kF32, {m, 37}), want(DType::kF32, {m, 37});
        rng.Fill(x);
        cpu_.MatMul(x.t, w, Tensor(), got.t);
        ref_.MatMul(x.t, w, Tensor(), want.t);
        ExpectClose(got.ToVector(), want.ToVector(), 2e-5f, fmt::format("fp8 M={}", m));
      }
      // int8 and int4 with groups of 16 over 29x96.
      for (WeightFormat f : {WeightFormat::kInt8, WeightFormat::kInt4}) {
        const bool int4 = f == WeightFormat::kInt4;
        Owned q(int4 ? DType::kU8 : DType::kI8, {29, int4 ? 48 : 96});
        Owned sc(DType::kF16, {29, 6}), zeros(DType::kU8, {29, 3}), bias(DType::kF32, {29});
        rng.Fill(q);
        rng.Fill(sc, 0.01f, 0.1f);
        rng.Fill(zeros);
        rng.Fill(bias);
        Weight w;
        w.format = f;
        w.rows = 29;
        w.cols = 96;
        w.group_size = 16;
        w.data = q.t;
        w.scales = sc.t;
        if (int4) w.zeros = zeros.t;
        Owned x(DType::kF32, {m, 96}), got(DType::kF32, {m, 29}), want(DType::kF32, {m, 29});
        rng.Fill(x);
        cpu_.MatMul(x.t, w, bias.t, got.t);
        ref_.MatMul(x.t, w, bias.t, want.t);
        ExpectClose(got.ToVector(), want.ToVector(), 2e-5f,
                    fmt::format("{} M={}", WeightFormatName(f), m));
      }
    }
  });
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kAuto);
}

TEST_F(ConformanceTest, RmsNormAndAddRmsNorm) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {1, 17}, {3, 64}, {5, 1001}};
  Rng rng(3);
  ForEachTarget([&] {
    for (DType wt : kWeightTypes) {
      for (auto [t, h] : shapes) {
        Owned x(DType::kF32, {t, h}), w(wt, {h}), got(DType::kF32, {t, h}),
            want(DType::kF32, {t, h});
        rng.Fill(x, -3, 3);
        rng.Fill(w);
        const std::string what = fmt::format("{} T={} H={}", DTypeName(wt), t, h);
        cpu_.RmsNorm(x.t, w.t, 1e-6f, got.t);
        ref_.RmsNorm(x.t, w.t, 1e-6f, want.t);
        ExpectClose(got.ToVector(), want.ToVector(), 1e-5f, "rmsnorm " + what);

        Owned res_cpu(DType::kF32, {t, h}), res_ref(DType::kF32, {t, h});
        rng.Fill(res_cpu);
        res_ref.bytes = res_cpu.bytes;
        cpu_.AddRmsNorm(res_cpu.t, x.t, w.t, 1e-5f, got.t);
        ref_.AddRmsNorm(res_ref.t, x.t, w.t, 1e-5f, want.t);
        ExpectClose(res_cpu.ToVector(), res_ref.ToVector(), 0, "add_rmsnorm residual " + what);
        ExpectClose(got.ToVector(), want.ToVector(), 1e-5f, "add_rmsnorm " + what);

        // In place (out aliases x).
        Owned inplace(DType::kF32, {t, h});
        inplace.bytes = x.bytes;
        cpu_.RmsNorm(inplace.t, w.t, 1e-6f, inplace.t);
        ref_.RmsNorm(x.t, w.t, 1e-6f, want.t);
        ExpectClose(inplace.ToVector(), want.ToVector(), 1e-5f, "rmsnorm in place " + what);
      }
    }
  });
}

TEST_F(ConformanceTest, ElementwiseOps) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {1, 13}, {4, 100}, {3, 4097}, {1, 40000}};
  Rng rng(4);
  ForEachTarget([&] {
    for (auto [t, h] : shapes) {
      for (bool strided : {false, true}) {
        // Strided: views of the first h columns of rows 5 wider.
        const int64_t width = strided ? h + 5 : h;
        Owned a(DType::kF32, {t, width}), b(DType::kF32, {t, width});
        rng.Fill(a, -12, 12);
        rng.Fill(b, -2, 2);
        Tensor av = a.t, bv = b.t;
        av.shape[1] = bv.shape[1] = h;
        Owned got(DType::kF32, {t, h}), want(DType::kF32, {t, h});
        const std::string what = fmt::format("T={} H={} strided={}", t, h, strided);
        cpu_.SiluMul(av, bv, got.t);
        ref_.SiluMul(av, bv, want.t);
        ExpectClose(got.ToVector(), want.ToVector(), 1e-5f, "silu_mul " + what);
        cpu_.Add(av, bv, got.t);
        ref_.Add(av, bv, want.t);
        ExpectClose(got.ToVector(), want.ToVector(), 0, "add " + what);
      }
    }
  });
}

TEST_F(ConformanceTest, Embedding) {
  Rng rng(5);
  ForEachTarget([&] {
    for (DType wt : kWeightTypes) {
      for (int64_t h : {1, 19, 64}) {
        Owned table(wt, {50, h}), ids(DType::kI32, {7});
        rng.Fill(table);
        for (int i = 0; i < 7; ++i) ids.i32()[i] = rng.Int(0, 49);
        Owned got(DType::kF32, {7, h}), want(DType::kF32, {7, h});
        cpu_.Embedding(Weight::Dense(table.t), ids.t, got.t);
        ref_.Embedding(Weight::Dense(table.t), ids.t, want.t);
        ExpectClose(got.ToVector(), want.ToVector(), 0,
                    fmt::format("embedding {} H={}", DTypeName(wt), h));
      }
    }
  });
}

// A paged batch: per sequence its cached length and how many of its last tokens are queries.
struct AttnCase {
  int64_t hq, hkv, dk, dv;
  bool v_is_k_prefix;  // MLA-style: v_cache is the first dv columns of k_cache
  int block_size;
  std::vector<std::pair<int, int>> seqs;  // (seq_len, num_queries)
};

void RunAttentionCase(Backend& cpu, Backend& ref, const AttnCase& c, Rng& rng) {
  const int num_seqs = static_cast<int>(c.seqs.size());
  int max_blocks = 0, num_tokens = 0, max_len = 0;
  for (auto [len, nq] : c.seqs) {
    max_blocks = std::max(max_blocks, (len + c.block_size - 1) / c.block_size);
    num_tokens += nq;
    max_len = std::max(max_len, len);
  }
  const int num_blocks = num_seqs * max_blocks + 3;
  const int64_t slots = static_cast<int64_t>(num_blocks) * c.block_size;
  // Blocks handed out in a shuffled order so tables are not the identity.
  std::vector<int32_t> order(num_blocks);
  std::iota(order.begin(), order.end(), 0);
  for (int i = num_blocks - 1; i > 0; --i) std::swap(order[i], order[rng.Int(0, i)]);
  std::vector<int32_t> qs = {0}, lens, tables(num_seqs * max_blocks, 0);
  for (int s = 0; s < num_seqs; ++s) {
    lens.push_back(c.seqs[s].first);
    qs.push_back(qs.back() + c.seqs[s].second);
    for (int b = 0; b < max_blocks; ++b) tables[s * max_blocks + b] = order[s * max_blocks + b];
  }
  const int64_t kwidth = c.v_is_k_prefix ? c.dk : c.dk + 2;  // pad rows: dim-0 stride != dk
  Owned kbuf(DType::kF32, {slots, c.hkv, kwidth}), vbuf(DType::kF32, {slots, c.hkv, c.dv});
  rng.Fill(kbuf);
  rng.Fill(vbuf);
  Tensor k_cache = kbuf.t;
  k_cache.shape[2] = c.dk;
  Tensor v_cache = vbuf.t;
  if (c.v_is_k_prefix) {
    v_cache = kbuf.t;
    v_cache.shape[2] = c.dv;
  }
  Owned q(DType::kF32, {num_tokens, c.hq, c.dk});
  rng.Fill(q, -2, 2);
  const AttentionMeta meta =
      HostAttentionMeta(qs, lens, tables, num_tokens, c.block_size, max_blocks, max_len);
  Owned got(DType::kF32, {num_tokens, c.hq, c.dv}), want(DType::kF32, {num_tokens, c.hq, c.dv});
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  cpu.Attention(q.t, k_cache, v_cache, meta, scale, got.t);
  ref.Attention(q.t, k_cache, v_cache, meta, scale, want.t);
  ExpectClose(got.ToVector(), want.ToVector(), 2e-5f,
              fmt::format("attention Hq={} Hkv={} Dk={} Dv={} bs={} seqs={}", c.hq, c.hkv, c.dk,
                          c.dv, c.block_size, c.seqs.size()));
}

TEST_F(ConformanceTest, AttentionPagedGqaMultiSequence) {
  const AttnCase cases[] = {
      {4, 4, 16, 16, false, 16, {{5, 5}}},                     // one prefill, MHA
      {8, 2, 33, 33, false, 4, {{5, 5}, {17, 1}, {1, 1}}},     // prefill + decodes, GQA 4
      {6, 1, 20, 12, true, 4, {{40, 7}, {9, 1}}},              // chunked prefill, MQA, v in k
      {12, 3, 64, 64, false, 16, {{70, 1}, {33, 2}, {2, 2}}},  // GQA 4, longer contexts
  };
  Rng rng(6);
  ForEachTarget([&] {
    for (const AttnCase& c : cases) RunAttentionCase(cpu_, ref_, c, rng);
  });
}

TEST_F(ConformanceTest, MoeExpertsBf16) {
  constexpr int64_t kTokens = 5, kHidden = 24, kInter = 13, kExperts = 4, kTopK = 2;
  Rng rng(7);
  std::vector<std::unique_ptr<Owned>> store;
  std::vector<ExpertWeights> experts(kExperts);
  auto make = [&](int64_t rows, int64_t cols) {
    store.push_back(std::make_unique<Owned>(DType::kBF16, std::initializer_list<int64_t>{rows, cols}));
    rng.Fill(*store.back());
    return Weight::Dense(store.back()->t);
  };
  for (auto& e : experts) {
    e.gate = make(kInter, kHidden);
    e.up = make(kInter, kHidden);
    e.down = make(kHidden, kInter);
  }
  Owned x(DType::kF32, {kTokens, kHidden}), ids(DType::kI32, {kTokens, kTopK}),
      w(DType::kF32, {kTokens, kTopK});
  rng.Fill(x);
  rng.Fill(w, 0, 1);
  // Expert 3 gets no token; token 4 has an empty slot (-1).
  const int32_t routing[kTokens][kTopK] = {{0, 1}, {1, 0}, {2, 0}, {1, 2}, {2, -1}};
  for (int t = 0; t < kTokens; ++t) {
    for (int k = 0; k < kTopK; ++k) ids.i32()[t * kTopK + k] = routing[t][k];
  }
  ForEachTarget([&] {
    Owned got(DType::kF32, {kTokens, kHidden}), want(DType::kF32, {kTokens, kHidden});
    cpu_.MoeExperts(x.t, ids.t, w.t, experts, got.t);
    ref_.MoeExperts(x.t, ids.t, w.t, experts, want.t);
    ExpectClose(got.ToVector(), want.ToVector(), 5e-5f, "moe experts");
  });
}

// The comparisons above would pass vacuously if CpuBackend fell back to the reference; the kernel
// trace shows which kernel ran.
TEST_F(ConformanceTest, TraceShowsTheSimdKernelsRan) {
  SetLogLevel(LogLevel::kInfo);
  CpuBackend traced(BackendOptions{.num_threads = 2, .trace_kernels = true});
  Rng rng(8);
  Owned w(DType::kBF16, {8, 16}), x(DType::kF32, {5, 16}), out(DType::kF32, {5, 8});
  Owned norm_w(DType::kF32, {16}), xs(DType::kF32, {5, 16});
  rng.Fill(w);
  rng.Fill(x);
  rng.Fill(norm_w);
  ::testing::internal::CaptureStderr();
  traced.MatMul(x.t.Slice0(0, 1), Weight::Dense(w.t), Tensor(), out.t.Slice0(0, 1));
  traced.MatMul(x.t, Weight::Dense(w.t), Tensor(), out.t);
  traced.MatMul(x.t, Weight::Dense(w.t), Tensor(), out.t);  // logged once per shape
  traced.RmsNorm(x.t, norm_w.t, 1e-6f, xs.t);
  traced.SiluMul(x.t, xs.t, xs.t);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("matmul gemv bf16 M=1 N=8 K=16 target="), std::string::npos) << log;
  cpu::GemmArgs bf16_call;
  bf16_call.m = 5;
  bf16_call.k = 16;
  bf16_call.wtype = cpu::WType::kBF16;
  const std::string gemm = cpu::UseBf16Dot(bf16_call) ? "gemm-bf16dot" : "gemm-tiled";  // 5 rows
  EXPECT_NE(log.find("matmul " + gemm + " bf16 M=5 N=8 K=16 target="), std::string::npos) << log;
  EXPECT_NE(log.find("rmsnorm T=5 H=16"), std::string::npos) << log;
  // 40 rows: the packed panels on a 16-register target (gemm.h GemmUsesPanels).
  Owned x40(DType::kF32, {40, 16}), out40(DType::kF32, {40, 8});
  rng.Fill(x40);
  ::testing::internal::CaptureStderr();
  traced.MatMul(x40.t, Weight::Dense(w.t), Tensor(), out40.t);
  const std::string log40 = ::testing::internal::GetCapturedStderr();
  bf16_call.m = 40;
  const std::string gemm40 = cpu::UseBf16Dot(bf16_call) ? "gemm-bf16dot"
                             : cpu::GemmUsesPanels(40, cpu::WType::kBF16, false) ? "gemm-panels"
                                                                                  : "gemm-tiled";
  EXPECT_NE(log40.find("matmul " + gemm40 + " bf16 M=40 N=8 K=16 target="), std::string::npos)
      << log40;
  EXPECT_NE(log.find("silu_mul T=5 I=16"), std::string::npos) << log;
  EXPECT_EQ(log.find("reference"), std::string::npos) << log;
  EXPECT_EQ(log.find(gemm + " bf16 M=5"), log.rfind(gemm + " bf16 M=5")) << log;
}

TEST_F(ConformanceTest, SupportsMatchesAcceleratedOps) {
  EXPECT_TRUE(cpu_.Supports({OpKind::kMatMul, WeightFormat::kDense, DType::kBF16}));
  EXPECT_TRUE(cpu_.Supports({OpKind::kMatMul, WeightFormat::kFp8Block, DType::kF8E4M3}));
  EXPECT_FALSE(cpu_.Supports({OpKind::kMatMul, WeightFormat::kDense, DType::kI32}));
  EXPECT_TRUE(cpu_.Supports({OpKind::kAttention}));
  EXPECT_TRUE(cpu_.Supports({OpKind::kMoeGate}));
  EXPECT_TRUE(cpu_.Supports({OpKind::kRope}));
  EXPECT_TRUE(ref_.Supports({OpKind::kMoeGate}));
  EXPECT_EQ(cpu_.name(), "cpu");
  EXPECT_EQ(ref_.name(), "reference");
}

}  // namespace
}  // namespace dh
