// MPI collectives over MPI_COMM_WORLD. MPI counts are int: sizes above INT_MAX are sent in chunks
// (all-reduce, broadcast) or refused (all-gather, all-to-all, whose per-rank pieces are far smaller
// in any model we run).
#include "comm/mpi/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <vector>

namespace dh::comm {
namespace {

Status MpiError(const char* what, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return Internal("MPI {} failed: {}", what, std::string(text, static_cast<size_t>(len)));
}

constexpr size_t kChunk = size_t{1} << 30;  // elements or bytes per MPI call

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int rank, int size, bool owns_mpi) : rank_(rank), size_(size), owns_(owns_mpi) {}
  ~MpiCommunicator() override {
    if (owns_) MPI_Finalize();
  }

  std::string_view Name() const override { return "mpi"; }
  int Rank() const override { return rank_; }
  int Size() const override { return size_; }

  Status AllReduceSum(void* data, size_t count, DType dtype) override {
    DH_ASSIGN_OR_RETURN(const size_t elem, ReduceElementSize(dtype));
    Timed timed(this, count * elem);
    float* f32 = static_cast<float*>(data);
    if (dtype == DType::kBF16) {
      // Sum in f32, round once: every rank rounds the same sum, so all end with the same bits.
      scratch_.resize(count);
      const auto* in = static_cast<const uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) scratch_[i] = BF16ToF32(in[i]);
      f32 = scratch_.data();
    }
    for (size_t done = 0; done < count; done += kChunk) {
      const int n = static_cast<int>(std::min(kChunk, count - done));
      const int rc = MPI_Allreduce(MPI_IN_PLACE, f32 + done, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      if (rc != MPI_SUCCESS) return MpiError("all-reduce", rc);
    }
    if (dtype == DType::kBF16) {
      auto* out = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) out[i] = F32ToBF16(scratch_[i]);
    }
    return Status::Ok();
  }

  Status AllGather(const void* send, size_t bytes_per_rank, void* recv) override {
    if (bytes_per_rank > INT_MAX) {
      return InvalidArgument("all-gather: {} bytes per rank is over MPI's int limit", bytes_per_rank);
    }
    Timed timed(this, bytes_per_rank * static_cast<size_t>(size_));
    const int n = static_cast<int>(bytes_per_rank);
    const int rc = MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? Status::Ok() : MpiError("all-gather", rc);
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      return InvalidArgument("broadcast: root {} is not a rank of {}", root, size_);
    }
    Timed timed(this, bytes);
    auto* p = static_cast<char*>(data);
    for (size_t done = 0; done < bytes; done += kChunk) {
      const int n = static_cast<int>(std::min(kChunk, bytes - done));
      const int rc = MPI_Bcast(p + done, n, MPI_BYTE, root, MPI_COMM_WORLD);
      if (rc != MPI_SUCCESS) return MpiError("broadcast", rc);
    }
    return Status::Ok();
  }

  Status Barrier() override {
    Timed timed(this, 0);
    const int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? Status::Ok() : MpiError("barrier", rc);
  }

  Status AllToAllV(const void* send, std::span<const size_t> send_bytes,
                   std::span<const size_t> send_offsets, void* recv,
                   std::span<const size_t> recv_bytes,
                   std::span<const size_t> recv_offsets) override {
    DH_RETURN_IF_ERROR(ValidateAllToAll(size_, send_bytes, send_offsets, recv_bytes, recv_offsets));
    std::vector<int> counts(4 * static_cast<size_t>(size_));
    int* sc = counts.data();
    int* sd = sc + size_;
    int* rc_ = sd + size_;
    int* rd = rc_ + size_;
    size_t total = 0;
    for (int r = 0; r < size_; ++r) {
      for (size_t v : {send_bytes[r], send_offsets[r], recv_bytes[r], recv_offsets[r]}) {
        if (v > INT_MAX) return InvalidArgument("all-to-all: {} bytes is over MPI's int limit", v);
      }
      sc[r] = static_cast<int>(send_bytes[r]);
      sd[r] = static_cast<int>(send_offsets[r]);
      rc_[r] = static_cast<int>(recv_bytes[r]);
      rd[r] = static_cast<int>(recv_offsets[r]);
      total += send_bytes[r];
    }
    Timed timed(this, total);
    const int rc = MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc_, rd, MPI_BYTE, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? Status::Ok() : MpiError("all-to-all", rc);
  }

 private:
  // Adds one call, its bytes and its wall time to the stats.
  struct Timed {
    Timed(MpiCommunicator* c, size_t bytes) : comm(c), start(std::chrono::steady_clock::now()) {
      comm->stats_.calls++;
      comm->stats_.bytes += bytes;
    }
    ~Timed() {
      comm->stats_.seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    MpiCommunicator* comm;
    std::chrono::steady_clock::time_point start;
  };

  int rank_, size_;
  bool owns_;
  std::vector<float> scratch_;
};

}  // namespace

bool LaunchedByMpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

Result<std::unique_ptr<Communicator>> MakeMpiCommunicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  bool owns = false;
  if (!initialized) {
    // A rank waiting in a collective gives its core away when nothing arrives (Open MPI polls
    // otherwise): ranks share their cores with their own worker threads, rank 0's engine and
    // HTTP threads and whatever else runs on the host, and a polling rank starves the rank it
    // waits for. Measured on 2 shared cores: tp 2 decode about twice as fast; with the cores to
    // themselves the difference was within the run-to-run spread (bench/README.md).
    // `--mca mpi_yield_when_idle 0` (or the variable in the environment) keeps the polling.
    ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return MpiError("init", rc);
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      return Unsupported("MPI provides thread level {}, need MPI_THREAD_SERIALIZED", provided);
    }
    // Errors come back as codes (turned into Status) instead of aborting the job.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    owns = true;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(rank, size, owns));
}

void RegisterMpiCommunicator() { RegisterCommunicator("mpi", MakeMpiCommunicator); }

}  // namespace dh::comm
