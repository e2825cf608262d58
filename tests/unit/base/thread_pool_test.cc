// ThreadPool: coverage and disjointness of ParallelFor chunks, grain, RunOnAll, reuse after the
// workers have gone to sleep, and AvailableCpus.
#include "base/thread_pool.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace dh {
namespace {

TEST(ThreadPoolTest, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (size_t n : {0, 1, 2, 7, 64, 1000, 4097}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, 1, [&](size_t b, size_t e) {
        ASSERT_LT(b, e);
        for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPoolTest, ChunksRespectGrainAndUseSeveralThreads) {
  ThreadPool pool(4);
  std::mutex mu;
  std::vector<std::pair<size_t, size_t>> chunks;
  pool.ParallelFor(1003, 100, [&](size_t b, size_t e) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(b, e);
  });
  EXPECT_EQ(chunks.size(), 4u);
  for (auto [b, e] : chunks) EXPECT_GE(e - b, 100u);

  chunks.clear();
  pool.ParallelFor(150, 100, [&](size_t b, size_t e) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(b, e);
  });
  ASSERT_EQ(chunks.size(), 1u);  // 150 / 100 leaves room for one chunk of >= 100
  EXPECT_EQ(chunks[0], std::make_pair(size_t{0}, size_t{150}));
}

TEST(ThreadPoolTest, RunOnAllCallsEachThreadIndexOnceOnDistinctThreads) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> calls(3);
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.RunOnAll([&](int i) {
    calls[i].fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  for (auto& c : calls) EXPECT_EQ(c.load(), 1);
  EXPECT_EQ(ids.size(), 3u);
}

TEST(ThreadPoolTest, WorksAfterWorkersSleepAndManyTimesInARow) {
  ThreadPool pool(3);
  std::atomic<long> sum{0};
  for (int round = 0; round < 400; ++round) {
    pool.ParallelFor(30, 1, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) sum.fetch_add(static_cast<long>(i));
    });
    // Every 100 rounds, wait long enough for the workers to block on the condition variable.
    if (round % 100 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(sum.load(), 400L * (29 * 30 / 2));
}

TEST(ThreadPoolTest, AvailableCpusIsPositive) { EXPECT_GE(AvailableCpus(), 1); }

}  // namespace
}  // namespace dh
