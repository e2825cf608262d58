// Speculative decoding (docs/mtp.md) over the fake model with a fake MTP drafter that is right
// most of the time and wrong on a fixed pattern, so one step mixes sequences with different
// accepted counts:
//   - greedy output with K = 1, 2, 3 drafts equals output without speculation, batched, with
//     prefix caching, chunked prefill and preemption; the pool ends with every block free;
//   - the drafter sees the main model's h_i at position i, then its own hidden row (chained);
//   - sampling: the joint distribution of the first two sampled tokens (the second one goes
//     through draft verification) passes a chi-square test against the exact distribution, and
//     SequenceSampler::SampleWithDraft draws from the target p with top-k/top-p filters;
//   - BlockPool::Truncate (the rollback) keeps the pool consistent;
//   - the engine refuses a bad K or a model without MTP.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "kvcache/block_pool.h"
#include "unit/engine/fake_model.h"

namespace dh {
namespace {

using testing::FakeMode;
using testing::FakeModel;
using testing::NullBackend;
using testing::Prompt;
using testing::SubmitRequest;
using testing::WaitEngineIdle;
using namespace std::chrono_literals;

constexpr int kVocab = 64;

// FakeModel plus an MTP layer of hidden size 1. The main model's hidden row for position i is
// i; the MTP's output hidden row for position i is 1000 + i. The drafter predicts t_{i+2} =
// t_{i+1} + 1 (the kSuccessor main model's favourite) except where (7 i + t_{i+1}) % 3 == 0,
// where it predicts t_{i+1} + 2 (a wrong draft).
class FakeMtpModel : public FakeModel {
 public:
  explicit FakeMtpModel(FakeMode mode) : FakeModel(kVocab, mode) {
    mutable_config().hidden_size = 1;
    mutable_config().num_nextn_predict_layers = 1;
  }
  bool has_mtp() const override { return true; }
  std::span<const float> last_hidden() const override { return hidden_; }

  Status Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) override {
    DH_RETURN_IF_ERROR(FakeModel::Forward(batch, kv, logits));
    hidden_.clear();
    for (int32_t t : batch.logits_rows) hidden_.push_back(static_cast<float>(batch.positions[t]));
    return Status::Ok();
  }

  Status ForwardMtp(const Batch& batch, KvStorage&, std::span<const float> hidden,
                    std::vector<float>* logits) override {
    if (hidden.size() != static_cast<size_t>(batch.num_tokens())) {
      return Internal("{} hidden values for {} tokens", hidden.size(), batch.num_tokens());
    }
    ++mtp_steps_;
    for (int t = 0; t < batch.num_tokens(); ++t) {
      const int pos = batch.positions[t];
      // A catch-up row carries the main model's h_pos; a chained row the MTP's previous row.
      const bool main_h = hidden[t] == static_cast<float>(pos);
      const bool chained_h = hidden[t] == 1000.0f + static_cast<float>(pos - 1);
      if (!main_h && !chained_h) {
        ++bad_hidden_;
      }
    }
    logits->assign(batch.logits_rows.size() * kVocab, 0.0f);
    hidden_.clear();
    for (size_t r = 0; r < batch.logits_rows.size(); ++r) {
      const int t = batch.logits_rows[r];
      const int pos = batch.positions[t];
      const int32_t token = batch.token_ids[t];
      const bool wrong = (7 * pos + token) % 3 == 0;
      (*logits)[r * kVocab + (token + (wrong ? 2 : 1)) % kVocab] = 1.0f;
      hidden_.push_back(1000.0f + static_cast<float>(pos));
    }
    return Status::Ok();
  }

  int bad_hidden() const { return bad_hidden_; }
  int mtp_steps() const { return mtp_steps_; }

