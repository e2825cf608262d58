// --tp-size / --ep-size: joining the MPI job (apps/parallel.h).
#include "apps/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/log.h"
#include "base/thread_pool.h"
#ifdef DH_HAVE_MPI
#include "comm/mpi/mpi_communicator.h"
#endif

namespace dh::app {
namespace {

// The MPI communicator, noting when its current call started: a collective that never returns
// (a rank gone) is then visible from another thread.
class TimedCommunicator final : public comm::Communicator {
 public:
  explicit TimedCommunicator(std::unique_ptr<comm::Communicator> inner)
      : inner_(std::move(inner)) {}

  std::string_view Name() const override { return inner_->Name(); }
  int Rank() const override { return inner_->Rank(); }
  int Size() const override { return inner_->Size(); }
  Status AllReduceSum(void* data, size_t count, DType dtype) override {
    return Timed([&] { return inner_->AllReduceSum(data, count, dtype); });
  }
  Status AllGather(const void* send, size_t bytes_per_rank, void* recv) override {
    return Timed([&] { return inner_->AllGather(send, bytes_per_rank, recv); });
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    return Timed([&] { return inner_->Broadcast(data, bytes, root); });
  }
  Status Barrier() override {
    return Timed([&] { return inner_->Barrier(); });
  }
  Status AllToAllV(const void* send, std::span<const size_t> send_bytes,
                   std::span<const size_t> send_offsets, void* recv,
                   std::span<const size_t> recv_bytes,
                   std::span<const size_t> recv_offsets) override {
    return Timed([&] {
      return inner_->AllToAllV(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
    });
  }

  std::chrono::steady_clock::duration InCall() const {
    const int64_t since = since_ns_.load(std::memory_order_acquire);
    if (since == 0) return {};
    return std::chrono::steady_clock::now().time_since_epoch() - std::chrono::nanoseconds(since);
  }

 private:
  template <typename F>
  Status Timed(F call) {
    since_ns_.store(std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::steady_clock::now().time_since_epoch())
                                             .count()),
                    std::memory_order_release);
    Status st = call();
    since_ns_.store(0, std::memory_order_release);
    stats_ = inner_->Stats();
    return st;
  }

  std::unique_ptr<comm::Communicator> inner_;
  std::atomic<int64_t> since_ns_{0};  // steady clock at the current call's start; 0: none
};

}  // namespace

std::chrono::steady_clock::duration TimeInCollective(const comm::Communicator& comm) {
  const auto* timed = dynamic_cast<const TimedCommunicator*>(&comm);
  return timed != nullptr ? timed->InCall() : std::chrono::steady_clock::duration{};
}

Result<ParallelRun> StartParallel(int tp_size, int ep_size, int threads) {
  // One MPI communicator per process: serve joins the job before it loads the model.
  static std::shared_ptr<comm::Communicator> started;
  ParallelRun run;
  run.threads = threads;
  if (tp_size < 1) return InvalidArgument("--tp-size: expected >= 1, got {}", tp_size);
  if (ep_size < 0) return InvalidArgument("--ep-size: expected >= 1, got {}", ep_size);
  if (ep_size != 0 && tp_size % ep_size != 0) {
    std::string sizes;
    for (int d = 1; d <= tp_size; ++d) {
      if (tp_size % d == 0) sizes += (sizes.empty() ? "" : ", ") + std::to_string(d);
    }
    return InvalidArgument("--ep-size {}: expected a divisor of --tp-size {}: {}", ep_size,
                           tp_size, sizes);
  }
  run.options.ep_size = ep_size;
  if (tp_size == 1) return run;
#ifdef DH_HAVE_MPI
  if (!comm::LaunchedByMpi()) {
    return InvalidArgument("--tp-size {}: start the ranks with `mpirun -np {} deepharness ...` "
                           "(docs/parallel.md)", tp_size, tp_size);
  }
  if (!started) {
    DH_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> c, comm::MakeMpiCommunicator());
    started = std::make_shared<TimedCommunicator>(std::move(c));
  }
  run.comm = started;
  if (run.comm->Size() != tp_size) {
    return InvalidArgument("--tp-size {}: mpirun started {} ranks; expected -np {}", tp_size,
                           run.comm->Size(), tp_size);
  }
  run.options.rank = run.comm->Rank();
  run.options.size = tp_size;
  run.options.comm = run.comm.get();
  if (run.options.rank != 0) {
    // Rank 0 speaks for the job: the others print nothing but errors.
    SetLogLevel(LogLevel::kError);
    if (std::freopen("/dev/null", "w", stdout) == nullptr) {
      return Internal("rank {}: cannot redirect stdout to /dev/null", run.options.rank);
    }
  }
  if (threads == 0) {
    // Ranks on one host share its CPUs, unless the launcher already bound each to its own.
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int local_ranks = local != nullptr ? std::max(1, std::atoi(local)) : 1;
    const int cpus = AvailableCpus();
    if (cpus >= static_cast<int>(std::thread::hardware_concurrency())) {
      run.threads = std::max(1, cpus / local_ranks);
    }
  }
  DH_LOG(Info, "tensor parallelism: {} ranks (expert parallelism over {}), {} threads each",
         tp_size, ep_size == 0 ? tp_size : ep_size, run.threads);
  return run;
#else
  return Unsupported("--tp-size {}: this build has no MPI (install libopenmpi-dev and rebuild)",
                     tp_size);
#endif
}

}  // namespace dh::app
