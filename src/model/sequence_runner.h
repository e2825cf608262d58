// SequenceRunner: one sequence at a time over its own small KV cache — the offline path behind
// `deepharness logits`, `generate` and `perplexity` and the golden tests. Serving goes through
// src/engine instead.
#pragma once

#include <memory>
#include <vector>

#include "model/model.h"

namespace dh {

class SequenceRunner {
 public:
  // Allocates a cache for up to `max_tokens` tokens.
  static Result<std::unique_ptr<SequenceRunner>> Create(Model& model, Backend& backend,
                                                        int max_tokens);

  // Starts a new sequence (the cache is reused).
  void Reset() { num_cached_ = 0; }
  int num_cached() const { return num_cached_; }
  int capacity() const { return capacity_; }

  // Feeds `ids` after the cached tokens. Returns logits for every fed token when all_logits,
  // else for the last one only: [rows, vocab] flattened.
  Result<std::vector<float>> Feed(std::span<const int32_t> ids, bool all_logits);

 private:
  Model* model_ = nullptr;
  std::unique_ptr<KvStorage> kv_;
  std::vector<int32_t> block_table_;
  int num_cached_ = 0;
  int capacity_ = 0;
};

// Greedy argmax (lowest id wins ties, like torch.argmax).
int32_t ArgMax(std::span<const float> logits);

}  // namespace dh
