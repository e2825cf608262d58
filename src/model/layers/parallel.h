// Tensor parallelism inside the model (docs/parallel.md, Megatron-style): which part of a split
// dimension (heads, MLP columns, experts) this rank holds, the matrix slices it loads, and the
// all-reduce that sums the partial outputs of a block. Other ranks are reached only through
// comm/communicator.h. With one rank every helper is the identity and nothing is communicated.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "weights/weight_loader.h"

namespace dh {

// A contiguous run of items (heads, experts) of a split dimension.
struct PartRange {
  int64_t first = 0, count = 0;
};

struct TensorParallel {
  int rank = 0, size = 1;
  int ep_size = 1;  // groups the routed experts are distributed over: a divisor of size
  comm::Communicator* comm = nullptr;

  // From LoadOptions::parallel (validated there: see ValidateParallel).
  static TensorParallel From(const LoadOptions& options);
  bool enabled() const { return size > 1; }

  // This rank's share of `total` items of config field `what`: an error naming the field and the
  // tensor-parallel sizes that divide it when `total` does not divide by size.
  Result<PartRange> Split(int64_t total, std::string_view what) const;
  // The key/value heads this rank needs for its query heads: total / size of them, or (fewer kv
  // heads than ranks) the single kv head its query heads share, replicated on several ranks.
  Result<PartRange> KvHeads(int64_t kv_heads, int64_t q_heads) const;
  // The routed experts this rank computes: those of its expert group (rank / (size / ep_size)),
  // all of them when ep_size is 1.
  Result<PartRange> Experts(int64_t n_experts) const;
  // The columns of each of its experts' intermediate (moe_intermediate_size) this rank computes:
  // all of them when ep_size == size, else a 1 / (size / ep_size) share, the experts of a group
  // being split over its ranks like a dense MLP.
  Result<PartRange> ExpertColumns(int64_t intermediate) const;
  // Rank `r`'s rows of the vocabulary (lm_head): ceil(vocab / size) each, the last rank fewer.
  PartRange VocabRows(int64_t vocab, int r) const;

  // Matrix slices of `per_unit` rows (columns) per item of `part`.
  static MatrixSlice Rows(PartRange part, int64_t per_unit, int64_t total_units);
  static MatrixSlice Cols(PartRange part, int64_t per_unit, int64_t total_units);

  // In place: x = sum over ranks of x ([T, hidden] f32 partial sums of a block). `staging` is a
  // reusable host buffer for backends whose memory is not host memory.
  Status AllReduce(Backend& backend, const Tensor& x, std::vector<float>* staging) const;
  // `local` holds [rows, VocabRows(vocab, rank).count] logits of this rank's vocabulary slice;
  // writes the whole [rows, vocab] to *logits on every rank, or on rank 0 only (the other ranks'
  // *logits is then left empty) when `rank0_only`.
  Status GatherLogits(std::span<const float> local, int64_t rows, int64_t vocab, bool rank0_only,
                      std::vector<float>* logits) const;
};

// The checks on LoadOptions::parallel that do not need the model: rank inside size, a
// communicator of that size, ep_size 0 or a divisor of size.
Status ValidateParallel(const ParallelOptions& p);

}  // namespace dh
