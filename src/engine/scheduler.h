// Scheduler: continuous batching as pure bookkeeping over a BlockPool (no model, no tensors).
// Each step hands out a token budget: running sequences first (oldest first; a decode costs one
// token, an unfinished prefill continues in chunks), then waiting ones in FIFO order, their
// prefills chunked to fit. When blocks run out, the newest running sequence is preempted: its
// blocks are freed and it goes back to the front of the waiting queue, to be recomputed (prompt
// plus output so far) later. A sequence's uncomputed tokens are token_ids[num_computed_tokens:].
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "kvcache/block_pool.h"

namespace dh {

struct Sequence {
  int64_t seq_id = 0;
  std::vector<int32_t> token_ids;  // prompt + generated + drafts
  int num_prompt_tokens = 0;
  int num_computed_tokens = 0;   // tokens whose KV is in the cache
  int num_cached_tokens = -1;    // prefix-cache hit at first scheduling; -1: never scheduled
  bool use_prefix_cache = true;  // false for requests that need every prompt logit
  bool all_logits = false;       // needs a logits row per computed token (prompt logprobs)
  bool running = false;
  // Speculative decoding (docs/mtp.md): the last num_draft_tokens of token_ids are drafts, not
  // yet verified; the step computes them with the last real token and keeps the accepted ones.
  // The scheduler drops them when the step cannot take them whole, and on preemption.
  int num_draft_tokens = 0;
  SequenceBlocks blocks;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_generated() const { return num_tokens() - num_draft_tokens - num_prompt_tokens; }
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int start = 0;       // first position computed this step
  int num_tokens = 0;  // positions [start, start + num_tokens)
  // True when the chunk reaches the end of the sequence's tokens: its last logits row samples.
  bool samples = false;
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  std::vector<Sequence*> preempted;
  int num_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  // Tokens per step of sequences with all_logits: bounds the [rows, vocab] logits a step makes.
  int max_num_logit_rows = 256;
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, BlockPool& pool);

  void AddWaiting(Sequence* seq);  // at the back of the queue
  // Plans one step and reserves its KV slots.
  SchedulerOutput Schedule();
  // After the forward pass of `out`: marks the chunks computed and caches full blocks. Call
  // before appending sampled tokens.
  void CompleteStep(const SchedulerOutput& out);
  // Removes a finished or aborted sequence from whichever queue holds it and frees its blocks.
  void Remove(Sequence* seq);

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  int64_t num_preemptions() const { return num_preemptions_; }
  BlockPool& pool() { return pool_; }

 private:
  void Preempt(Sequence* seq);
  void DropDrafts(Sequence* seq);

  SchedulerConfig config_;
  BlockPool& pool_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order: back = newest
  int64_t num_preemptions_ = 0;
};

}  // namespace dh
