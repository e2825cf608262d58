// Engine: the public API of the generation engine. One engine thread owns the Model, the paged
// KV cache and the Scheduler; any thread may Submit requests (native types only — JSON stays in
// src/server) and read their results from a per-request RequestHandle.
//
// Threading: every public method of Engine and RequestHandle is thread-safe. Forward passes run
// only on the engine thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "engine/types.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace dh {

namespace internal {
struct RequestChannel;
}  // namespace internal

// The submitter's end of one request. Destroying the handle before the request finished
// cancels it (so a dropped HTTP connection frees its KV blocks at the next engine step).
class RequestHandle {
 public:
  explicit RequestHandle(std::shared_ptr<internal::RequestChannel> channel);
  ~RequestHandle();
  RequestHandle(const RequestHandle&) = delete;
  RequestHandle& operator=(const RequestHandle&) = delete;

  const std::string& request_id() const;
  // Waits up to `timeout` for output; returns every pending event merged into one, or nullopt
  // on timeout. After the finished event has been returned, returns nullopt immediately.
  std::optional<RequestOutput> Next(std::chrono::milliseconds timeout);
  // Blocks until the request finishes; returns everything not yet read, merged.
  RequestOutput WaitFinished();
  // Asks the engine to abort the request (finish reason "abort"); its blocks are freed at the
  // start of the next engine step. A finished event still arrives.
  void Cancel();
  bool finished() const;  // the finished event has been returned by Next/WaitFinished

 private:
  std::shared_ptr<internal::RequestChannel> channel_;
  bool finished_read_ = false;
};

struct EngineOptions {
  int block_size = 16;
  // KV pool size in bytes; num_blocks = kv_cache_memory / (kv_spec.BytesPerToken() * block_size).
  // 0: DefaultKvCacheMemory(), but no more than max_num_seqs sequences of max_model_len need.
  uint64_t kv_cache_memory = 0;
  int num_kv_blocks = 0;              // > 0 overrides kv_cache_memory (tests)
  int max_num_seqs = 64;              // sequences per step
  int max_num_batched_tokens = 2048;  // tokens per step (decodes + prefill chunks)
  // Longest sequence (prompt + output); 0: the model's max_position_embeddings. Capped further by
  // the pool: a sequence never needs more blocks than exist.
  int max_model_len = 0;
  int max_queue_size = 1024;  // waiting requests; Submit beyond it is ResourceExhausted
  bool enable_prefix_caching = true;
  std::vector<int32_t> eos_token_ids;  // empty: from the tokenizer config and the model config
  // Speculative decoding with the model's MTP layer (--speculative mtp, docs/mtp.md): drafts per
  // step and sequence, 0 (off) or 1..kMaxSpeculativeTokens; needs Model::has_mtp().
  int num_speculative_tokens = 0;
};

inline constexpr int kMaxSpeculativeTokens = 8;

// Half of MemAvailable (from /proc/meminfo), at least 64 MiB.
uint64_t DefaultKvCacheMemory();

// A snapshot for /metrics and /health. Counters only grow.
struct EngineStats {
  bool started = false;
  bool draining = false;
  int num_running = 0;
  int num_waiting = 0;
  // KV pool (blocks): free + used == total; cached counts blocks holding a reusable prefix
  // (in use or evictable). usage = used / total.
  int kv_blocks_total = 0;
  int kv_blocks_free = 0;
  int kv_blocks_used = 0;
  int kv_blocks_cached = 0;
  int kv_block_size = 0;
  int64_t kv_capacity_tokens = 0;  // total * block_size: tokens the pool holds
  uint64_t kv_bytes_per_token = 0; // in the cache dtype, scales included
  std::string kv_cache_dtype;      // --kv-cache-dtype name: auto, bf16, fp8, int8
  double kv_usage = 0.0;
  double kv_fragmentation = 0.0;     // unused slots in partly filled blocks / slots of used blocks
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // of those, served from the cache
  int64_t num_preemptions = 0;
  int64_t prompt_tokens = 0;      // prompt tokens of requests that were scheduled
  int64_t generation_tokens = 0;  // tokens sampled
  int64_t num_steps = 0;
  int64_t requests_finished_stop = 0;
  int64_t requests_finished_length = 0;
  int64_t requests_finished_abort = 0;
  // Speculative decoding: verification steps of a sequence with drafts, draft tokens verified,
  // of those accepted, and accepted_per_pos[j]: verifications that accepted draft j + 1.
  int num_speculative_tokens = 0;
  int64_t spec_num_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_pos;
  EngineTime last_step{};  // heartbeat: when the engine thread last finished a step or idled
  int max_model_len = 0;   // the effective limit (prompt + output) after the pool cap
};

class Engine {
 public:
  // `tokenizer` may be null (token ids only, no text and no stop strings); it must outlive the
  // engine, as must `backend`.
  Engine(EngineOptions options, std::unique_ptr<Model> model, Backend& backend,
         const Tokenizer* tokenizer);
  ~Engine();  // Stop()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Allocates the KV pool and starts the engine thread. ResourceExhausted when the pool cannot
  // hold one block per sequence position of a minimal request.
  Status Start();

  // Validates and enqueues. Errors: InvalidArgument (empty prompt, bad ids or params, duplicate
  // id), OutOfRange (prompt + 1 token longer than max_model_len), ResourceExhausted (queue full),
  // Cancelled (draining or stopped).
  Result<std::shared_ptr<RequestHandle>> Submit(Request request);
  // Aborts a request in flight; false when no such request is queued or running.
  bool Cancel(const std::string& request_id);

  // Stops accepting requests and waits up to `timeout` for those in flight to finish; returns
  // true when all finished. Requests still running afterwards keep running (call Stop to abort).
  bool Drain(std::chrono::milliseconds timeout);
  // Aborts everything in flight (finish reason "abort"), then joins the engine thread.
  void Stop();

  EngineStats GetStats() const;
  const Model& model() const;
  const Tokenizer* tokenizer() const;
  const EngineOptions& options() const;
  int max_model_len() const;  // effective, valid after Start()

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dh
