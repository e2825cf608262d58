// Starting tensor parallelism for a command (--tp-size N, --ep-size M): under `mpirun -np N` this
// process joins the job through the MPI communicator and becomes one rank; rank 0 prints and
// writes files, the other ranks stay quiet. docs/parallel.md.
#pragma once

#include <chrono>
#include <memory>

#include "base/status.h"
#include "comm/communicator.h"
#include "weights/load_options.h"

namespace dh::app {

struct ParallelRun {
  std::shared_ptr<comm::Communicator> comm;  // null for --tp-size 1
  ParallelOptions options;                   // for LoadOptions::parallel
  int threads = 0;                           // worker threads per rank (0: backend default)
};

// tp_size 1: nothing to start. Else: an MPI rank of a job of exactly tp_size ranks (a clear error
// without mpirun or with another -np); threads default to this host's CPUs / its ranks.
Result<ParallelRun> StartParallel(int tp_size, int ep_size, int threads);

// How long this process has been inside its current collective call on `comm` (zero when in
// none, or when `comm` is not the communicator StartParallel made, which records it), for serve's
// start-up watch (serve_parallel.h). Safe to call from any thread.
std::chrono::steady_clock::duration TimeInCollective(const comm::Communicator& comm);

}  // namespace dh::app
