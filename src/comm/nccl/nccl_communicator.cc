// NCCL collectives. All-to-all(v) is a grouped set of ncclSend/ncclRecv pairs, as NCCL itself
// recommends; bf16 all-reduce uses ncclBfloat16 (NCCL accumulates in f32 inside its kernels).
#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>

namespace dh::comm {
namespace {

Status NcclStatus(const char* what, ncclResult_t r) {
  if (r == ncclSuccess) return Status::Ok();
  return Internal("NCCL {} failed: {}", what, ncclGetErrorString(r));
}

Status CudaStatus(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return Status::Ok();
  return Internal("CUDA {} failed: {}", what, cudaGetErrorString(e));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, cudaStream_t stream)
      : comm_(comm), rank_(rank), size_(size), stream_(stream) {}
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }

  std::string_view Name() const override { return "nccl"; }
  int Rank() const override { return rank_; }
  int Size() const override { return size_; }

  Status AllReduceSum(void* data, size_t count, DType dtype) override {
    DH_ASSIGN_OR_RETURN(const size_t elem, ReduceElementSize(dtype));
    const ncclDataType_t type = dtype == DType::kF32 ? ncclFloat32 : ncclBfloat16;
    return Run("all-reduce", count * elem, [&] {
      return ncclAllReduce(data, data, count, type, ncclSum, comm_, stream_);
    });
  }
  Status AllGather(const void* send, size_t bytes_per_rank, void* recv) override {
    return Run("all-gather", bytes_per_rank * static_cast<size_t>(size_), [&] {
      return ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm_, stream_);
    });
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      return InvalidArgument("broadcast: root {} is not a rank of {}", root, size_);
    }
    return Run("broadcast", bytes,
               [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
  }
  Status Barrier() override {
    // An all-reduce of one value is NCCL's barrier.
    float* one = nullptr;
    DH_RETURN_IF_ERROR(CudaStatus("malloc", cudaMalloc(&one, sizeof(float))));
    Status s = Run("barrier", 0,
                   [&] { return ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_); });
    cudaFree(one);
    return s;
  }
  Status AllToAllV(const void* send, std::span<const size_t> send_bytes,
                   std::span<const size_t> send_offsets, void* recv,
                   std::span<const size_t> recv_bytes,
                   std::span<const size_t> recv_offsets) override {
    DH_RETURN_IF_ERROR(ValidateAllToAll(size_, send_bytes, send_offsets, recv_bytes, recv_offsets));
    size_t total = 0;
    for (size_t b : send_bytes) total += b;
    const auto* s = static_cast<const char*>(send);
    auto* r = static_cast<char*>(recv);
    return Run("all-to-all", total, [&] {
      ncclResult_t res = ncclGroupStart();
      for (int peer = 0; peer < size_ && res == ncclSuccess; ++peer) {
        if (send_bytes[peer] != 0) {
          res = ncclSend(s + send_offsets[peer], send_bytes[peer], ncclUint8, peer, comm_, stream_);
        }
        if (res == ncclSuccess && recv_bytes[peer] != 0) {
          res = ncclRecv(r + recv_offsets[peer], recv_bytes[peer], ncclUint8, peer, comm_, stream_);
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      return res != ncclSuccess ? res : end;
    });
  }

 private:
  template <typename F>
  Status Run(const char* what, size_t bytes, F&& enqueue) {
    const auto start = std::chrono::steady_clock::now();
    stats_.calls++;
    stats_.bytes += bytes;
    Status s = NcclStatus(what, enqueue());
    if (s.ok()) s = CudaStatus("stream synchronize", cudaStreamSynchronize(stream_));
    stats_.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return s;
  }

  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap, int device,
                                                           void* stream) {
  DH_RETURN_IF_ERROR(CudaStatus("set device", cudaSetDevice(device)));
  ncclUniqueId id;
  if (bootstrap.Rank() == 0) DH_RETURN_IF_ERROR(NcclStatus("get unique id", ncclGetUniqueId(&id)));
  DH_RETURN_IF_ERROR(bootstrap.Broadcast(&id, sizeof(id), 0));
  ncclComm_t comm;
  DH_RETURN_IF_ERROR(
      NcclStatus("init", ncclCommInitRank(&comm, bootstrap.Size(), id, bootstrap.Rank())));
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      comm, bootstrap.Rank(), bootstrap.Size(), static_cast<cudaStream_t>(stream)));
}

}  // namespace dh::comm
