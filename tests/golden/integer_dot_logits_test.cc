// The integer-dot kernels (backend/cpu/quant_vnni.h: x quantized to int8 per 32 columns) against
// the exact f32-product path (DH_INTEGER_DOT=off) on golden fixtures: full-prompt logits of the
// CPU backend, relative L2 error ||int - exact|| / ||exact||, for every integer kernel this CPU has
// (AVX2, AVX-VNNI, AVX512-VNNI), on weights quantized at load (int8 g32, int4 g32, int4 g128) and
// on the AWQ / GPTQ checkpoints as stored.
//
// Bound: 10 % relative L2. It is empirical, not derived (the per-matmul bound is derived and
// tested in tests/kernels/quant_matmul_test.cc; through a network the errors compound), a guard
// against regressions. The test prints each run's error; bench/README.md ("Fewer bytes per
// weight") has the figures for the current formats (f16 scales, int4 4-bit zero points). The tiny
// random fixtures have flat logits, which inflates relative errors: the embedded model's
// perplexity moves by under 0.1 % (tests/e2e/integer_dot_perplexity_test.cc).
// The test also requires every path to move the logits (> 1e-7), so it cannot pass with the
// integer kernels silently off.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant_vnni.h"
#include "model/sequence_runner.h"

namespace dh {
namespace {

namespace fs = std::filesystem;

constexpr double kBound = 0.10;

struct QuantRun {
  const char* fixture;
  const char* quant;  // LoadOptions::quant ("none": the checkpoint's own int4)
};

const QuantRun kRuns[] = {
    {"ds_v2_lite", "int8"},     {"ds_v2_lite", "int4"}, {"ds_v2_lite", "int4-g128"},
    {"ds_moe", "int4"},         {"qwen2_f32", "int8"},  {"qwen2_f32", "int4"},
    {"qwen2_f32", "int4-g128"}, {"llama_awq", "none"},  {"qwen2_gptq", "none"},
    {"ds_v2_lite_awq", "none"},
};

std::vector<float> PromptLogits(Model& model, Backend& backend, const std::vector<int32_t>& ids) {
  auto runner = SequenceRunner::Create(model, backend, static_cast<int>(ids.size()));
  EXPECT_TRUE(runner.ok());
  if (!runner.ok()) return {};
  auto logits = (*runner)->Feed(ids, /*all_logits=*/true);
  EXPECT_TRUE(logits.ok());
  return logits.ok() ? *logits : std::vector<float>{};
}

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

TEST(IntegerDotLogits, EveryPathCloseToExact) {
  std::vector<cpu::IntegerDotPath> paths;
  for (auto p : {cpu::IntegerDotPath::kAvx2, cpu::IntegerDotPath::kAvxVnni,
                 cpu::IntegerDotPath::kVnni512}) {
    if (cpu::IntegerDotPathAvailable(p)) paths.push_back(p);
  }
  if (paths.empty()) GTEST_SKIP() << "CPU has no integer-dot kernel";
  const fs::path root = fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures";
  BackendOptions o;
  o.num_threads = 2;
  o.release_rows = false;  // the model's weights are read by every kernel below, after the load
  CpuBackend backend(o);
  double worst = 0;
  for (const QuantRun& run : kRuns) {
    const fs::path dir = root / run.fixture;
    ASSERT_TRUE(fs::exists(dir / "expected.json")) << dir;
    std::ifstream in(dir / "expected.json");
    const auto expected = nlohmann::json::parse(in);
    const auto ids = expected["input_ids"].get<std::vector<int32_t>>();
    LoadOptions lo;
    auto plan = ParseWeightPlan({.quant = run.quant});
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    lo.plan = *plan;
    auto model = LoadModel(dir.string(), backend, lo);
    ASSERT_TRUE(model.ok()) << run.fixture << ": " << model.status().message();
    cpu::SetIntegerDotForTest(cpu::IntegerDot::kOff);
    const std::vector<float> exact = PromptLogits(**model, backend, ids);
    cpu::SetIntegerDotForTest(cpu::IntegerDot::kOn);
    for (cpu::IntegerDotPath p : paths) {
      cpu::SetIntegerDotPathForTest(p);
      const std::vector<float> got = PromptLogits(**model, backend, ids);
      ASSERT_EQ(got.size(), exact.size());
      const double rel = RelL2(got, exact);
      worst = std::max(worst, rel);
      std::printf("%-15s %-10s %-13s relative L2 %.4f %%\n", run.fixture, run.quant,
                  cpu::IntegerDotPathName(p), 100 * rel);
      EXPECT_LE(rel, kBound) << run.fixture << " " << run.quant << " "
                             << cpu::IntegerDotPathName(p);
      EXPECT_GT(rel, 1e-7) << run.fixture << " " << run.quant << " "
                           << cpu::IntegerDotPathName(p) << ": logits unchanged";
    }
    cpu::SetIntegerDotPathForTest(cpu::IntegerDotPath::kNone);
    cpu::SetIntegerDotForTest(cpu::IntegerDot::kAuto);
  }
  std::printf("worst relative L2 %.4f %% (bound %.1f %%)\n", 100 * worst, 100 * kBound);
}

}  // namespace
}  // namespace dh
