// Models loaded under precision policies (LoadOptions::policy) on golden fixtures: the same model
// code runs under every policy on both backends, logits stay close to the unquantized model's,
// every class lands in the format the policy names (ModelInfo.bytes_by_dtype), FP8 checkpoints
// keep their own blocks under fp8, and bad policies fail the load with the parser's message.
//
// Measure: relative RMS error of the full-prompt logits against the same fixture loaded as
// stored, on the same backend. The fixtures' weights are uniform random (the worst case for a
// quantizer, see quantized_model_test.cc). Measured (ds_v3 / llama_f32, reference; cpu within
// +0.005, its int8/int4 GEMV quantizes activations): static:bf16 0.005 / 0.004, static:int8
// 0.015 / 0.012, static:fp8 0.156 / 0.070 (3 mantissa bits: per weight ~2.5 % RMS, between int8
// and int4), static:int4 0.211 / 0.162, dynamic 0.041 / 0.012, the issue's custom 0.040 / 0.006,
// the layers override 0.120 / 0.122. Bounds: bf16 0.01, int8 0.03, fp8 0.25, int4 0.30, mixed
// 0.20 / 0.30.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/reference/reference_backend.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/model.h"
#include "model/sequence_runner.h"
#include "weights/precision_policy.h"
#include "weights/weight_plan.h"
#include "unit/io/io_test_util.h"