 private:
  std::vector<float> hidden_;
  int bad_hidden_ = 0;
  int mtp_steps_ = 0;
};

struct SpecHarness {
  SpecHarness(EngineOptions options, FakeMode mode) {
    auto m = std::make_unique<FakeMtpModel>(mode);
    model = m.get();
    if (options.num_kv_blocks == 0) options.num_kv_blocks = 64;
    engine = std::make_unique<Engine>(options, std::move(m), backend, nullptr);
    Status st = engine->Start();
    EXPECT_TRUE(st.ok()) << st.message();
  }
  std::shared_ptr<RequestHandle> Submit(std::vector<int32_t> prompt, SamplingParams p) {
    return SubmitRequest(*engine, std::move(prompt), std::move(p));
  }
  EngineStats WaitIdle() { return WaitEngineIdle(*engine); }

  NullBackend backend;
  FakeMtpModel* model = nullptr;
  std::unique_ptr<Engine> engine;
};

SamplingParams Greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Runs `n` greedy requests together (prompts of different lengths, some sharing a prefix) and
// returns their outputs and the final stats.
std::pair<std::vector<std::vector<int32_t>>, EngineStats> RunGreedy(EngineOptions options, int n,
                                                                     FakeMode mode) {
  SpecHarness h(options, mode);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt = Prompt(20, 1);  // a shared 16-token block, then its own tail
    const std::vector<int32_t> tail = Prompt(3 + 5 * i, i + 2);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    SamplingParams p = Greedy(25 + 3 * i);
    if (i % 3 == 2) p.min_tokens = 5;  // suppression applies to verified rows too
    handles.push_back(h.Submit(prompt, p));
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& handle : handles) {
    RequestOutput o = handle->WaitFinished();
    EXPECT_TRUE(o.error.ok()) << o.error.message();
    EXPECT_EQ(o.usage.completion_tokens, static_cast<int>(o.token_ids.size()));
    out.push_back(o.token_ids);
  }
  EngineStats s = h.WaitIdle();
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
  EXPECT_EQ(s.kv_blocks_free + s.kv_blocks_used, s.kv_blocks_total);
  EXPECT_EQ(h.model->bad_hidden(), 0);
  return {out, s};
}

TEST(SpecDecodeTest, GreedyOutputEqualsDecodingWithoutDrafts) {
  for (FakeMode mode : {FakeMode::kSuccessor, FakeMode::kContextHash}) {
    EngineOptions base;
    base.max_num_seqs = 8;
    const auto [expected, s0] = RunGreedy(base, 6, mode);
    EXPECT_EQ(s0.spec_draft_tokens, 0);
    for (int k = 1; k <= 3; ++k) {
      EngineOptions o = base;
      o.num_speculative_tokens = k;
      const auto [got, s] = RunGreedy(o, 6, mode);
      EXPECT_EQ(got, expected) << "K = " << k;
      EXPECT_GT(s.spec_draft_tokens, 0);
      ASSERT_EQ(s.spec_accepted_per_pos.size(), static_cast<size_t>(k));
      int64_t sum = 0;
      for (int64_t a : s.spec_accepted_per_pos) sum += a;
      EXPECT_EQ(sum, s.spec_accepted_tokens);
      if (mode == FakeMode::kSuccessor) {
        // Mostly right, sometimes wrong: both full and partial acceptance happen.
        EXPECT_GT(s.spec_accepted_tokens, s.spec_draft_tokens / 3) << "K = " << k;
        EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens) << "K = " << k;
        // Acceptance can only fall with the position.
        for (int j = 1; j < k; ++j) {
          EXPECT_LE(s.spec_accepted_per_pos[j], s.spec_accepted_per_pos[j - 1]);
        }
      }
      // Fewer forward steps than tokens: several tokens per step.
      if (mode == FakeMode::kSuccessor) {
        EXPECT_LT(s.num_steps, s0.num_steps);
      }
    }
  }
}

