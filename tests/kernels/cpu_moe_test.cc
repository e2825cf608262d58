// CpuBackend::MoeGate against the reference router, exactly (ids and weights bit for bit: the same
// float and double steps), for every scoring function and top-k method, with tied scores.
//
// CpuBackend::MoeExperts (tokens grouped by expert, expert FFNs through the backend's MatMul)
// against the reference backend for every weight format the experts come in, decode (T = 1) and
// batch/prefill token counts, on every SIMD target this CPU runs and every integer-dot kernel.
//
// Tolerances (|got - want| <= tol * max(1, max|want|), ExpectClose):
//   vs ReferenceBackend with the integer dot off:    5e-5 (three chained f32 MatMuls, as the
//     conformance test's MoeExpertsBf16)
//   vs the same backend run one (token, slot) pair at a time, integer dot on: 2e-5 (the same
//     kernels and the same per-row x quantization; only the f32 summation order differs between
//     the GEMV of one row and the batched kernels)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/quant_vnni.h"
#include "backend/reference/reference_backend.h"
#include "hwy/targets.h"
#include "kernels/kernel_test_util.h"

namespace dh {
namespace {

using test::ExpectClose;
using test::Owned;
using test::Rng;

constexpr int64_t kHidden = 64, kInter = 96, kExperts = 6, kGroup = 32;

enum class Fmt { kF32, kBF16, kInt8, kInt4, kFp8 };
const char* FmtName(Fmt f) {
  switch (f) {
    case Fmt::kF32:
      return "f32";
    case Fmt::kBF16:
      return "bf16";
    case Fmt::kInt8:
      return "int8 g32";
    case Fmt::kInt4:
      return "int4 g32";
    case Fmt::kFp8:
      return "fp8 b16x32";
  }
  return "?";
}

// Random expert weights of one format; the Owned buffers live as long as the fixture.
class Experts {
 public:
  Experts(Fmt f, Rng& rng) : f_(f), rng_(rng) {
    for (int64_t e = 0; e < kExperts; ++e) {
      ExpertWeights w;
      w.gate = Make(kInter, kHidden);
      w.up = Make(kInter, kHidden);
      w.down = Make(kHidden, kInter);
      experts_.push_back(w);
    }
  }
  std::span<const ExpertWeights> span() const { return experts_; }

 private:
  Owned& New(DType dtype, int64_t rows, int64_t cols) {
    store_.push_back(std::make_unique<Owned>(dtype, std::initializer_list<int64_t>{rows, cols}));
    return *store_.back();
  }
  Weight Make(int64_t rows, int64_t cols) {
    if (f_ == Fmt::kF32 || f_ == Fmt::kBF16) {
      Owned& o = New(f_ == Fmt::kF32 ? DType::kF32 : DType::kBF16, rows, cols);
      rng_.Fill(o, -0.3f, 0.3f);
      return Weight::Dense(o.t);
    }
    Weight w;
    w.rows = rows;
    w.cols = cols;
    if (f_ == Fmt::kFp8) {
      w.format = WeightFormat::kFp8Block;
      w.block_rows = 16;
      w.block_cols = 32;
      Owned& q = New(DType::kF8E4M3, rows, cols);
      Owned& sc = New(DType::kF32, (rows + 15) / 16, (cols + 31) / 32);
      rng_.Fill(q);
      rng_.Fill(sc, 0.0005f, 0.002f);
      w.data = q.t;
      w.scales = sc.t;
      return w;
    }
    const bool int4 = f_ == Fmt::kInt4;
    w.format = int4 ? WeightFormat::kInt4 : WeightFormat::kInt8;
    w.group_size = kGroup;
    Owned& q = New(int4 ? DType::kU8 : DType::kI8, rows, int4 ? cols / 2 : cols);
    Owned& sc = New(DType::kF16, rows, cols / kGroup);
    rng_.Fill(q);
    rng_.Fill(sc, 0.002f, 0.01f);
    w.data = q.t;
    w.scales = sc.t;
    if (int4) {
      Owned& zeros = New(DType::kU8, rows, (cols / kGroup + 1) / 2);
      rng_.Fill(zeros);
      w.zeros = zeros.t;
    }
    return w;
  }

