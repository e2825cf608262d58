// Scheduler as pure bookkeeping: budgets, chunked prefill, decode-first order, prefix reuse,
// preemption by recompute, and a randomized run that keeps the pool consistent.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <random>

namespace dh {
namespace {

std::unique_ptr<Sequence> MakeSeq(int64_t id, int prompt_len, int32_t first_token = 0) {
  auto s = std::make_unique<Sequence>();
  s->seq_id = id;
  s->token_ids.resize(prompt_len);
  std::iota(s->token_ids.begin(), s->token_ids.end(), first_token);
  s->num_prompt_tokens = prompt_len;
  return s;
}

// Plays the engine's part after a step: every sampling chunk appends one token.
void FinishStep(Scheduler& sched, const SchedulerOutput& out) {
  sched.CompleteStep(out);
  for (const auto& c : out.chunks) {
    if (c.samples) c.seq->token_ids.push_back(7);
  }
}

TEST(SchedulerTest, ChunksPrefillToTheTokenBudget) {
  BlockPool pool(64, 16, true, 1);
  Scheduler sched({8, 32}, pool);
  auto a = MakeSeq(0, 80);
  sched.AddWaiting(a.get());
  std::vector<int> chunks;
  for (int step = 0; step < 3; ++step) {
    SchedulerOutput out = sched.Schedule();
    ASSERT_EQ(out.chunks.size(), 1u);
    chunks.push_back(out.chunks[0].num_tokens);
    EXPECT_EQ(out.chunks[0].samples, step == 2);
    FinishStep(sched, out);
  }
  EXPECT_EQ(chunks, (std::vector<int>{32, 32, 16}));
  EXPECT_EQ(a->num_computed_tokens, 80);
  EXPECT_EQ(a->num_tokens(), 81);
  SchedulerOutput decode = sched.Schedule();
  ASSERT_EQ(decode.chunks.size(), 1u);
  EXPECT_EQ(decode.chunks[0].num_tokens, 1);
  EXPECT_TRUE(decode.chunks[0].samples);
}

TEST(SchedulerTest, AllLogitsSequencesAreChunkedToTheLogitRowBudget) {
  BlockPool pool(64, 16, false, 1);
  SchedulerConfig config;
  config.max_num_batched_tokens = 2048;
  config.max_num_logit_rows = 256;
  Scheduler sched(config, pool);
  auto a = MakeSeq(0, 600);
  a->all_logits = true;
  auto b = MakeSeq(1, 100, 5);
  b->all_logits = true;
  auto c = MakeSeq(2, 300, 9);
  sched.AddWaiting(a.get());
  sched.AddWaiting(b.get());
  sched.AddWaiting(c.get());
  SchedulerOutput out = sched.Schedule();
  // a takes every logit row; b waits (FIFO) and so does c behind it.
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].num_tokens, 256);
  FinishStep(sched, out);
  out = sched.Schedule();
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].num_tokens, 256);
  FinishStep(sched, out);
  out = sched.Schedule();
  ASSERT_EQ(out.chunks.size(), 3u);
  EXPECT_EQ(out.chunks[0].num_tokens, 88);
  EXPECT_EQ(out.chunks[1].num_tokens, 100);
  EXPECT_EQ(out.chunks[2].num_tokens, 300);  // no logit rows needed
}

TEST(SchedulerTest, RunningDecodesComeBeforeNewPrefills) {
  BlockPool pool(64, 16, true, 1);
  Scheduler sched({8, 10}, pool);
  auto a = MakeSeq(0, 4), b = MakeSeq(1, 4, 100);
  sched.AddWaiting(a.get());
  sched.AddWaiting(b.get());
  SchedulerOutput s1 = sched.Schedule();  // a: 4 tokens, b: 4 tokens
  ASSERT_EQ(s1.chunks.size(), 2u);
  FinishStep(sched, s1);
  auto c = MakeSeq(2, 50, 200);
  sched.AddWaiting(c.get());
  SchedulerOutput s2 = sched.Schedule();
  ASSERT_EQ(s2.chunks.size(), 3u);
  EXPECT_EQ(s2.chunks[0].seq, a.get());
  EXPECT_EQ(s2.chunks[1].seq, b.get());
  EXPECT_EQ(s2.chunks[2].seq, c.get());
  EXPECT_EQ(s2.chunks[2].num_tokens, 8);  // what the decodes left of the budget
  EXPECT_FALSE(s2.chunks[2].samples);
  EXPECT_EQ(s2.num_tokens, 10);
}

TEST(SchedulerTest, RespectsMaxNumSeqs) {
  BlockPool pool(64, 16, true, 1);
  Scheduler sched({2, 100}, pool);
  auto a = MakeSeq(0, 3), b = MakeSeq(1, 3, 10), c = MakeSeq(2, 3, 20);
  sched.AddWaiting(a.get());
  sched.AddWaiting(b.get());
  sched.AddWaiting(c.get());
  SchedulerOutput out = sched.Schedule();
  EXPECT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(sched.waiting().size(), 1u);
  FinishStep(sched, out);
  sched.Remove(a.get());
  out = sched.Schedule();
  ASSERT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(out.chunks[1].seq, c.get());
}

