// Models loaded with LoadOptions::quant (int8 / int4 projection weights) on golden fixtures:
// logits stay close to the f32 model's, on the reference and the CPU backend, and bad --quant
// values are rejected with a message listing the accepted ones.
//
// Measure: relative RMS error of the full-prompt logits, ||q - f|| / ||f||, against the same
// model loaded without quantization. The fixtures' weights are uniform random, the worst case for
// a 16-level grid: one int4 matrix alone has a relative RMS weight error of 1/15 (int8: 1/254),
// and the model chains ~10 of them. Measured (llama_f32 / ds_moe, both backends equal):
// int8 0.011 / 0.012, int8-row 0.013 / 0.015, int4 0.147 / 0.193, int4-g128 0.185 / 0.208.
// Bounds: int8 <= 0.03, int8-row <= 0.04, int4 <= 0.30, int4-g128 <= 0.35.
// Quantization must also change the logits (> 1e-6), so the test cannot pass on unquantized
// weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant_vnni.h"
#include "backend/reference/reference_backend.h"
#include "model/model.h"
#include "model/sequence_runner.h"

namespace dh {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures";
const std::vector<int32_t> kPrompt = {73, 99, 151, 176, 26, 250, 230, 84, 58, 150, 197, 139};

std::unique_ptr<Backend> MakeBackend(const std::string& name) {
  BackendOptions o;
  o.num_threads = 2;
  if (name == "cpu") return std::make_unique<CpuBackend>(o);
  return std::make_unique<ReferenceBackend>(o);
}

Result<std::vector<float>> Logits(const std::string& fixture, const std::string& backend_name,
                                  const std::string& quant) {
  auto backend = MakeBackend(backend_name);
  LoadOptions o;
  DH_ASSIGN_OR_RETURN(o.plan, ParseWeightPlan({.quant = quant}));
  DH_ASSIGN_OR_RETURN(auto model, LoadModel((kFixtures / fixture).string(), *backend, o));
  DH_ASSIGN_OR_RETURN(auto runner,
                      SequenceRunner::Create(*model, *backend, static_cast<int>(kPrompt.size())));
  return runner->Feed(kPrompt, /*all_logits=*/true);
}

double RelativeRmsError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    den += want[i] * static_cast<double>(want[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(QuantizedModelTest, LogitsStayCloseToF32) {
  const struct {
    const char* quant;
    double bound;
  } kQuants[] = {{"int8", 0.03}, {"int8-row", 0.04}, {"int4", 0.30}, {"int4-g128", 0.35}};
  // A Llama (dense MLP, GQA) and a DeepSeek MoE (MLA, routed experts) fixture.
  for (const char* fixture : {"llama_f32", "ds_moe"}) {
    if (!fs::exists(kFixtures / fixture)) GTEST_SKIP() << "fixture " << fixture << " is absent";
    for (const char* backend : {"reference", "cpu"}) {
      auto f32 = Logits(fixture, backend, "none");
      ASSERT_TRUE(f32.ok()) << f32.status().message();
      for (const auto& q : kQuants) {
        auto got = Logits(fixture, backend, q.quant);
        ASSERT_TRUE(got.ok()) << fixture << " " << q.quant << ": " << got.status().message();
        ASSERT_EQ(got->size(), f32->size());
        const double err = RelativeRmsError(*got, *f32);
        std::printf("%s %s %s: relative RMS logit error %.5f (bound %.2f)\n", fixture, backend,
                    q.quant, err, q.bound);
        EXPECT_LE(err, q.bound) << fixture << " " << backend << " " << q.quant;
        EXPECT_GT(err, 1e-6) << fixture << " " << backend << " " << q.quant
                             << ": logits unchanged, weights were not quantized";
      }
    }
  }
}

TEST(QuantizedModelTest, BackendsAgreeOnQuantizedModel) {
  if (!fs::exists(kFixtures / "ds_moe")) GTEST_SKIP() << "fixture ds_moe is absent";
  for (const char* quant : {"int8", "int4"}) {
    auto ref = Logits("ds_moe", "reference", quant);
    // f32 products on the CPU: the same weights, so only summation order differs (neither the
    // integer dot nor the bf16 dot product, which round x).
    cpu::SetIntegerDotForTest(cpu::IntegerDot::kOff);
    auto cpu = [&] {
      const cpu::ScopedBf16DotForTest exact_x(cpu::Bf16Dot::kOff);
      return Logits("ds_moe", "cpu", quant);
    }();
    // The integer (VNNI) kernels also round x to int8 per 32 columns (quant_vnni.h): an 8-bit
    // error of the same order as int8 weights' (0.01-0.02 here), so the bound is 0.05.
    cpu::SetIntegerDotForTest(cpu::IntegerDot::kOn);
    auto cpu_int = Logits("ds_moe", "cpu", quant);
    cpu::SetIntegerDotForTest(cpu::IntegerDot::kAuto);
    ASSERT_TRUE(ref.ok() && cpu.ok() && cpu_int.ok());
    EXPECT_LE(RelativeRmsError(*cpu, *ref), 1e-4) << quant;
    EXPECT_LE(RelativeRmsError(*cpu_int, *ref), 0.05) << quant << " integer dot";
  }
}

// FP8 block-scaled checkpoints are dequantized, then quantized (no FP8 left in the model).
TEST(QuantizedModelTest, QuantizesFp8Checkpoint) {
  if (!fs::exists(kFixtures / "ds_v3_fp8")) GTEST_SKIP() << "fixture ds_v3_fp8 is absent";
  auto fp8 = Logits("ds_v3_fp8", "cpu", "none");
  ASSERT_TRUE(fp8.ok()) << fp8.status().message();
  for (const auto& q : {std::pair<const char*, double>{"int8", 0.03}, {"int4", 0.30}}) {
    auto got = Logits("ds_v3_fp8", "cpu", q.first);
    ASSERT_TRUE(got.ok()) << q.first << ": " << got.status().message();
    const double err = RelativeRmsError(*got, *fp8);
    std::printf("ds_v3_fp8 cpu %s: relative RMS logit error %.5f (bound %.2f)\n", q.first, err,
                q.second);
    EXPECT_LE(err, q.second) << q.first;
    EXPECT_GT(err, 1e-6) << q.first;
  }
}

// ModelInfo counts quantized tensors by the bytes loaded (codes + scales + zeros), not as stored.
TEST(QuantizedModelTest, InfoCountsQuantizedBytes) {
  if (!fs::exists(kFixtures / "llama_f32")) GTEST_SKIP() << "fixture llama_f32 is absent";
  uint64_t bytes[3] = {};
  const char* quants[3] = {"none", "int8", "int4"};
  for (int i = 0; i < 3; ++i) {
    ReferenceBackend backend{BackendOptions{}};
    LoadOptions o;
    o.plan = *ParseWeightPlan({.quant = quants[i]});
    auto model = LoadModel((kFixtures / "llama_f32").string(), backend, o);
    ASSERT_TRUE(model.ok()) << model.status().message();
    bytes[i] = (*model)->info().weight_bytes;
    if (i > 0) {
      EXPECT_GT((*model)->info().bytes_by_dtype.count(quants[i]), 0u) << quants[i];
    }
  }
  // f32 weights: int8 groups of 32 take 1 + 2/32 bytes per value, int4 0.5 + 2.5/32.
  EXPECT_LT(bytes[1], bytes[0]);
  EXPECT_LT(bytes[2], bytes[1]);
}

TEST(QuantizedModelTest, RejectsUnknownQuant) {
  if (!fs::exists(kFixtures / "llama_f32")) GTEST_SKIP() << "fixture llama_f32 is absent";
  auto got = Logits("llama_f32", "reference", "int5");
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("int4-g128"), std::string::npos) << got.status().message();
}

}  // namespace
}  // namespace dh
