// The communicator interface: the collectives that tensor and expert parallelism need (all-reduce,
// all-gather, broadcast, barrier, all-to-all(v)) behind one class, so model and engine code never
// include an MPI or NCCL header. Implementations: `local` (one rank, no library), `mpi` (Open MPI,
// src/comm/mpi/) and `nccl` (src/comm/nccl/, built when the CUDA toolkit is found). Buffers are host
// memory for `local` and `mpi`, device memory for `nccl`; every call is collective: all ranks make
// the same calls in the same order with the same sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"

namespace dh::comm {

// Counters every implementation keeps: how many collective calls, bytes handed to them, and the
// seconds spent inside them (the "communication time" of a step).
struct CommStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual std::string_view Name() const = 0;
  virtual int Rank() const = 0;
  virtual int Size() const = 0;

  // In-place element-wise sum over all ranks of `count` elements of `dtype` (kF32 or kBF16; bf16
  // is summed in f32 and rounded once, so every rank ends with the same bits).
  virtual Status AllReduceSum(void* data, size_t count, DType dtype) = 0;
  // Concatenates `bytes_per_rank` bytes from every rank, in rank order, into `recv`
  // (Size() * bytes_per_rank bytes). `send` may not alias `recv`.
  virtual Status AllGather(const void* send, size_t bytes_per_rank, void* recv) = 0;
  // Copies `bytes` bytes from `root`'s `data` into every other rank's `data`.
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual Status Barrier() = 0;
  // Personalized exchange: rank r sends send_bytes[d] bytes starting at send_offsets[d] to rank d
  // and receives recv_bytes[s] bytes from rank s at recv_offsets[s]. Every span has Size() entries.
  virtual Status AllToAllV(const void* send, std::span<const size_t> send_bytes,
                           std::span<const size_t> send_offsets, void* recv,
                           std::span<const size_t> recv_bytes,
                           std::span<const size_t> recv_offsets) = 0;

  const CommStats& Stats() const { return stats_; }

 protected:
  CommStats stats_;
};

// Element size for the dtypes AllReduceSum accepts; an error for any other dtype.
Result<size_t> ReduceElementSize(DType dtype);

// Checks the argument spans of AllToAllV against the communicator size (shared by every
// implementation so they reject the same inputs the same way).
Status ValidateAllToAll(int size, std::span<const size_t> send_bytes,
                        std::span<const size_t> send_offsets, std::span<const size_t> recv_bytes,
                        std::span<const size_t> recv_offsets);

// The single-rank communicator: every collective is a copy or nothing. Always available.
std::unique_ptr<Communicator> MakeLocalCommunicator();

// Implementations register a factory under a name ("mpi", "nccl"); apps/ and tests pick one by name.
// `local` is always registered. A factory may fail (no MPI launcher, no GPU) with a clear Status.
using CommunicatorFactory = std::function<Result<std::unique_ptr<Communicator>>()>;
void RegisterCommunicator(std::string name, CommunicatorFactory factory);
Result<std::unique_ptr<Communicator>> CreateCommunicator(std::string_view name);
std::vector<std::string> RegisteredCommunicators();

}  // namespace dh::comm
