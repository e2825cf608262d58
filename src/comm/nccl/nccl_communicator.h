// The NCCL communicator: device buffers on one GPU per rank, collectives enqueued on a CUDA stream.
// NCCL needs its unique id shared before it starts, so it is built over a host communicator (MPI)
// that broadcasts the id from rank 0. Built only when the CUDA toolkit (cudart + NCCL) is found.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace dh::comm {

// `bootstrap` carries the id exchange and gives rank and size; `device` is the CUDA device of this
// rank; `stream` is the cudaStream_t the collectives go on (nullptr: the default stream). Each
// collective synchronizes its stream before returning, so results are ready on return (the CUDA
// backend can later pass its own stream and drop that synchronization).
Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap, int device,
                                                           void* stream);

}  // namespace dh::comm