TEST(SchedulerTest, PrefixHitSkipsCachedTokensButComputesTheLastOne) {
  BlockPool pool(64, 4, true, 1);
  Scheduler sched({8, 100}, pool);
  auto a = MakeSeq(0, 12);
  sched.AddWaiting(a.get());
  FinishStep(sched, sched.Schedule());
  // b's prompt equals a's: all 3 blocks are cached, but the last token must be computed, so
  // only the first 2 blocks (8 tokens) are reused.
  auto b = MakeSeq(1, 12);
  sched.AddWaiting(b.get());
  SchedulerOutput out = sched.Schedule();
  ASSERT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(out.chunks[1].seq, b.get());
  EXPECT_EQ(out.chunks[1].start, 8);
  EXPECT_EQ(out.chunks[1].num_tokens, 4);
  EXPECT_EQ(b->num_cached_tokens, 8);
  EXPECT_EQ(b->blocks.block_ids[0], a->blocks.block_ids[0]);
  // A request that needs every prompt logit bypasses the cache.
  auto c = MakeSeq(2, 12);
  c->use_prefix_cache = false;
  sched.AddWaiting(c.get());
  FinishStep(sched, out);
  out = sched.Schedule();
  EXPECT_EQ(c->num_cached_tokens, 0);
}

TEST(SchedulerTest, PreemptsTheNewestAndRecomputesIt) {
  // 4 blocks of 4 slots: two sequences of 6 tokens (2 blocks each) fill the pool.
  BlockPool pool(4, 4, false, 1);
  Scheduler sched({8, 100}, pool);
  auto a = MakeSeq(0, 6), b = MakeSeq(1, 6, 50);
  sched.AddWaiting(a.get());
  sched.AddWaiting(b.get());
  FinishStep(sched, sched.Schedule());  // each now has 7 tokens, 6 computed, 8 slots
  FinishStep(sched, sched.Schedule());  // 8 tokens, 7 computed
  FinishStep(sched, sched.Schedule());  // 9 tokens, 8 computed; blocks full
  // Next decode needs a third block for both; only a gets it after b is preempted.
  SchedulerOutput out = sched.Schedule();
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], b.get());
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].seq, a.get());
  EXPECT_EQ(sched.waiting().front(), b.get());
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_TRUE(b->blocks.block_ids.empty());
  EXPECT_EQ(sched.num_preemptions(), 1);
  FinishStep(sched, out);
  sched.Remove(a.get());
  // b is recomputed from scratch: prompt plus its generated tokens, then it samples.
  out = sched.Schedule();
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].seq, b.get());
  EXPECT_EQ(out.chunks[0].start, 0);
  EXPECT_EQ(out.chunks[0].num_tokens, 9);
  EXPECT_TRUE(out.chunks[0].samples);
}

TEST(SchedulerTest, RandomWorkloadKeepsPoolConsistentAndDrainsToEmpty) {
  BlockPool pool(40, 4, true, 9);
  Scheduler sched({6, 24}, pool);
  std::mt19937_64 rng(99);
  std::vector<std::unique_ptr<Sequence>> live;
  int64_t next_id = 0;
  int finished = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.size() < 12 && rng() % 3 == 0) {
      auto s =
          MakeSeq(next_id++, 1 + static_cast<int>(rng() % 30), static_cast<int32_t>(rng() % 3));
      sched.AddWaiting(s.get());
      live.push_back(std::move(s));
    }
    SchedulerOutput out = sched.Schedule();
    ASSERT_LE(out.num_tokens, 24);
    ASSERT_LE(sched.running().size(), 6u);
    FinishStep(sched, out);
    for (size_t i = 0; i < live.size();) {
      Sequence* s = live[i].get();
      const bool done = s->running && s->num_computed_tokens == s->num_tokens() - 1 &&
                        s->num_generated() >= 1 + static_cast<int>(s->seq_id % 40);
      const bool cancel = rng() % 200 == 0;
      if (done || cancel) {
        sched.Remove(s);
        live.erase(live.begin() + static_cast<ptrdiff_t>(i));
        ++finished;
      } else {
        ++i;
      }
    }
    const BlockPoolStats st = pool.stats();
    ASSERT_EQ(st.free + st.used, st.total);
    if (step % 100 == 0) ASSERT_TRUE(pool.CheckConsistency().ok());
  }
  for (auto& s : live) sched.Remove(s.get());
  EXPECT_GT(finished, 100);
  EXPECT_GT(sched.num_preemptions(), 0);
  EXPECT_EQ(pool.num_free_blocks(), pool.num_blocks());
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

}  // namespace
}  // namespace dh
