// BlockPool: allocation, ref counts, chained prefix hashes, lazy LRU eviction, stats, and a
// randomized property test over >= 100,000 operations.
#include "kvcache/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace dh {
namespace {

std::vector<int32_t> Iota(int n, int32_t first = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(BlockPoolTest, ReserveAllocatesWholeBlocksAllOrNothing) {
  BlockPool pool(4, 16, true, 1);
  SequenceBlocks a;
  ASSERT_TRUE(pool.Reserve(a, 17));
  EXPECT_EQ(a.block_ids.size(), 2u);
  EXPECT_EQ(a.num_slots, 17);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  EXPECT_TRUE(pool.Reserve(a, 15));  // fills block 2 exactly, no new block
  EXPECT_EQ(a.block_ids.size(), 2u);
  SequenceBlocks b;
  EXPECT_FALSE(pool.Reserve(b, 3 * 16));  // needs 3, only 2 free: nothing taken
  EXPECT_TRUE(b.block_ids.empty());
  EXPECT_EQ(pool.num_free_blocks(), 2);
  EXPECT_TRUE(pool.Reserve(b, 32));
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_FALSE(pool.Reserve(a, 1));
  pool.Release(a);
  pool.Release(b);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().message();
}

TEST(BlockPoolTest, PrefixHitSharesFullBlocksAndCountsTokens) {
  BlockPool pool(8, 4, true, 7);
  const auto tokens = Iota(10);  // blocks [0..3] [4..7] + 2 tokens
  SequenceBlocks a;
  EXPECT_EQ(pool.AcquireCachedPrefix(a, tokens, 9), 0);
  ASSERT_TRUE(pool.Reserve(a, 10));
  pool.CacheFullBlocks(a, tokens, 10);
  EXPECT_EQ(a.num_hashed_blocks, 2);
  EXPECT_EQ(pool.stats().cached, 2);

  SequenceBlocks b;
  EXPECT_EQ(pool.AcquireCachedPrefix(b, tokens, 9), 8);
  EXPECT_EQ(b.block_ids[0], a.block_ids[0]);
  EXPECT_EQ(b.block_ids[1], a.block_ids[1]);
  EXPECT_EQ(pool.ref_count(a.block_ids[0]), 2);
  const BlockPoolStats s = pool.stats();
  EXPECT_EQ(s.prefix_queries, 20);
  EXPECT_EQ(s.prefix_hits, 8);
  pool.Release(a);
  pool.Release(b);
  ASSERT_TRUE(pool.CheckConsistency().ok());
}

TEST(BlockPoolTest, MaxTokensKeepsTheLastTokenUncached) {
  BlockPool pool(8, 4, true, 7);
  const auto tokens = Iota(8);
  SequenceBlocks a;
  ASSERT_TRUE(pool.Reserve(a, 8));
  pool.CacheFullBlocks(a, tokens, 8);
  SequenceBlocks b;
  // Same 8 tokens as a prompt: only 7 may come from the cache, so only one whole block.
  EXPECT_EQ(pool.AcquireCachedPrefix(b, tokens, 7), 4);
  pool.Release(a);
  pool.Release(b);
}

TEST(BlockPoolTest, ChainedHashesDependOnTheWholePrefix) {
  BlockPool pool(8, 4, true, 3);
  std::vector<int32_t> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<int32_t> y = {9, 9, 9, 9, 5, 6, 7, 8, 9};  // same second block, other parent
  SequenceBlocks a;
  ASSERT_TRUE(pool.Reserve(a, 9));
  pool.CacheFullBlocks(a, x, 9);
  SequenceBlocks b;
  EXPECT_EQ(pool.AcquireCachedPrefix(b, y, 8), 0);
  pool.Release(a);
  pool.Release(b);
}

TEST(BlockPoolTest, FreedCachedBlocksStayReusableUntilEvictedLru) {
  BlockPool pool(4, 2, true, 5);
  const std::vector<int32_t> p1 = {1, 2, 3, 4, 9};
  const std::vector<int32_t> p2 = {5, 6, 7, 8, 9};
  SequenceBlocks a, b;
  ASSERT_TRUE(pool.Reserve(a, 4));
  pool.CacheFullBlocks(a, p1, 4);
  ASSERT_TRUE(pool.Reserve(b, 4));
  pool.CacheFullBlocks(b, p2, 4);
  pool.Release(a);  // p1's blocks freed first: least recently used
  pool.Release(b);
  BlockPoolStats s = pool.stats();
  EXPECT_EQ(s.free, 4);
  EXPECT_EQ(s.cached, 4);
  EXPECT_EQ(s.evictable, 4);

  // Needing two blocks evicts p1's (the LRU ones); p2 survives.
  SequenceBlocks c;
  ASSERT_TRUE(pool.Reserve(c, 4));
  EXPECT_EQ(pool.stats().cached, 2);
  SequenceBlocks d;
  EXPECT_EQ(pool.AcquireCachedPrefix(d, p2, 4), 4);
  SequenceBlocks e;
  EXPECT_EQ(pool.AcquireCachedPrefix(e, p1, 4), 0);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().message();
  pool.Release(c);
  pool.Release(d);
  pool.Release(e);
  EXPECT_EQ(pool.num_free_blocks(), 4);
}

TEST(BlockPoolTest, PlainFreeBlocksAreUsedBeforeEvictingCachedOnes) {
  BlockPool pool(4, 2, true, 5);
  const std::vector<int32_t> p = {1, 2, 3, 4};
  SequenceBlocks a;
  ASSERT_TRUE(pool.Reserve(a, 4));
  pool.CacheFullBlocks(a, p, 4);
  pool.Release(a);
  SequenceBlocks b;
  ASSERT_TRUE(pool.Reserve(b, 4));  // two plain blocks are free: cache untouched
  EXPECT_EQ(pool.stats().cached, 2);
  pool.Release(b);
}

TEST(BlockPoolTest, DisabledPrefixCachingNeverHits) {
  BlockPool pool(4, 2, false, 5);
  const std::vector<int32_t> p = {1, 2, 3, 4, 5};
  SequenceBlocks a;
  ASSERT_TRUE(pool.Reserve(a, 4));
  pool.CacheFullBlocks(a, p, 4);
  EXPECT_EQ(pool.stats().cached, 0);
  SequenceBlocks b;
  EXPECT_EQ(pool.AcquireCachedPrefix(b, p, 4), 0);
  EXPECT_EQ(pool.stats().prefix_queries, 0);
  pool.Release(a);
}

TEST(BlockPoolTest, DuplicateContentIsCachedOnce) {
  BlockPool pool(4, 2, true, 5);
  const std::vector<int32_t> p = {1, 2, 3};
  SequenceBlocks a, b;
  ASSERT_TRUE(pool.Reserve(a, 3));
  ASSERT_TRUE(pool.Reserve(b, 3));
  pool.CacheFullBlocks(a, p, 3);
  pool.CacheFullBlocks(b, p, 3);  // computed concurrently: b's copy stays plain
  EXPECT_EQ(pool.stats().cached, 1);
  pool.Release(a);
  pool.Release(b);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().message();
}

TEST(BlockPoolTest, FragmentationCountsUnfilledSlotsOfLastBlocks) {
  BlockPool pool(8, 16, true, 5);
  SequenceBlocks a, b;
  ASSERT_TRUE(pool.Reserve(a, 20));  // 2 blocks, 12 wasted
  ASSERT_TRUE(pool.Reserve(b, 16));  // 1 block, 0 wasted
  BlockPoolStats s = pool.stats();
  EXPECT_EQ(s.used, 3);
  EXPECT_EQ(s.wasted_slots, 12);
  EXPECT_DOUBLE_EQ(s.fragmentation, 12.0 / 48.0);
  pool.Release(a);
  pool.Release(b);
  EXPECT_EQ(pool.stats().wasted_slots, 0);
  EXPECT_DOUBLE_EQ(pool.stats().fragmentation, 0.0);
}

TEST(BlockPoolTest, ResetPrefixCacheForgetsEvictableBlocks) {
  BlockPool pool(4, 2, true, 5);
  const std::vector<int32_t> p = {1, 2, 3, 4};
  SequenceBlocks a;
  ASSERT_TRUE(pool.Reserve(a, 4));
  pool.CacheFullBlocks(a, p, 4);
  pool.Release(a);
  pool.ResetPrefixCache();
  EXPECT_EQ(pool.stats().cached, 0);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  ASSERT_TRUE(pool.CheckConsistency().ok());
}

// Random allocate / append / cache / free / preempt over a small pool with a small vocabulary
// (so prefixes repeat and hit). After every operation: free + used == total, and every block's
// ref count equals the number of live sequences holding it.
TEST(BlockPoolPropertyTest, RandomOperationsKeepInvariants) {
  constexpr int kBlocks = 64;
  constexpr int kBlockSize = 4;
  constexpr int kOps = 120000;
  BlockPool pool(kBlocks, kBlockSize, true, 11);
  std::mt19937_64 rng(12345);
  struct Seq {
    SequenceBlocks blocks;
    std::vector<int32_t> tokens;
    int computed = 0;
  };
  std::vector<Seq> seqs;
  int64_t hits = 0, allocs_failed = 0;
  auto check_refs = [&](int op) {
    std::vector<int> expected(kBlocks, 0);
    int64_t slots = 0;
    for (const Seq& s : seqs) {
      for (int32_t b : s.blocks.block_ids) ++expected[b];
      slots += s.blocks.num_slots;
      ASSERT_LE(s.blocks.num_slots, static_cast<int>(s.blocks.block_ids.size()) * kBlockSize);
    }
    for (int b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(pool.ref_count(b), expected[b]) << "block " << b << " after op " << op;
    }
    const BlockPoolStats st = pool.stats();
    ASSERT_EQ(st.free + st.used, st.total) << "after op " << op;
    ASSERT_GE(st.wasted_slots, 0);
  };
  for (int op = 0; op < kOps; ++op) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind <= 2 || seqs.empty()) {
      // New sequence: a prompt drawn from a tiny alphabet so prefixes are shared often.
      Seq s;
      const int len = 1 + static_cast<int>(rng() % 24);
      for (int i = 0; i < len; ++i) s.tokens.push_back(static_cast<int32_t>(rng() % 2));
      const int cached = pool.AcquireCachedPrefix(s.blocks, s.tokens, len - 1);
      ASSERT_EQ(cached % kBlockSize, 0);
      ASSERT_LT(cached, len);
      hits += cached;
      s.computed = cached;
      if (pool.Reserve(s.blocks, len - cached)) {
        s.computed = len;
        pool.CacheFullBlocks(s.blocks, s.tokens, s.computed);
        seqs.push_back(std::move(s));
      } else {
        ++allocs_failed;
        pool.Release(s.blocks);
      }
    } else if (kind <= 6) {
      // Append (decode) 1-5 tokens to a random sequence.
      Seq& s = seqs[rng() % seqs.size()];
      const int n = 1 + static_cast<int>(rng() % 5);
      if (pool.Reserve(s.blocks, n)) {
        for (int i = 0; i < n; ++i) s.tokens.push_back(static_cast<int32_t>(rng() % 2));
        s.computed += n;
        pool.CacheFullBlocks(s.blocks, s.tokens, s.computed);
      }
    } else {
      // Free (finish) or preempt (free, later recompute with a prefix lookup).
      const size_t i = rng() % seqs.size();
      pool.Release(seqs[i].blocks);
      if (kind == 9) {
        Seq s;
        s.tokens = seqs[i].tokens;
        const int len = static_cast<int>(s.tokens.size());
        const int cached = pool.AcquireCachedPrefix(s.blocks, s.tokens, len - 1);
        if (pool.Reserve(s.blocks, len - cached)) {
          s.computed = len;
          pool.CacheFullBlocks(s.blocks, s.tokens, len);
          seqs[i] = std::move(s);
        } else {
          pool.Release(s.blocks);
          seqs.erase(seqs.begin() + static_cast<ptrdiff_t>(i));
        }
      } else {
        seqs.erase(seqs.begin() + static_cast<ptrdiff_t>(i));
      }
    }
    ASSERT_NO_FATAL_FAILURE(check_refs(op));
    if (op % 1000 == 0) {
      const Status st = pool.CheckConsistency();
      ASSERT_TRUE(st.ok()) << st.message() << " after op " << op;
    }
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(allocs_failed, 0);  // the pool was exercised at its limit
  for (Seq& s : seqs) pool.Release(s.blocks);
  seqs.clear();
  const BlockPoolStats st = pool.stats();
  EXPECT_EQ(st.free, st.total);
  EXPECT_EQ(st.wasted_slots, 0);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().message();
}

}  // namespace
}  // namespace dh
