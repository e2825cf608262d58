// Prometheus metrics in the text exposition format, with vLLM's names, types and bucket layouts
// under a configurable prefix ("deepharness:" by default, "vllm:" so existing vLLM dashboards
// work), plus what vLLM does not export: KV pool fragmentation, free/used/cached blocks, model
// load time and resident memory. Thread-safe: HTTP threads observe, /metrics renders.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace dh::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  // Appends `<name>_bucket{...,le="..."}`, `_sum` and `_count` lines; `labels` is `a="b",c="d"`.
  void Render(const std::string& name, const std::string& labels, std::string* out) const;
  uint64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t total_ = 0;
};

// Scrape-time values read from the engine and the process.
struct EngineSnapshot {
  int64_t num_requests_running = 0;
  int64_t num_requests_waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;     // not referenced (includes cached-but-evictable blocks)
  int64_t kv_blocks_used = 0;     // referenced by a live sequence
  int64_t kv_blocks_cached = 0;   // holding a reusable prefix hash
  double kv_fragmentation = 0;    // unused slots in partly filled blocks / slots of used blocks
  int64_t kv_block_size = 0;
  int64_t kv_capacity_tokens = 0;   // tokens the pool holds (blocks * block size)
  uint64_t kv_bytes_per_token = 0;  // in the cache dtype, scales included
  std::string kv_cache_dtype;       // --kv-cache-dtype: auto, bf16, fp8, int8
  uint64_t prefix_cache_queries = 0;  // tokens
  uint64_t prefix_cache_hits = 0;     // tokens
  uint64_t num_preemptions = 0;
  uint64_t prompt_tokens = 0;      // prefill tokens processed
  uint64_t generation_tokens = 0;  // tokens sampled
  // Speculative decoding (serve --speculative mtp): rendered only when num_speculative_tokens > 0.
  int num_speculative_tokens = 0;
  uint64_t spec_num_drafts = 0;       // verifications of a sequence with drafts
  uint64_t spec_draft_tokens = 0;     // drafts verified
  uint64_t spec_accepted_tokens = 0;  // of those, accepted
  std::vector<uint64_t> spec_accepted_per_pos;  // [j]: verifications that accepted draft j + 1
  double model_load_seconds = 0;
  int64_t resident_memory_bytes = 0;
};

// Tensor parallelism (serve --tp-size N), read at scrape time: each rank's weight bytes and its
// resident memory as last gathered by rank 0 (index = rank; empty before the first gather).
struct ParallelSnapshot {
  std::vector<uint64_t> rank_weight_bytes;
  std::vector<int64_t> rank_resident_bytes;
};

// What one finished request contributes (times in seconds).
struct RequestRecord {
  std::string finished_reason;  // stop | length | abort | error
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t max_tokens = 0;
  int n = 1;
  double ttft = -1;            // < 0 when no token was produced
  std::vector<double> itls;    // gaps between consecutive output tokens
  double e2e = 0;
  double queue_time = 0;
  double prefill_time = 0;
  double decode_time = 0;
};

class ServerMetrics {
 public:
  ServerMetrics(std::string prefix, std::string model_name, int64_t max_model_len);

  void RecordRequest(const RequestRecord& record);
  // Called for every admitted request (request_params histograms are filled at the end).
  void RecordRejected(const std::string& reason);
  // Tensor parallelism: rank 0's collectives in one engine step.
  void RecordStepCollectives(double seconds, uint64_t bytes, uint64_t calls);

  // `parallel`: the tensor-parallel section, rendered only when given.
  std::string Render(const EngineSnapshot& snapshot,
                     const ParallelSnapshot* parallel = nullptr) const;
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  std::string labels_;  // model_name="...",engine="0"
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> success_by_reason_;
  std::map<std::string, uint64_t> rejected_by_reason_;
  Histogram ttft_, itl_, tpot_, e2e_, queue_, inference_, prefill_, decode_;
  Histogram prompt_len_, gen_len_, max_gen_, params_n_, params_max_tokens_;
  Histogram step_collective_seconds_;
  uint64_t collective_bytes_ = 0, collective_calls_ = 0;  // guarded by mu_
};

// Escapes a Prometheus label value (backslash, quote, newline).
std::string EscapeLabelValue(const std::string& value);
// Resident set size of this process in bytes (0 when /proc is unavailable).
int64_t ResidentMemoryBytes();

}  // namespace dh::server