TEST(SpecDecodeTest, GreedyExactUnderTightBudgetAndPreemption) {
  EngineOptions base;
  base.max_num_seqs = 8;
  base.max_num_batched_tokens = 24;  // drafts get dropped when a step cannot take them whole
  base.num_kv_blocks = 14;           // preemption: drafts and their slots are given back
  const auto [expected, s0] = RunGreedy(base, 6, FakeMode::kSuccessor);
  for (int k : {1, 3}) {
    EngineOptions o = base;
    o.num_speculative_tokens = k;
    const auto [got, s] = RunGreedy(o, 6, FakeMode::kSuccessor);
    EXPECT_EQ(got, expected) << "K = " << k;
    EXPECT_GT(s.spec_accepted_tokens, 0);
    EXPECT_GT(s.num_preemptions, 0);
  }
}

TEST(SpecDecodeTest, StopTokenInsideAcceptedDraftsEndsThere) {
  // kSuccessor counts up: a stop id reached through accepted drafts must end the output there,
  // and max_tokens must hold exactly.
  for (int k : {0, 2, 3}) {
    EngineOptions o;
    o.num_speculative_tokens = k;
    SpecHarness h(o, FakeMode::kSuccessor);
    SamplingParams stop = Greedy(30);
    stop.stop_token_ids = {20};
    auto a = h.Submit({10, 11, 12}, stop)->WaitFinished();
    EXPECT_EQ(a.token_ids, (std::vector<int32_t>{13, 14, 15, 16, 17, 18, 19, 20})) << k;
    EXPECT_EQ(a.finish_reason, FinishReason::kStop);
    auto b = h.Submit({40, 41}, Greedy(7))->WaitFinished();
    EXPECT_EQ(b.token_ids.size(), 7u) << k;
    EXPECT_EQ(b.finish_reason, FinishReason::kLength);
    EngineStats s = h.WaitIdle();
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
  }
}

TEST(SpecDecodeTest, RequestsThatCannotBeVerifiedDecodeWithoutDrafts) {
  EngineOptions o;
  o.num_speculative_tokens = 2;
  SpecHarness h(o, FakeMode::kSuccessor);
  SamplingParams p = Greedy(10);
  p.logprobs = 2;  // logprobs: no drafts (documented fallback)
  auto out = h.Submit({1, 2, 3}, p)->WaitFinished();
  EXPECT_EQ(out.token_ids.size(), 10u);
  EXPECT_EQ(out.logprobs.size(), 10u);
  EXPECT_EQ(h.engine->GetStats().spec_draft_tokens, 0);
}

TEST(SpecDecodeTest, BadOptionsAreRefused) {
  for (int k : {-1, 9}) {
    EngineOptions o;
    o.num_kv_blocks = 8;
    o.num_speculative_tokens = k;
    NullBackend backend;
    Engine e(o, std::make_unique<FakeMtpModel>(FakeMode::kSuccessor), backend, nullptr);
    Status st = e.Start();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("--num-speculative-tokens"), std::string::npos) << st.message();
  }
  EngineOptions o;
  o.num_kv_blocks = 8;
  o.num_speculative_tokens = 1;
  NullBackend backend;
  Engine e(o, std::make_unique<FakeModel>(kVocab, FakeMode::kSuccessor), backend, nullptr);
  Status st = e.Start();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("no MTP layer"), std::string::npos) << st.message();
}

