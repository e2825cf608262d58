// ThreadPool: persistent workers that spin for ~100 us after a job and then sleep on a condition
// variable; the calling thread takes part in every job. Chunks are claimed through an atomic
// counter, so a preempted worker delays only its own chunk's start, never a fixed share.
#include "base/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dh {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long a thread busy-waits for the next job (or for a job to finish) before blocking.
constexpr auto kSpinTime = std::chrono::microseconds(100);

}  // namespace

struct ThreadPool::Impl {
  int num_threads = 1;
  std::vector<std::thread> workers;

  std::mutex mu;
  std::condition_variable work_cv;  // workers wait here for a new generation
  std::condition_variable done_cv;  // the caller waits here for pending == 0
  std::atomic<uint64_t> generation{0};
  std::atomic<int> pending{0};  // workers still running the current job
  bool stop = false;            // guarded by mu
  std::atomic<bool> stop_flag{false};
  const std::function<void(int)>* job = nullptr;

  void WorkerLoop(int index) {
    uint64_t seen = 0;
    for (;;) {
      if (!WaitForGeneration(seen)) return;
      seen = generation.load(std::memory_order_acquire);
      (*job)(index);
      if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu);
        done_cv.notify_one();
      }
    }
  }

  // Returns false when the pool shuts down.
  bool WaitForGeneration(uint64_t seen) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0;; ++i) {
      if (stop_flag.load(std::memory_order_acquire)) return false;
      if (generation.load(std::memory_order_acquire) != seen) return true;
      CpuRelax();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > kSpinTime) break;
    }
    std::unique_lock<std::mutex> lock(mu);
    work_cv.wait(lock, [&] { return stop || generation.load(std::memory_order_acquire) != seen; });
    return !stop;
  }

  // Runs job(i) on every thread i (0 is the caller) and waits for all of them.
  void Run(const std::function<void(int)>& fn) {
    const int workers_count = num_threads - 1;
    if (workers_count == 0) {
      fn(0);
      return;
    }
    job = &fn;
    pending.store(workers_count, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu);
      generation.fetch_add(1, std::memory_order_release);
    }
    work_cv.notify_all();
    fn(0);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; pending.load(std::memory_order_acquire) != 0; ++i) {
      CpuRelax();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > kSpinTime) {
        std::unique_lock<std::mutex> lock(mu);
        done_cv.wait(lock, [&] { return pending.load(std::memory_order_acquire) == 0; });
        break;
      }
    }
    job = nullptr;
  }
};

ThreadPool::ThreadPool(int num_threads) : impl_(std::make_unique<Impl>()) {
  impl_->num_threads = std::max(1, num_threads);
  for (int i = 1; i < impl_->num_threads; ++i) {
    impl_->workers.emplace_back([this, i] { impl_->WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
    impl_->stop_flag.store(true, std::memory_order_release);
  }
  impl_->work_cv.notify_all();
  for (auto& t : impl_->workers) t.join();
}

int ThreadPool::num_threads() const { return impl_->num_threads; }

void ThreadPool::ParallelFor(size_t n, size_t grain,
                             const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t max_chunks = std::max<size_t>(n / grain, 1);
  const size_t num_chunks = std::min<size_t>(max_chunks, impl_->num_threads);
  if (num_chunks == 1) {
    fn(0, n);
    return;
  }
  // Chunk c is [c * n / num_chunks, (c + 1) * n / num_chunks): sizes differ by at most one and
  // are >= grain because num_chunks <= n / grain.
  std::atomic<size_t> next{0};
  auto job = [&](int) {
    for (;;) {
      const size_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= num_chunks) return;
      fn(c * n / num_chunks, (c + 1) * n / num_chunks);
    }
  };
  impl_->Run(std::function<void(int)>(std::ref(job)));  // by reference: no heap copy
}

void ThreadPool::RunOnAll(const std::function<void(int)>& fn) { impl_->Run(fn); }

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

}  // namespace dh
