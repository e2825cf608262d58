// The multi-token-prediction layer (docs/mtp.md) against the independent PyTorch reference
// (pytorch/reference/make_mtp_golden.py: mtp_logits.npy, row i = MTP(h_i, t_{i+1}) at position i,
// predicting t_{i+2}), on the cpu and reference backends, for two checkpoints: the tiny random
// tests/golden/fixtures/ds_v3_mtp, and the embedded trained model models/shakespeare-v3 (its golden
// data, over BOS + 40 validation ids, in tests/golden/fixtures/shakespeare_mtp):
//   - loading it (LoadOptions::load_mtp) leaves the main model's logits as they were;
//   - MTP logits over the prompt within 2e-2 of the logit scale (bf16 weights, as golden_test);
//   - MTP decoding token by token over its own cache layer equals the one-step forward (1e-4).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/reference/reference_backend.h"
#include "io/npy.h"
#include "model/model.h"

namespace dh {
namespace {

namespace fs = std::filesystem;

const fs::path kCase = fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures/ds_v3_mtp";

struct MtpCase {
  std::string name;
  fs::path model;  // the checkpoint
  fs::path data;   // expected.json (input_ids), logits.npy, mtp_logits.npy
};

MtpCase Case(const std::string& name) {
  if (name == "shakespeare_mtp") {
    return {name, fs::path(DH_SOURCE_DIR) / "models/shakespeare-v3",
            fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures/shakespeare_mtp"};
  }
  return {name, kCase, kCase};
}
constexpr int kBlockSize = 16;

float MaxAbsDiff(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::unique_ptr<Backend> MakeBackend(const std::string& name) {
  BackendOptions o;
  o.num_threads = 2;
  if (name == "cpu") return std::make_unique<CpuBackend>(o);
  return std::make_unique<ReferenceBackend>(o);
}

// (case, backend)
class MtpGolden : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(MtpGolden, MatchesReference) {
  // f32 products, as the PyTorch reference: the bf16 dot product (which rounds x to bf16) would
  // make a multi-token MTP step differ from the same tokens one at a time.
  const cpu::ScopedBf16DotForTest exact_x(cpu::Bf16Dot::kOff);
  const MtpCase c = Case(std::get<0>(GetParam()));
  const std::string backend_name = std::get<1>(GetParam());
  std::ifstream in(c.data / "expected.json");
  const auto expected = nlohmann::json::parse(in);
  const auto prompt = expected["input_ids"].get<std::vector<int32_t>>();
  const int T = static_cast<int>(prompt.size());
  auto main_ref = ReadNpy((c.data / "logits.npy").string());
  auto mtp_ref = ReadNpy((c.data / "mtp_logits.npy").string());
  ASSERT_TRUE(main_ref.ok() && mtp_ref.ok());

  auto backend = MakeBackend(backend_name);
  LoadOptions lo;
  lo.load_mtp = true;
  auto model = LoadModel(c.model.string(), *backend, lo);
  ASSERT_TRUE(model.ok()) << model.status().message();
  Model& m = **model;
  ASSERT_TRUE(m.has_mtp());
  const int64_t vocab = m.config().vocab_size, H = m.config().hidden_size;
  ASSERT_EQ(m.kv_spec().num_layers, m.config().num_hidden_layers + 1);
  ASSERT_EQ(mtp_ref->shape, (std::vector<int64_t>{T - 1, vocab}));

  const int blocks = (T + kBlockSize - 1) / kBlockSize;
  auto kv = KvStorage::Allocate(*backend, m.kv_spec(), blocks, kBlockSize);
  ASSERT_TRUE(kv.ok());
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);

  // Main model over the prompt: logits as golden_test checks them, and h_i of every position.
  Batch main;
  main.AddSequence(prompt, 0, table, kBlockSize, /*all_logits=*/true);
  std::vector<float> logits;
  ASSERT_TRUE(m.Forward(main, **kv, &logits).ok());
  std::span<const float> want_main(main_ref->as<float>(), static_cast<size_t>(T * vocab));
  float scale = 0;
  for (float v : want_main) scale = std::max(scale, std::fabs(v));
  EXPECT_LE(MaxAbsDiff(logits, want_main), 2e-2f * scale) << "main logits with MTP loaded";
  const std::vector<float> hidden(m.last_hidden().begin(), m.last_hidden().end());
  ASSERT_EQ(hidden.size(), static_cast<size_t>(T * H));

  // MTP over positions 0 .. T-2 in one step: token t_{i+1} with h_i.
  Batch mtp;
  mtp.AddSequence(std::span(prompt).subspan(1), 0, table, kBlockSize, /*all_logits=*/true);
  std::vector<float> mtp_logits;
  Status st = m.ForwardMtp(mtp, **kv, std::span(hidden).first((T - 1) * H), &mtp_logits);
  ASSERT_TRUE(st.ok()) << st.message();
  std::span<const float> want_mtp(mtp_ref->as<float>(), static_cast<size_t>((T - 1) * vocab));
  float mtp_scale = 0;
  for (float v : want_mtp) mtp_scale = std::max(mtp_scale, std::fabs(v));
  const float diff = MaxAbsDiff(mtp_logits, want_mtp);
  EXPECT_LE(diff, 2e-2f * mtp_scale) << "MTP logits vs reference (scale " << mtp_scale << ")";
  // The draft token (argmax) agrees wherever the reference's top-2 gap exceeds twice that diff.
  int compared = 0;
  for (int i = 0; i + 1 < T; ++i) {
    const auto want = want_mtp.subspan(static_cast<size_t>(i) * vocab, vocab);
    const auto got = std::span<const float>(mtp_logits).subspan(static_cast<size_t>(i) * vocab, vocab);
    const int64_t best = std::max_element(want.begin(), want.end()) - want.begin();
    float second = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v)
      if (v != best) second = std::max(second, want[v]);
    if (want[best] - second <= 2 * diff) continue;
    ++compared;
    EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(), best) << "row " << i;
  }
  EXPECT_GT(compared, 0);
  std::printf("%s %s: MTP max |logit diff| %.3g (scale %.3f)\n", c.name.c_str(),
              backend_name.c_str(), diff, mtp_scale);

