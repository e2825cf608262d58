// Speculative decoding with a real MTP layer (docs/mtp.md) on tests/golden/fixtures/ds_v3_mtp, cpu
// backend, f32 activations and products: greedy output of a batch of sequences with K = 1, 2, 3
// drafts per step equals the output without drafts, the KV pool ends with every block free, and
// the counters add up. Two drafters:
//   - the checkpoint's own MTP layer (random weights: its drafts are mostly rejected);
//   - the same MTP forward (its cache and hidden rows are used as in production) with its logits
//     steered towards the known greedy continuation, wrong on a fixed pattern, so most drafts are
//     accepted and one verification step mixes sequences with different accepted counts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "model/model.h"

namespace dh {
namespace {

namespace fs = std::filesystem;

const fs::path kCase = fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures/ds_v3_mtp";

// Delegates to the loaded model; ForwardMtp runs the real MTP layer, then (when an oracle is
// set) raises the logit of the token the oracle names for (position, token) by 1000, unless
// (position + token) % 4 == 0, where it raises the oracle's token + 1 (a wrong draft).
class SteeredMtpModel : public Model {
 public:
  explicit SteeredMtpModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  KvCacheSpec kv_spec() const override { return inner_->kv_spec(); }
  const ModelInfo& info() const override { return inner_->info(); }
  Status Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) override {
    return inner_->Forward(batch, kv, logits);
  }
  bool has_mtp() const override { return inner_->has_mtp(); }
  std::span<const float> last_hidden() const override { return inner_->last_hidden(); }
  Status ForwardMtp(const Batch& batch, KvStorage& kv, std::span<const float> hidden,
                    std::vector<float>* logits) override {
    DH_RETURN_IF_ERROR(inner_->ForwardMtp(batch, kv, hidden, logits));
    if (oracle_.empty()) return Status::Ok();
    const size_t vocab = static_cast<size_t>(config().vocab_size);
    for (size_t r = 0; r < batch.logits_rows.size(); ++r) {
      const int t = batch.logits_rows[r];
      const int pos = batch.positions[t];
      const int32_t token = batch.token_ids[t];
      auto it = oracle_.find({pos, token});
      if (it == oracle_.end()) continue;
      const int32_t draft = (pos + token) % 4 == 0 ? (it->second + 1) % static_cast<int32_t>(vocab)
                                                    : it->second;
      (*logits)[r * vocab + static_cast<size_t>(draft)] += 1000.0f;
    }
    return Status::Ok();
  }
  // (position i, t_{i+1}) -> t_{i+2} along the given sequences.
  void SetOracle(const std::vector<std::vector<int32_t>>& sequences) {
    for (const auto& s : sequences) {
      for (size_t i = 0; i + 2 < s.size(); ++i) oracle_[{static_cast<int>(i), s[i + 1]}] = s[i + 2];
    }
  }

 private:
  std::unique_ptr<Model> inner_;
  std::map<std::pair<int, int32_t>, int32_t> oracle_;
};

// Prompts of 18..23 tokens sharing their first 16-token block (a prefix-cache hit for all but
// the first scheduled), each with its own tail.
std::vector<std::vector<int32_t>> Prompts() {
  std::ifstream in(kCase / "expected.json");
  auto base = nlohmann::json::parse(in)["input_ids"].get<std::vector<int32_t>>();
  base.insert(base.end(), base.begin(), base.end());
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p(base.begin(), base.begin() + 17 + i);
    p.push_back(static_cast<int32_t>(30 + 37 * i));
    out.push_back(p);
  }
  return out;
}

struct GenRun {
  std::vector<std::vector<int32_t>> outputs;
  EngineStats stats;
};

GenRun Generate(int k, const std::vector<std::vector<int32_t>>* oracle) {
  CpuBackend backend(BackendOptions{.num_threads = 2});
  LoadOptions lo;
  lo.load_mtp = true;
  auto loaded = LoadModel(kCase.string(), backend, lo);
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!loaded.ok()) return {};
  auto model = std::make_unique<SteeredMtpModel>(std::move(*loaded));
  if (oracle) model->SetOracle(*oracle);
  EngineOptions eo;
  eo.num_kv_blocks = 64;
  eo.max_num_seqs = 8;
  eo.num_speculative_tokens = k;
  Engine engine(eo, std::move(model), backend, nullptr);
  EXPECT_TRUE(engine.Start().ok());
  std::vector<std::shared_ptr<RequestHandle>> handles;
  RequestOutput first;
  const auto prompts = Prompts();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt_token_ids = prompts[i];
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 20 + static_cast<int>(i);
    r.sampling.ignore_eos = true;
    auto h = engine.Submit(std::move(r));
    EXPECT_TRUE(h.ok());
    if (!h.ok()) return {};
    handles.push_back(*h);
    // The first one alone, so that its full prefix block is cached for the batch of the rest.
    if (i == 0) first = handles[0]->WaitFinished();
  }
  GenRun run;
  for (auto& h : handles) {
    RequestOutput o = run.outputs.empty() ? first : h->WaitFinished();
    EXPECT_TRUE(o.error.ok()) << o.error.message();
    std::vector<int32_t> full = prompts[run.outputs.size()];
    full.insert(full.end(), o.token_ids.begin(), o.token_ids.end());
    run.outputs.push_back(full);
  }
  engine.Drain(std::chrono::seconds(5));
  for (int i = 0; i < 100; ++i) {
    run.stats = engine.GetStats();
    if (run.stats.kv_blocks_free == run.stats.kv_blocks_total) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return run;
}

TEST(SpecDecodeGolden, GreedyWithMtpDraftsEqualsPlainDecoding) {
  // In the default DH_BF16_DOT mode: where bf16 weights take x rounded to bf16 (AVX512-BF16
  // CPUs), every matmul rounds it whatever its row count, so a verification chunk's rows get the
  // products of single-token steps.
  const GenRun plain = Generate(0, nullptr);
  ASSERT_EQ(plain.outputs.size(), Prompts().size());
  EXPECT_EQ(plain.stats.spec_draft_tokens, 0);
  for (bool steered : {false, true}) {
    for (int k = 1; k <= 3; ++k) {
      const GenRun spec = Generate(k, steered ? &plain.outputs : nullptr);
      EXPECT_EQ(spec.outputs, plain.outputs) << "K = " << k << (steered ? ", steered" : "");
      const EngineStats& s = spec.stats;
      EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
      EXPECT_GT(s.prefix_cache_hits, 0);
      EXPECT_GT(s.spec_draft_tokens, 0);
      int64_t sum = 0;
      for (int64_t a : s.spec_accepted_per_pos) sum += a;
      EXPECT_EQ(sum, s.spec_accepted_tokens);
      if (steered) {
        EXPECT_GT(s.spec_accepted_tokens, s.spec_draft_tokens / 3) << "K = " << k;
        EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens) << "K = " << k;
        EXPECT_LT(s.num_steps, plain.stats.num_steps) << "K = " << k;
      }
      std::printf("K %d%s: %lld drafted, %lld accepted, %lld steps (plain %lld)\n", k,
                  steered ? " steered" : "", static_cast<long long>(s.spec_draft_tokens),
                  static_cast<long long>(s.spec_accepted_tokens), static_cast<long long>(s.num_steps),
                  static_cast<long long>(plain.stats.num_steps));
    }
  }
}

}  // namespace
}  // namespace dh