TEST(SpecDecodeTest, TruncateGivesBackDraftSlotsAndKeepsThePoolConsistent) {
  BlockPool pool(8, 4, /*enable_prefix_caching=*/true, /*hash_key=*/1);
  Scheduler scheduler(SchedulerConfig{4, 64}, pool);
  Sequence seq;
  seq.token_ids = {1, 2, 3, 4, 5, 6, 7};
  seq.num_prompt_tokens = 7;
  scheduler.AddWaiting(&seq);
  SchedulerOutput out = scheduler.Schedule();
  ASSERT_EQ(out.chunks.size(), 1u);
  scheduler.CompleteStep(out);
  seq.token_ids.push_back(8);  // sampled: 8 tokens, 7 computed, 1 block hashed
  // Drafts with their slots reserved (positions 7 .. 7 + 3), as the engine's drafter does.
  seq.token_ids.insert(seq.token_ids.end(), {9, 10, 11});
  seq.num_draft_tokens = 3;
  ASSERT_TRUE(pool.Reserve(seq.blocks, seq.num_tokens() - seq.blocks.num_slots));
  EXPECT_EQ(seq.blocks.block_ids.size(), 3u);
  ASSERT_TRUE(pool.CheckConsistency().ok());
  // One draft accepted: 9 tokens kept, slots past them given back.
  pool.Truncate(seq.blocks, 9);
  EXPECT_EQ(seq.blocks.num_slots, 9);
  EXPECT_EQ(seq.blocks.block_ids.size(), 3u);
  pool.Truncate(seq.blocks, 8);
  EXPECT_EQ(seq.blocks.block_ids.size(), 2u);
  Status st = pool.CheckConsistency();
  EXPECT_TRUE(st.ok()) << st.message();
  BlockPoolStats s = pool.stats();
  EXPECT_EQ(s.free + s.used, s.total);
  EXPECT_EQ(s.used, 2);
  EXPECT_EQ(s.wasted_slots, 0);
  // The scheduler drops drafts it cannot schedule whole, and on preemption.
  seq.token_ids.resize(8);
  seq.num_draft_tokens = 0;
  scheduler.Remove(&seq);
  EXPECT_TRUE(pool.CheckConsistency().ok());
  EXPECT_EQ(pool.stats().used, 0);
}

// ---- sampling ------------------------------------------------------------------------------

// Upper chi-square quantile for `df` degrees of freedom at a false-failure probability of 1e-3
// (Wilson-Hilferty; z = 3.0902), accurate to a fraction of a percent for df >= 10.
double ChiSquareLimit(int df) {
  const double z = 3.0902;
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Pearson's statistic with cells of expected count < 5 pooled into one; returns {stat, df}.
std::pair<double, int> ChiSquare(const std::vector<double>& expected_p,
                                 const std::vector<int64_t>& counts, int64_t n) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected_p[i] * static_cast<double>(n);
    if (e < 5) {
      pooled_e += e;
      pooled_o += static_cast<double>(counts[i]);
      continue;
    }
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  if (pooled_e > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1e-9);
    ++cells;
  }
  return {stat, cells - 1};
}

// Softmax at temperature t (the sampler's candidates without filters).
std::vector<double> Softmax(std::span<const float> logits, double t) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((logits[i] - mx) / t);
  for (double& v : p) v /= sum;
  return p;
}

