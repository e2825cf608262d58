// The Open MPI communicator: host buffers, one MPI_COMM_WORLD rank per process. Launch with
// `mpirun -np N deepharness ...`; without a launcher MPI starts as a singleton of size 1.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace dh::comm {

// Initializes MPI (thread level "serialized": one thread at a time makes MPI calls) on first use
// and finalizes it when the last communicator is destroyed. An error when MPI cannot start.
Result<std::unique_ptr<Communicator>> MakeMpiCommunicator();

// Registers "mpi" with the communicator registry (called by apps/ and tests that link it).
void RegisterMpiCommunicator();

// True when this process was started by an MPI launcher (mpirun/mpiexec/srun), read from the
// environment without initializing MPI.
bool LaunchedByMpi();

}  // namespace dh::comm
