// Registry, argument checks and the single-rank communicator.
#include "comm/communicator.h"

#include <cstring>
#include <map>
#include <mutex>


namespace dh::comm {

Result<size_t> ReduceElementSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return size_t{4};
    case DType::kBF16:
      return size_t{2};
    default:
      return InvalidArgument("all-reduce: dtype {} is not supported (f32 or bf16)",
                             DTypeName(dtype));
  }
}

Status ValidateAllToAll(int size, std::span<const size_t> send_bytes,
                        std::span<const size_t> send_offsets, std::span<const size_t> recv_bytes,
                        std::span<const size_t> recv_offsets) {
  const size_t n = static_cast<size_t>(size);
  if (send_bytes.size() != n || send_offsets.size() != n || recv_bytes.size() != n ||
      recv_offsets.size() != n) {
    return InvalidArgument("all-to-all: every count and offset list needs {} entries", n);
  }
  return Status::Ok();
}

namespace {

class LocalCommunicator final : public Communicator {
 public:
  std::string_view Name() const override { return "local"; }
  int Rank() const override { return 0; }
  int Size() const override { return 1; }

  Status AllReduceSum(void* data, size_t count, DType dtype) override {
    DH_ASSIGN_OR_RETURN(const size_t elem, ReduceElementSize(dtype));
    Count(count * elem);
    return Status::Ok();  // the sum over one rank is the data itself
  }
  Status AllGather(const void* send, size_t bytes_per_rank, void* recv) override {
    Count(bytes_per_rank);
    if (bytes_per_rank != 0) std::memcpy(recv, send, bytes_per_rank);
    return Status::Ok();
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root != 0) return InvalidArgument("broadcast: root {} is not a rank of 1", root);
    Count(bytes);
    return Status::Ok();
  }
  Status Barrier() override { return Status::Ok(); }
  Status AllToAllV(const void* send, std::span<const size_t> send_bytes,
                   std::span<const size_t> send_offsets, void* recv,
                   std::span<const size_t> recv_bytes,
                   std::span<const size_t> recv_offsets) override {
    DH_RETURN_IF_ERROR(ValidateAllToAll(1, send_bytes, send_offsets, recv_bytes, recv_offsets));
    if (send_bytes[0] != recv_bytes[0]) {
      return InvalidArgument("all-to-all: rank 0 sends {} bytes to itself but expects {}",
                             send_bytes[0], recv_bytes[0]);
    }
    Count(send_bytes[0]);
    if (send_bytes[0] != 0) {
      std::memcpy(static_cast<char*>(recv) + recv_offsets[0],
                  static_cast<const char*>(send) + send_offsets[0], send_bytes[0]);
    }
    return Status::Ok();
  }

 private:
  void Count(size_t bytes) {
    stats_.calls++;
    stats_.bytes += bytes;
  }
};

struct Registry {
  std::mutex mu;
  std::map<std::string, CommunicatorFactory, std::less<>> factories;
};

Registry& GetRegistry() {
  static Registry* registry = [] {
    auto* r = new Registry;
    r->factories["local"] = []() -> Result<std::unique_ptr<Communicator>> {
      return MakeLocalCommunicator();
    };
    return r;
  }();
  return *registry;
}

}  // namespace

std::unique_ptr<Communicator> MakeLocalCommunicator() {
  return std::make_unique<LocalCommunicator>();
}

void RegisterCommunicator(std::string name, CommunicatorFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard lock(r.mu);
  r.factories[std::move(name)] = std::move(factory);
}

Result<std::unique_ptr<Communicator>> CreateCommunicator(std::string_view name) {
  Registry& r = GetRegistry();
  CommunicatorFactory factory;
  {
    std::lock_guard lock(r.mu);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      std::string known;
      for (const auto& [n, f] : r.factories) known += (known.empty() ? "" : ", ") + n;
      return InvalidArgument("communicator '{}' is not available in this build (available: {})",
                             name, known);
    }
    factory = it->second;
  }
  return factory();
}

std::vector<std::string> RegisteredCommunicators() {
  Registry& r = GetRegistry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [n, f] : r.factories) names.push_back(n);
  return names;
}

}  // namespace dh::comm