  // One token at a time through the MTP layer's cache.
  for (int i = 0; i + 1 < T; ++i) {
    Batch step;
    step.AddSequence(std::span(&prompt[i + 1], 1), i, std::span(table).first(i / kBlockSize + 1),
                     kBlockSize, /*all_logits=*/false);
    std::vector<float> one;
    ASSERT_TRUE(m.ForwardMtp(step, **kv, std::span(hidden).subspan(i * H, H), &one).ok());
    EXPECT_LE(MaxAbsDiff(one, std::span(mtp_logits).subspan(i * vocab, vocab)), 1e-4f * mtp_scale)
        << "incremental MTP position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, MtpGolden,
                         ::testing::Combine(::testing::Values("ds_v3_mtp", "shakespeare_mtp"),
                                            ::testing::Values("cpu", "reference")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

TEST(MtpLoad, SkippedUnlessAskedAndAbsentWithoutMtpLayers) {
  ReferenceBackend backend({});
  auto plain = LoadModel(kCase.string(), backend, LoadOptions{});
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_FALSE((*plain)->has_mtp());
  EXPECT_EQ((*plain)->kv_spec().num_layers, (*plain)->config().num_hidden_layers);
  EXPECT_GT((*plain)->info().skipped_tensors, 0);
  Batch b;
  std::vector<float> logits;
  auto kv = KvStorage::Allocate(backend, (*plain)->kv_spec(), 1, kBlockSize);
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ((*plain)->ForwardMtp(b, **kv, {}, &logits).code(), StatusCode::kUnsupported);
  LoadOptions lo;
  lo.load_mtp = true;
  auto no_layer = LoadModel((fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures/ds_v3").string(),
                            backend, lo);
  ASSERT_TRUE(no_layer.ok()) << no_layer.status().message();
  EXPECT_FALSE((*no_layer)->has_mtp());
}

}  // namespace
}  // namespace dh
