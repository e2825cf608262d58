// --tp-size / --ep-size: joining the MPI job (apps/parallel.h).
#include "apps/parallel.h"

#include <algorithm>
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
    started = std::move(c);
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