  Fmt f_;
  Rng& rng_;
  std::vector<std::unique_ptr<Owned>> store_;
  std::vector<ExpertWeights> experts_;
};

struct Routing {
  int64_t tokens, top_k;
};

// Random routing with distinct experts per token; every fifth slot (after the first) is empty
// (-1), and expert kExperts - 1 is never chosen (an expert without tokens).
void Route(Rng& rng, Owned& ids, Owned& weights, const Routing& r) {
  for (int64_t t = 0; t < r.tokens; ++t) {
    std::vector<int32_t> chosen;
    for (int64_t i = 0; i < r.top_k; ++i) {
      int32_t e;
      do {
        e = rng.Int(0, kExperts - 2);
      } while (std::find(chosen.begin(), chosen.end(), e) != chosen.end());
      chosen.push_back(e);
      const int64_t slot = t * r.top_k + i;
      ids.i32()[slot] = (slot % 5 == 4 && i > 0) ? -1 : e;
      weights.f32()[slot] = rng.Uniform(0.05f, 1.0f);
    }
  }
}

// The same MoE, one (token, slot) pair at a time through b's MatMul and SiluMul.
std::vector<float> PairByPair(CpuBackend& b, const Owned& x, const Owned& ids, const Owned& w,
                              std::span<const ExpertWeights> experts, const Routing& r) {
  std::vector<float> out(r.tokens * kHidden, 0.0f);
  Owned gate(DType::kF32, {1, kInter}), up(DType::kF32, {1, kInter}), y(DType::kF32, {1, kHidden});
  for (int64_t t = 0; t < r.tokens; ++t) {
    const Tensor xt(const_cast<uint8_t*>(x.bytes.data()) + t * kHidden * sizeof(float), DType::kF32,
                    {1, kHidden});
    for (int64_t i = 0; i < r.top_k; ++i) {
      const int32_t e = reinterpret_cast<const int32_t*>(ids.bytes.data())[t * r.top_k + i];
      if (e < 0) continue;
      b.MatMul(xt, experts[e].gate, Tensor(), gate.t);
      b.MatMul(xt, experts[e].up, Tensor(), up.t);
      b.SiluMul(gate.t, up.t, gate.t);
      b.MatMul(gate.t, experts[e].down, Tensor(), y.t);
      const float wt = reinterpret_cast<const float*>(w.bytes.data())[t * r.top_k + i];
      for (int64_t c = 0; c < kHidden; ++c) out[t * kHidden + c] += wt * y.f32()[c];
    }
  }
  return out;
}

class MoeExpertsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    hwy::SetSupportedTargetsForTest(0);
    cpu::SetIntegerDotForTest(cpu::IntegerDot::kAuto);
    cpu::SetIntegerDotPathForTest(cpu::IntegerDotPath::kNone);
  }
  const cpu::ScopedBf16DotForTest bf16_dot_{cpu::Bf16DotMode()};  // puts back what tests change
  ReferenceBackend ref_{BackendOptions{}};
  CpuBackend cpu_{BackendOptions{.num_threads = 2}};
};

const Routing kRoutings[] = {{1, 2}, {1, 4}, {4, 3}, {11, 3}, {23, 2}};
const Fmt kFormats[] = {Fmt::kF32, Fmt::kBF16, Fmt::kInt8, Fmt::kInt4, Fmt::kFp8};

TEST_F(MoeExpertsTest, MatchesReferenceOnEverySimdTarget) {
  Rng rng(11);
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kOff);
  cpu::SetBf16DotForTest(cpu::Bf16Dot::kOff);  // exact x here; the bf16 GEMM's bound: gemm_test.cc
  for (Fmt f : kFormats) {
    Experts experts(f, rng);
    for (const Routing& r : kRoutings) {
      Owned x(DType::kF32, {r.tokens, kHidden}), ids(DType::kI32, {r.tokens, r.top_k}),
          w(DType::kF32, {r.tokens, r.top_k});
      rng.Fill(x);
      Route(rng, ids, w, r);
      Owned want(DType::kF32, {r.tokens, kHidden});
      ref_.MoeExperts(x.t, ids.t, w.t, experts.span(), want.t);
      for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        hwy::SetSupportedTargetsForTest(target);
        Owned got(DType::kF32, {r.tokens, kHidden});
        cpu_.MoeExperts(x.t, ids.t, w.t, experts.span(), got.t);
        ExpectClose(got.ToVector(), want.ToVector(), 5e-5f,
                    fmt::format("{} T={} k={} on {}", FmtName(f), r.tokens, r.top_k,
                                hwy::TargetName(target)));
      }
      hwy::SetSupportedTargetsForTest(0);
    }
  }
}

