// Scheduler: token budget, chunked prefill, prefix reuse and preemption by recompute.
#include "engine/scheduler.h"

#include <algorithm>

#include "base/check.h"

namespace dh {

Scheduler::Scheduler(SchedulerConfig config, BlockPool& pool) : config_(config), pool_(pool) {
  DH_CHECK(config.max_num_seqs > 0 && config.max_num_batched_tokens > 0,
           "max_num_seqs {} max_num_batched_tokens {}", config.max_num_seqs,
           config.max_num_batched_tokens);
}

void Scheduler::AddWaiting(Sequence* seq) {
  seq->running = false;
  waiting_.push_back(seq);
}

void Scheduler::DropDrafts(Sequence* seq) {
  seq->token_ids.resize(seq->token_ids.size() - static_cast<size_t>(seq->num_draft_tokens));
  seq->num_draft_tokens = 0;
  // The drafter reserved their slots; give back what the real tokens do not need.
  if (seq->blocks.num_slots > seq->num_tokens()) pool_.Truncate(seq->blocks, seq->num_tokens());
}

void Scheduler::Preempt(Sequence* seq) {
  if (seq->num_draft_tokens > 0) DropDrafts(seq);
  pool_.Release(seq->blocks);
  seq->num_computed_tokens = 0;
  seq->running = false;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  ++num_preemptions_;
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;
  int logit_rows = config_.max_num_logit_rows;
  auto chunk_size = [&](const Sequence* seq, int wanted) {
    const int n = std::min(wanted, budget);
    return seq->all_logits ? std::min(n, logit_rows) : n;
  };

  // Running sequences, oldest first. Victims come from the back, so they are never ones already
  // scheduled this step.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    DH_CHECK(seq->num_tokens() > seq->num_computed_tokens,
             "running sequence {} has nothing to compute", seq->seq_id);
    int n = chunk_size(seq, seq->num_tokens() - seq->num_computed_tokens);
    if (seq->num_draft_tokens > 0 && n < seq->num_tokens() - seq->num_computed_tokens) {
      DropDrafts(seq);  // drafts are verified whole or not at all
      n = chunk_size(seq, seq->num_tokens() - seq->num_computed_tokens);
    }
    if (n == 0) {  // out of logit rows: this one waits a step
      ++i;
      continue;
    }
    bool fits = true;
    // Drafts come with their slots already reserved (the drafter's cache needs them).
    while (!pool_.Reserve(seq->blocks,
                          std::max(0, seq->num_computed_tokens + n - seq->blocks.num_slots))) {
      Sequence* victim = running_.back();
      out.preempted.push_back(victim);
      Preempt(victim);
      if (victim == seq) {
        fits = false;
        break;
      }
    }
    if (!fits) break;  // seq was the newest: nothing after it remains
    out.chunks.push_back(
        {seq, seq->num_computed_tokens, n, seq->num_computed_tokens + n == seq->num_tokens()});
    out.num_tokens += n;
    budget -= n;
    if (seq->all_logits) logit_rows -= n;
    ++i;
  }

  // Waiting sequences, FIFO; none when this step had to preempt (the pool is tight).
  while (out.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    DH_CHECK(seq->blocks.block_ids.empty(), "waiting sequence {} holds blocks", seq->seq_id);
    int cached = 0;
    if (seq->use_prefix_cache) {
      // The last token is always computed: its logits sample the next token.
      cached = pool_.AcquireCachedPrefix(seq->blocks, seq->token_ids, seq->num_tokens() - 1);
    }
    const int n = chunk_size(seq, seq->num_tokens() - cached);
    if (n == 0 || !pool_.Reserve(seq->blocks, cached + n - seq->blocks.num_slots)) {
      pool_.Release(seq->blocks);  // give back the prefix; try again next step
      break;
    }
    waiting_.pop_front();
    if (seq->num_cached_tokens < 0) seq->num_cached_tokens = cached;
    seq->num_computed_tokens = cached;
    seq->running = true;
    running_.push_back(seq);
    out.chunks.push_back({seq, cached, n, cached + n == seq->num_tokens()});
    out.num_tokens += n;
    budget -= n;
    if (seq->all_logits) logit_rows -= n;
  }
  return out;
}

void Scheduler::CompleteStep(const SchedulerOutput& out) {
  for (const ScheduledChunk& c : out.chunks) {
    Sequence* seq = c.seq;
    DH_CHECK(seq->num_computed_tokens == c.start, "sequence {} computed {} but chunk starts at {}",
             seq->seq_id, seq->num_computed_tokens, c.start);
    seq->num_computed_tokens += c.num_tokens;
    pool_.CacheFullBlocks(seq->blocks, seq->token_ids, seq->num_computed_tokens);
  }
}

void Scheduler::Remove(Sequence* seq) {
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) {
    running_.erase(it);
  } else if (auto w = std::find(waiting_.begin(), waiting_.end(), seq); w != waiting_.end()) {
    waiting_.erase(w);
  }
  pool_.Release(seq->blocks);
  seq->running = false;
}

}  // namespace dh
