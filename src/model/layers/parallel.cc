// Tensor-parallel partitions and the block all-reduce (parallel.h).
#include "model/layers/parallel.h"

#include <algorithm>
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
  if (p.ep_size < 0 || (p.ep_size != 0 && p.size % p.ep_size != 0)) {
    return InvalidArgument("--ep-size {}: expected a divisor of --tp-size {}: {}", p.ep_size,
                           p.size, Divisors(p.size));
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
  return PartRange{rank / (size / ep_size) * per, per};
}

Result<PartRange> TensorParallel::ExpertColumns(int64_t intermediate) const {
  const int share = size / ep_size;  // ranks holding the same experts
  if (share == 1) return PartRange{0, intermediate};
  if (intermediate % share != 0) {
    return InvalidArgument("config.json: moe_intermediate_size {} does not divide over the {} "
                           "ranks that share each expert (--tp-size {} / --ep-size {}); group "
                           "sizes that do: {}", intermediate, share, size, ep_size,
                           Divisors(intermediate));
  }
  const int64_t per = intermediate / share;
  return PartRange{rank % share * per, per};
}

PartRange TensorParallel::VocabRows(int64_t vocab, int r) const {
  const int64_t per = (vocab + size - 1) / size;
  const int64_t first = std::min<int64_t>(vocab, per * r);
  return PartRange{first, std::min(per, vocab - first)};
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

Status TensorParallel::GatherLogits(std::span<const float> local, int64_t rows, int64_t vocab,
                                    bool rank0_only, std::vector<float>* logits) const {
  if (rows == 0) {  // the same on every rank: no collective
    logits->clear();
    return Status::Ok();
  }
  // Each rank's [rows, part] block lands whole at its offset in `blocks` (rank order), then is
  // scattered into the columns of the [rows, vocab] result.
  std::vector<size_t> bytes(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  size_t total = 0;
  for (int r = 0; r < size; ++r) {
    bytes[r] = static_cast<size_t>(rows * VocabRows(vocab, r).count) * sizeof(float);
    offsets[r] = total;
    total += bytes[r];
  }
  DH_CHECK(local.size_bytes() == bytes[rank], "logits slice of {} floats on rank {}", local.size(),
           rank);
  std::vector<float> blocks(total / sizeof(float));
  if (rank0_only) {
    // A gather to rank 0 as a personalized exchange: every rank sends its block to rank 0 only.
    std::vector<size_t> send_bytes(bytes.size(), 0), zeros(bytes.size(), 0);
    send_bytes[0] = bytes[rank];
    const bool root = rank == 0;
    Status st = comm->AllToAllV(local.data(), send_bytes, zeros, blocks.data(),
                                root ? std::span<const size_t>(bytes) : zeros,
                                root ? std::span<const size_t>(offsets) : zeros);
    if (!st.ok()) return st.WithContext(fmt::format("gathering the logits on rank {}", rank));
    if (!root) {
      logits->clear();
      return Status::Ok();
    }
  } else {
    // All-gather needs equal blocks: pad every block to the first rank's (the largest) size.
    const size_t padded = bytes[0];
    std::vector<float> send(padded / sizeof(float), 0.0f), all(padded / sizeof(float) * size);
    std::copy(local.begin(), local.end(), send.begin());
    Status st = comm->AllGather(send.data(), padded, all.data());
    if (!st.ok()) return st.WithContext(fmt::format("gathering the logits on rank {}", rank));
    for (int r = 0; r < size; ++r) {
      std::copy_n(all.begin() + static_cast<ptrdiff_t>(r * padded / sizeof(float)),
                  bytes[r] / sizeof(float), blocks.begin() + static_cast<ptrdiff_t>(offsets[r] / sizeof(float)));
    }
  }
  logits->resize(static_cast<size_t>(rows * vocab));
  for (int r = 0; r < size; ++r) {
    const PartRange part = VocabRows(vocab, r);
    const float* block = blocks.data() + offsets[r] / sizeof(float);
    for (int64_t i = 0; i < rows; ++i) {
      std::copy_n(block + i * part.count, part.count, logits->data() + i * vocab + part.first);
    }
  }
  return Status::Ok();
}

}  // namespace dh
