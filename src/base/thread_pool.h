// A persistent pool of worker threads for data-parallel loops. Workers spin briefly after a job
// (cheap hand-off between the many small ops of a decode step), then block on a condition
// variable, so a competing process on a small machine never starves them (docs/DESIGN.md "Traps").
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <type_traits>

namespace dh {

class ThreadPool {
 public:
  // num_threads includes the calling thread; 1 means everything runs inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const;

  // Calls fn(begin, end) over disjoint chunks covering [0, n), on all threads, and returns when
  // every chunk is done. Chunks are at least `grain` long. Not reentrant.
  void ParallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);
  // The same for any callable (a lambda): passed on by reference, so no std::function copy of a
  // large capture is made on the heap (a decode step allocates nothing; tests/alloc).
  template <typename Fn>
  requires(!std::is_same_v<std::decay_t<Fn>, std::function<void(size_t, size_t)>>) void ParallelFor(
      size_t n, size_t grain, Fn&& fn) {
    ParallelFor(n, grain, std::function<void(size_t, size_t)>(std::ref(fn)));
  }

  // Calls fn(thread_index) once on each of num_threads() threads.
  void RunOnAll(const std::function<void(int)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The number of hardware threads available to this process (sched_getaffinity aware).
int AvailableCpus();

}  // namespace dh
