// Tensor-parallel partitions and the block all-reduce (parallel.h).
#include "model/layers/parallel.h"

#include <string>

#include "base/check.h"
#include "base/trace.h"

#include <fmt/format.h>

namespace dh {
namespace {

// "1, 2, 4" for 4: the tensor-parallel sizes that divide `total`.
std::string Divisors(int64_t total) {
  std::string out;
  for (int64_t d = 1; d <= total && d <= 1024; ++d) {
    if (total % d == 0) out += fmt::format("{}{}", out.empty() ? "" : ", ", d);
  }
  return out;
}

}  // namespace

Status ValidateParallel(const ParallelOptions& p) {
  if (p.size < 1 || p.rank < 0 || p.rank >= p.size) {
    return InvalidArgument("--tp-size {}: rank {} is outside it", p.size, p.rank);
  }
  if (p.size > 1 && (p.comm == nullptr || p.comm->Size() != p.size)) {
    return InvalidArgument("--tp-size {}: the communicator has {} ranks", p.size,
                           p.comm == nullptr ? 1 : p.comm->Size());
  }
  if (p.ep_size != 0 && p.ep_size != 1 && p.ep_size != p.size) {
    return InvalidArgument("--ep-size {}: expected 1 or the --tp-size ({})", p.ep_size, p.size);
  }
  return Status::Ok();
}

TensorParallel TensorParallel::From(const LoadOptions& options) {
  const ParallelOptions& p = options.parallel;
  TensorParallel tp;
  tp.rank = p.rank;
  tp.size = p.size;
  tp.ep_size = p.ep_size == 0 ? p.size : p.ep_size;
  tp.comm = p.comm;
  return tp;
}

Result<PartRange> TensorParallel::Split(int64_t total, std::string_view what) const {
  if (total % size != 0) {
    return InvalidArgument("config.json: {} {} does not divide by --tp-size {}; sizes that do: {}",
                           what, total, size, Divisors(total));
  }
  const int64_t per = total / size;
  return PartRange{rank * per, per};
}

Result<PartRange> TensorParallel::KvHeads(int64_t kv_heads, int64_t q_heads) const {
  // A size works when it divides the query heads and the kv heads divide over it, or it over them.
  auto works = [&](int64_t s) {
    return q_heads % s == 0 && (kv_heads % s == 0 || s % kv_heads == 0);
  };
  if (!works(size)) {
    std::string sizes;
    for (int64_t s = 1; s <= q_heads && s <= 1024; ++s) {
      if (works(s)) sizes += fmt::format("{}{}", sizes.empty() ? "" : ", ", s);
    }
    return InvalidArgument("config.json: num_key_value_heads {} with num_attention_heads {} does "
                           "not divide over --tp-size {}; sizes that do: {}", kv_heads, q_heads,
                           size, sizes);
  }
  if (kv_heads >= size) return PartRange{rank * (kv_heads / size), kv_heads / size};
  // Fewer kv heads than ranks: this rank's query heads all read the one kv head of their group.
  return PartRange{static_cast<int64_t>(rank) * kv_heads / size, 1};
}

Result<PartRange> TensorParallel::Experts(int64_t n_experts) const {
  if (ep_size == 1) return PartRange{0, n_experts};
  if (n_experts % ep_size != 0) {
    return InvalidArgument("config.json: n_routed_experts {} does not divide by --ep-size {}; "
                           "sizes that do: {}", n_experts, ep_size, Divisors(n_experts));
  }
  const int64_t per = n_experts / ep_size;
  return PartRange{rank * per, per};
}

MatrixSlice TensorParallel::Rows(PartRange part, int64_t per_unit, int64_t total_units) {
  if (part.first == 0 && part.count == total_units) return MatrixSlice{};
  return MatrixSlice::Rows(part.first * per_unit, part.count * per_unit);
}

MatrixSlice TensorParallel::Cols(PartRange part, int64_t per_unit, int64_t total_units) {
  if (part.first == 0 && part.count == total_units) return MatrixSlice{};
  return MatrixSlice::Cols(part.first * per_unit, part.count * per_unit);
}

Status TensorParallel::AllReduce(Backend& backend, const Tensor& x,
                                 std::vector<float>* staging) const {
  if (size == 1) return Status::Ok();
  DH_CHECK(x.dtype == DType::kF32 && x.contiguous(), "all-reduce of {}", x.ShapeString());
  TraceSpan span("all_reduce");
  if (span.active()) {
    span.SetArgs(fmt::format("{}, {}", JsonArg("bytes", static_cast<double>(x.nbytes())),
                             JsonArg("ranks", size)));
  }
  const size_t n = static_cast<size_t>(x.numel());
  if (staging->size() < n) staging->resize(n);
  backend.CopyToHost(staging->data(), x);
  Status st = comm->AllReduceSum(staging->data(), n, DType::kF32);
  if (!st.ok()) return st.WithContext(fmt::format("tensor-parallel all-reduce on rank {}", rank));
  backend.CopyToDevice(x, staging->data());
  return Status::Ok();
}

}  // namespace dh