TEST_F(MoeExpertsTest, IntegerDotGroupedEqualsPairByPair) {
  if (!cpu::IntegerDotAvailable()) GTEST_SKIP() << "no integer-dot kernel on this CPU";
  Rng rng(12);
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kOn);
  for (Fmt f : {Fmt::kInt8, Fmt::kInt4}) {
    Experts experts(f, rng);
    for (const Routing& r : kRoutings) {
      Owned x(DType::kF32, {r.tokens, kHidden}), ids(DType::kI32, {r.tokens, r.top_k}),
          w(DType::kF32, {r.tokens, r.top_k});
      rng.Fill(x);
      Route(rng, ids, w, r);
      for (auto path : {cpu::IntegerDotPath::kAvx2, cpu::IntegerDotPath::kAvxVnni,
                        cpu::IntegerDotPath::kVnni512}) {
        if (!cpu::IntegerDotPathAvailable(path)) continue;
        cpu::SetIntegerDotPathForTest(path);
        Owned got(DType::kF32, {r.tokens, kHidden});
        cpu_.MoeExperts(x.t, ids.t, w.t, experts.span(), got.t);
        ExpectClose(got.ToVector(), PairByPair(cpu_, x, ids, w, experts.span(), r), 2e-5f,
                    fmt::format("{} T={} k={} {}", FmtName(f), r.tokens, r.top_k,
                                cpu::IntegerDotPathName(path)));
      }
    }
  }
}

TEST_F(MoeExpertsTest, GateEqualsReferenceExactly) {
  Rng rng(14);
  struct GateCase {
    ScoringFunc scoring;
    TopkMethod method;
    int experts, top_k, n_group, topk_group;
    bool norm;
    float scale;
  };
  const GateCase cases[] = {
      {ScoringFunc::kSoftmax, TopkMethod::kGreedy, 16, 6, 1, 1, false, 1.0f},
      {ScoringFunc::kSoftmax, TopkMethod::kGreedy, 8, 2, 1, 1, true, 1.0f},
      {ScoringFunc::kSoftmax, TopkMethod::kGroupLimitedGreedy, 32, 6, 8, 3, false, 16.0f},
      {ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 64, 8, 8, 4, true, 2.5f},
      {ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 16, 4, 4, 2, false, 1.0f},
      {ScoringFunc::kSigmoid, TopkMethod::kGreedy, 5, 5, 1, 1, true, 1.0f},
  };
  for (const GateCase& c : cases) {
    MoeGateParams p;
    p.scoring = c.scoring;
    p.method = c.method;
    p.top_k = c.top_k;
    p.n_group = c.n_group;
    p.topk_group = c.topk_group;
    p.norm_topk_prob = c.norm;
    p.routed_scaling_factor = c.scale;
    for (int64_t tokens : {1, 7}) {
      Owned logits(DType::kF32, {tokens, c.experts}), bias(DType::kF32, {c.experts});
      rng.Fill(logits, -3.0f, 3.0f);
      rng.Fill(bias, -0.5f, 0.5f);
      // Coarse values so some scores tie (the lower expert id must win, as in the reference).
      for (int64_t i = 0; i < tokens * c.experts; i += 2) {
        logits.f32()[i] = std::round(logits.f32()[i] * 2.0f) / 2.0f;
      }
      const Tensor b = c.method == TopkMethod::kNoauxTc ? bias.t : Tensor();
      Owned got_ids(DType::kI32, {tokens, c.top_k}), want_ids(DType::kI32, {tokens, c.top_k});
      Owned got_w(DType::kF32, {tokens, c.top_k}), want_w(DType::kF32, {tokens, c.top_k});
      cpu_.MoeGate(logits.t, b, p, got_ids.t, got_w.t);
      ref_.MoeGate(logits.t, b, p, want_ids.t, want_w.t);
      const std::string what = fmt::format("experts={} k={} method={} T={}", c.experts, c.top_k,
                                           static_cast<int>(c.method), tokens);
      EXPECT_EQ(std::vector<int32_t>(got_ids.i32(), got_ids.i32() + tokens * c.top_k),
                std::vector<int32_t>(want_ids.i32(), want_ids.i32() + tokens * c.top_k))
          << what;
      EXPECT_EQ(got_w.ToVector(), want_w.ToVector()) << what;
    }
  }
}

TEST_F(MoeExpertsTest, NoRoutedTokenGivesZeros) {
  Rng rng(13);
  Experts experts(Fmt::kBF16, rng);
  Owned x(DType::kF32, {3, kHidden}), ids(DType::kI32, {3, 2}), w(DType::kF32, {3, 2});
  rng.Fill(x);
  for (int i = 0; i < 6; ++i) {
    ids.i32()[i] = -1;
    w.f32()[i] = 1.0f;
  }
  Owned got(DType::kF32, {3, kHidden});
  rng.Fill(got);
  cpu_.MoeExperts(x.t, ids.t, w.t, experts.span(), got.t);
  EXPECT_EQ(got.ToVector(), std::vector<float>(3 * kHidden, 0.0f));
}

}  // namespace
}  // namespace dh