namespace dh {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures";
const std::vector<int32_t> kPrompt = {73, 99, 151, 176, 26, 250, 230, 84, 58, 150, 197, 139};
constexpr const char* kIssuePolicy =
    "custom:attn=bf16,experts=int4,shared=int8,gate=f32,lm_head=int8";

std::unique_ptr<Backend> MakeBackend(const std::string& name) {
  BackendOptions o;
  o.num_threads = 2;
  if (name == "cpu") return std::make_unique<CpuBackend>(o);
  return std::make_unique<ReferenceBackend>(o);
}

struct Loaded {
  std::vector<float> logits;
  ModelInfo info;
};

Result<Loaded> Load(const fs::path& fixture, const std::string& backend_name,
                    const std::string& policy, const std::string& mla_mode = "auto") {
  auto backend = MakeBackend(backend_name);
  LoadOptions o;
  DH_ASSIGN_OR_RETURN(o.plan, ParseWeightPlan({.policy = policy}));
  DH_ASSIGN_OR_RETURN(o.plan.mla_mode, ParseMlaMode(mla_mode));
  DH_ASSIGN_OR_RETURN(auto model, LoadModel((kFixtures / fixture).string(), *backend, o));
  DH_ASSIGN_OR_RETURN(auto runner,
                      SequenceRunner::Create(*model, *backend, static_cast<int>(kPrompt.size())));
  Loaded l;
  DH_ASSIGN_OR_RETURN(l.logits, runner->Feed(kPrompt, /*all_logits=*/true));
  l.info = model->info();
  return l;
}

double RelativeRmsError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    den += want[i] * static_cast<double>(want[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(PolicyModelTest, EveryPolicyRunsTheSameModelCode) {
  const struct {
    const char* policy;
    double bound;
    bool changes;  // whether the logits must differ from the stored weights' (ds_v3)
  } kPolicies[] = {
      {"static:bf16", 0.01, true},
      {"static:int8", 0.03, true},
      {"static:fp8", 0.25, true},
      {"static:int4", 0.30, true},
      {"dynamic", 0.20, true},
      {kIssuePolicy, 0.20, true},
      {"custom:default=int4,layers.0=bf16,layers.1.mla=int8,gate=f16", 0.30, true},
      {"static:auto", 0.0, false},
  };
  // A DeepSeek-V3 (MLA, MoE with shared experts, router) and a Llama (GQA, dense MLP) fixture.
  for (const char* fixture : {"ds_v3", "llama_f32"}) {
    if (!fs::exists(kFixtures / fixture)) GTEST_SKIP() << "fixture " << fixture << " is absent";
    for (const char* backend : {"reference", "cpu"}) {
      auto stored = Load(fixture, backend, "");
      ASSERT_TRUE(stored.ok()) << stored.status().message();
      for (const auto& p : kPolicies) {
        auto got = Load(fixture, backend, p.policy);
        ASSERT_TRUE(got.ok()) << fixture << " " << p.policy << ": " << got.status().message();
        ASSERT_EQ(got->logits.size(), stored->logits.size());
        const double err = RelativeRmsError(got->logits, stored->logits);
        std::printf("%s %s %s: relative RMS logit error %.5f (bound %.2f)\n", fixture, backend,
                    p.policy, err, p.bound);
        EXPECT_LE(err, p.bound) << fixture << " " << backend << " " << p.policy;
        if (p.changes && std::string(fixture) == "ds_v3") {
          EXPECT_GT(err, 1e-6) << p.policy << ": logits unchanged, the policy did nothing";
        }
      }
    }
  }
}

// The MLA absorbed copies of kv_b_proj take their class's dense dtype (bf16 when quantized):
// naive and absorbed attention still agree under a policy.
TEST(PolicyModelTest, MlaModesAgreeUnderPolicy) {
  if (!fs::exists(kFixtures / "ds_v3")) GTEST_SKIP() << "fixture ds_v3 is absent";
  for (const char* policy : {"custom:mla=f16", "custom:mla=int8", "dynamic"}) {
    auto naive = Load("ds_v3", "reference", policy, "naive");
    auto absorbed = Load("ds_v3", "reference", policy, "absorbed");
    ASSERT_TRUE(naive.ok() && absorbed.ok()) << policy;
    // f16/bf16 absorbed copies vs the int8 (or f16) kv_b_proj of the naive path.
    EXPECT_LE(RelativeRmsError(absorbed->logits, naive->logits), 0.02) << policy;
  }
}

// Bytes per format: each class is loaded in the format the policy names.
TEST(PolicyModelTest, InfoCountsBytesPerFormat) {
  if (!fs::exists(kFixtures / "ds_v3")) GTEST_SKIP() << "fixture ds_v3 is absent";
  auto got = Load("ds_v3", "reference", kIssuePolicy);
  ASSERT_TRUE(got.ok()) << got.status().message();
  auto ckpt = Checkpoint::Open((kFixtures / "ds_v3").string());
  ASSERT_TRUE(ckpt.ok());
  auto policy = PrecisionPolicy::Parse(kIssuePolicy);
  ASSERT_TRUE(policy.ok());
  std::map<std::string, int64_t> want;
  for (const TensorInfo* t : ckpt->tensors()) {
    const bool matrix = t->shape.size() == 2;
    const int64_t rows = t->shape[0], cols = matrix ? t->shape[1] : 1;
    const std::string format = matrix ? policy->FormatFor(t->name).Name() : "auto";
    const int64_t groups = (cols + 31) / 32;
    if (format == "int4") {  // codes, f16 scales, 4-bit zero points
      want["int4"] += rows * ((cols + 1) / 2) + rows * groups * 2 + rows * ((groups + 1) / 2);
    } else if (format == "int8") {  // codes, f16 scales
      want["int8"] += rows * cols + rows * groups * 2;
    } else if (format == "bf16") {
      want["bf16"] += rows * cols * 2;
    } else {
      want["f32"] += static_cast<int64_t>(t->nbytes);  // stored f32, and the f32 router
    }
  }
  EXPECT_EQ(got->info.bytes_by_dtype, want);
  int64_t total = 0;
  for (const auto& [k, v] : want) total += v;
  EXPECT_EQ(got->info.weight_bytes, static_cast<uint64_t>(total));
}

// fp8 keeps an FP8 checkpoint's own blocks (the same logits as loading it as stored; its bf16
// lm_head is quantized only when the policy names it); other policies dequantize it once.
TEST(PolicyModelTest, Fp8CheckpointUnderPolicies) {
  if (!fs::exists(kFixtures / "ds_v3_fp8")) GTEST_SKIP() << "fixture ds_v3_fp8 is absent";
  auto stored = Load("ds_v3_fp8", "cpu", "");
  auto fp8 = Load("ds_v3_fp8", "cpu", "custom:default=fp8,lm_head=auto");
  ASSERT_TRUE(stored.ok() && fp8.ok()) << fp8.status().message();
  EXPECT_EQ(fp8->logits, stored->logits);
  EXPECT_EQ(fp8->info.bytes_by_dtype, stored->info.bytes_by_dtype);
  EXPECT_GT(fp8->info.bytes_by_dtype.count("f8e4m3"), 0u);
  auto all = Load("ds_v3_fp8", "cpu", "static:fp8");  // + lm_head, quantized from bf16
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_GT(all->info.bytes_by_dtype.count("fp8-block"), 0u);
  EXPECT_GT(all->info.bytes_by_dtype.count("f8e4m3"), 0u);
  EXPECT_LE(RelativeRmsError(all->logits, stored->logits), 0.10);
  const struct {
    const char* policy;
    double bound;
    bool fp8_left;  // kIssuePolicy leaves the dense MLP as stored
  } kPolicies[] = {
      {"static:bf16", 0.02, false}, {"dynamic", 0.30, false}, {kIssuePolicy, 0.30, true}};
  for (const auto& p : kPolicies) {
    auto got = Load("ds_v3_fp8", "cpu", p.policy);
    ASSERT_TRUE(got.ok()) << p.policy << ": " << got.status().message();
    const double err = RelativeRmsError(got->logits, stored->logits);
    std::printf("ds_v3_fp8 cpu %s: relative RMS logit error %.5f\n", p.policy, err);
    EXPECT_LE(err, p.bound) << p.policy;
    EXPECT_GT(err, 1e-6) << p.policy;
    EXPECT_EQ(got->info.bytes_by_dtype.count("f8e4m3"), p.fp8_left ? 1u : 0u) << p.policy;
  }
}

// Where both backends compute in f32 (dense and fp8 weights), a policy gives the same logits.
TEST(PolicyModelTest, BackendsAgreeOnFp8Policy) {
  if (!fs::exists(kFixtures / "ds_v3")) GTEST_SKIP() << "fixture ds_v3 is absent";
  for (const char* policy : {"static:fp8", "custom:default=bf16,experts=fp8,gate=f16"}) {
    auto ref = Load("ds_v3", "reference", policy);
    Result<Loaded> cpu = [&] {
      // bf16 weights in f32 products, as the reference
      const cpu::ScopedBf16DotForTest exact_x(cpu::Bf16Dot::kOff);
      return Load("ds_v3", "cpu", policy);
    }();
    ASSERT_TRUE(ref.ok() && cpu.ok()) << policy;
    EXPECT_LE(RelativeRmsError(cpu->logits, ref->logits), 1e-4) << policy;
  }
}

// A tied table whose lm_head the policy quantizes: the embedding stays dense for the lookups and
// lm_head is a quantized copy. The logits equal those of the same checkpoint untied (lm_head
// stored as a copy of the table) under the same policy, to the bit; the copy's bytes count once
// more, and a decode step's bytes leave the embedding table out.
TEST(PolicyModelTest, TiedTableGetsAQuantizedLmHeadCopy) {
  const fs::path tied = kFixtures / "llama_bf16_tied";
  if (!fs::exists(tied)) GTEST_SKIP() << "fixture llama_bf16_tied is absent";
  testing::TempDir untied_dir;
  {
    auto ckpt = Checkpoint::Open(tied.string());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const TensorInfo* t : ckpt->tensors()) tensors.emplace_back(t->name, t->View());
    tensors.emplace_back("lm_head.weight", ckpt->Find("model.embed_tokens.weight")->View());
    ASSERT_TRUE(WriteSafetensors(untied_dir.File("model.safetensors"), tensors).ok());
    std::ifstream in(tied / "config.json");
    std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string from = "\"tie_word_embeddings\": true";
    ASSERT_NE(config.find(from), std::string::npos);
    config.replace(config.find(from), from.size(), "\"tie_word_embeddings\": false");
    testing::WriteFile(untied_dir.File("config.json"), config);
  }
  const int64_t vocab = 384, hidden = 64, table_bytes = vocab * hidden * 2;
  for (const char* backend : {"reference", "cpu"}) {
    auto stored = Load("llama_bf16_tied", backend, "");
    ASSERT_TRUE(stored.ok()) << stored.status().message();
    EXPECT_EQ(stored->info.active_weight_bytes_per_token, stored->info.weight_bytes);
    for (const char* policy : {"custom:lm_head=int8", "custom:lm_head=int4"}) {
      SCOPED_TRACE(std::string(backend) + " " + policy);
      auto got = Load("llama_bf16_tied", backend, policy);
      ASSERT_TRUE(got.ok()) << got.status().message();
      auto untied = Load(untied_dir.path(), backend, policy);
      ASSERT_TRUE(untied.ok()) << untied.status().message();
      EXPECT_EQ(got->logits, untied->logits);
      const double err = RelativeRmsError(got->logits, stored->logits);
      EXPECT_GT(err, 1e-6) << "lm_head was not quantized";
      EXPECT_LE(err, std::string(policy).find("int8") != std::string::npos ? 0.03 : 0.30);
      // The embedding is still counted in bf16; the copy adds its own format's bytes.
      const bool int8 = std::string(policy).find("int8") != std::string::npos;
      const int64_t copy = int8 ? vocab * hidden + vocab * 2 * 2
                                : vocab * hidden / 2 + vocab * 2 * 2 + vocab * 1;
      auto want = stored->info.bytes_by_dtype;
      want[int8 ? "int8" : "int4"] += copy;
      EXPECT_EQ(got->info.bytes_by_dtype, want);
      EXPECT_EQ(got->info.weight_bytes, stored->info.weight_bytes + copy);
      EXPECT_EQ(got->info.active_weight_bytes_per_token, got->info.weight_bytes - table_bytes);
      EXPECT_EQ(got->info.num_parameters, stored->info.num_parameters);  // a copy, not more
      EXPECT_EQ(got->info.active_parameters_per_token, stored->info.active_parameters_per_token);
      EXPECT_EQ(got->info.active_parameters_per_token, untied->info.active_parameters_per_token);
      EXPECT_EQ(got->info.active_weight_bytes_per_token,
                untied->info.active_weight_bytes_per_token);
    }
  }
}

TEST(PolicyModelTest, BadPolicyFailsTheLoad) {
  if (!fs::exists(kFixtures / "llama_f32")) GTEST_SKIP() << "fixture llama_f32 is absent";
  auto got = Load("llama_f32", "reference", "custom:embed=int4");
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("embed=int4: the embedding table needs a dense format"),
            std::string::npos)
      << got.status().message();
  auto both = ParseWeightPlan({.quant = "int8", .policy = "dynamic"});
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("are both given"), std::string::npos);
}

}  // namespace
}  // namespace dh