TEST(SpecDecodeTest, SampledJointOfTwoTokensMatchesTheTargetDistribution) {
  // 20000 requests at temperature 2 (seeds 0..19999, so the test is deterministic): token 1 is
  // sampled after the prefill, token 2 by verifying the MTP's draft (accepted about 1 time in
  // 5). The (token 1, token 2) histogram is compared with p(t1) p(t2 | t1) computed from the
  // fake model's logits. With correct sampling the statistic exceeds the limit with
  // probability 1e-3 for a random seed set.
  constexpr int kSamples = 20000;
  constexpr float kTemperature = 2.0f;
  const std::vector<int32_t> prompt = {5, 17, 33, 2};
  // Exact joint from a separate instance of the same fake model.
  FakeModel ref(kVocab, FakeMode::kSuccessor);
  NullBackend backend;
  auto kv = KvStorage::Allocate(backend, KvCacheSpec(), 4, 16);
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> table = {0};
  auto next_p = [&](const std::vector<int32_t>& ctx) {
    Batch b;
    b.AddSequence(ctx, 0, table, 16, false);
    std::vector<float> logits;
    EXPECT_TRUE(ref.Forward(b, **kv, &logits).ok());
    return Softmax(logits, kTemperature);
  };
  const std::vector<double> p1 = next_p(prompt);
  std::vector<double> joint(kVocab * kVocab);
  for (int a = 0; a < kVocab; ++a) {
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(a);
    const std::vector<double> p2 = next_p(ctx);
    for (int b = 0; b < kVocab; ++b) joint[a * kVocab + b] = p1[a] * p2[b];
  }

  EngineOptions o;
  o.num_speculative_tokens = 1;
  o.max_num_seqs = 64;
  o.num_kv_blocks = 128;
  SpecHarness h(o, FakeMode::kSuccessor);
  std::vector<int64_t> counts(kVocab * kVocab);
  // Waves of 500: a wave waits behind what the engine has not yet retired of the last one, and
  // the queue holds 1024 (one clean-clone CI run refused requests with waves of 1000).
  for (int wave = 0; wave < kSamples; wave += 500) {
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int i = wave; i < wave + 500; ++i) {
      SamplingParams p;
      p.temperature = kTemperature;
      p.seed = static_cast<uint64_t>(i);
      p.max_tokens = 3;  // leaves room for one draft after the first token
      p.ignore_eos = true;
      handles.push_back(h.Submit(prompt, p));
    }
    for (auto& handle : handles) {
      const RequestOutput out = handle->WaitFinished();
      ASSERT_EQ(out.token_ids.size(), 3u);
      ++counts[out.token_ids[0] * kVocab + out.token_ids[1]];
    }
  }
  const EngineStats s = h.engine->GetStats();
  EXPECT_EQ(s.spec_draft_tokens, kSamples);  // every second token was verified from a draft
  EXPECT_GT(s.spec_accepted_tokens, kSamples / 10);
  EXPECT_LT(s.spec_accepted_tokens, kSamples / 2);
  const auto [stat, df] = ChiSquare(joint, counts, kSamples);
  EXPECT_GT(df, 50);
  EXPECT_LT(stat, ChiSquareLimit(df)) << "df " << df;
}

TEST(SpecDecodeTest, SampleWithDraftDrawsFromTheFilteredTarget) {
  // Fixed logits; temperature 0.7, top-k 12, top-p 0.9: the target p is the renormalized
  // filtered softmax. For a draft that is the top token, a mid-ranked one and one outside the
  // candidates, 20000 draws each pass the chi-square test (false failure 1e-3 per draft).
  std::vector<float> logits(kVocab);
  for (int i = 0; i < kVocab; ++i) logits[i] = static_cast<float>((i * 37) % 23) * 0.15f;
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_k = 12;
  params.top_p = 0.9f;
  // Expected: softmax / T over the 12 best (ties to the lower id), then the top-p prefix.
  std::vector<int32_t> order(kVocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  order.resize(12);
  const float mx = logits[order[0]];
  std::vector<double> w;
  double total = 0;
  for (int32_t id : order) total += w.emplace_back(std::exp((logits[id] - mx) / 0.7f));
  double mass = 0;
  size_t keep = 0;
  while (keep < order.size()) {
    mass += w[keep++];
    if (mass >= 0.9 * total) break;
  }
  std::vector<double> expected(kVocab, 0.0);
  for (size_t i = 0; i < keep; ++i) expected[order[i]] = w[i] / mass;
  const int32_t outside = order.back();  // 12th best: cut by top-p
  ASSERT_EQ(expected[outside], 0.0);
  for (int32_t draft : {order[0], order[3], outside}) {
    SequenceSampler sampler(params, /*seed=*/42 + draft, {});
    std::vector<int64_t> counts(kVocab);
    constexpr int kDraws = 20000;
    for (int i = 0; i < kDraws; ++i) {
      std::vector<float> row = logits;
      ++counts[sampler.SampleWithDraft(row, {}, draft)];
    }
    const auto [stat, df] = ChiSquare(expected, counts, kDraws);
    EXPECT_GE(df, 4);
    EXPECT_LT(stat, ChiSquareLimit(df)) << "draft " << draft << " df " << df;
    EXPECT_EQ(counts[outside], 0);
  }
}

}  // namespace
}  // namespace dh
