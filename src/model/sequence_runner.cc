// SequenceRunner: blocks 0..n-1 of a private pool, in order.
#include "model/sequence_runner.h"

namespace dh {

namespace {
constexpr int kBlockSize = 16;
}

Result<std::unique_ptr<SequenceRunner>> SequenceRunner::Create(Model& model, Backend& backend,
                                                               int max_tokens) {
  if (max_tokens <= 0) return InvalidArgument("max tokens must be positive, got {}", max_tokens);
  auto r = std::make_unique<SequenceRunner>();
  r->model_ = &model;
  const int blocks = (max_tokens + kBlockSize - 1) / kBlockSize;
  DH_ASSIGN_OR_RETURN(r->kv_, KvStorage::Allocate(backend, model.kv_spec(), blocks, kBlockSize));
  r->block_table_.resize(blocks);
  for (int i = 0; i < blocks; ++i) r->block_table_[i] = i;
  r->capacity_ = blocks * kBlockSize;
  return r;
}

Result<std::vector<float>> SequenceRunner::Feed(std::span<const int32_t> ids, bool all_logits) {
  if (ids.empty()) return InvalidArgument("no tokens to feed");
  if (num_cached_ + static_cast<int64_t>(ids.size()) > capacity_) {
    return OutOfRange("sequence of {} tokens exceeds the cache of {} tokens",
                      num_cached_ + ids.size(), capacity_);
  }
  Batch batch;
  const int used_blocks = (num_cached_ + static_cast<int>(ids.size()) + kBlockSize - 1) / kBlockSize;
  batch.AddSequence(ids, num_cached_, std::span(block_table_).first(used_blocks), kBlockSize,
                    all_logits);
  std::vector<float> logits;
  DH_RETURN_IF_ERROR(model_->Forward(batch, *kv_, &logits));
  num_cached_ += static_cast<int>(ids.size());
  return logits;
}

int32_t ArgMax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace dh
