// Prometheus text rendering of the server metrics; names and buckets follow vLLM's
// vllm/v1/metrics/loggers.py so dashboards port by switching the prefix.
#include "server/metrics.h"

#include <cstdio>
#include <unistd.h>

#include <fmt/format.h>

namespace dh::server {
namespace {

std::vector<double> TtftBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> ItlBuckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> LatencyBuckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}
// 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's build_1_2_5_buckets).
std::vector<double> Buckets125(int64_t max) {
  std::vector<double> out;
  for (double scale = 1; out.size() < 64; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * scale > static_cast<double>(max)) return out;
      out.push_back(m * scale);
    }
  }
  return out;
}

std::string FormatValue(double v) { return fmt::format("{}", v); }

void Header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void Sample(std::string* out, const std::string& name, const std::string& labels, double v) {
  *out += fmt::format("{}{{{}}} {}\n", name, labels, FormatValue(v));
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[i];
  sum_ += value;
  ++total_;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, FormatValue(bounds_[i]),
                        cumulative);
  }
  *out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, total_);
  *out += fmt::format("{}_sum{{{}}} {}\n", name, labels, FormatValue(sum_));
  *out += fmt::format("{}_count{{{}}} {}\n", name, labels, total_);
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

int64_t ResidentMemoryBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long pages_total = 0, pages_resident = 0;
  int got = std::fscanf(f, "%lld %lld", &pages_total, &pages_resident);
  std::fclose(f);
  if (got != 2) return 0;
  return static_cast<int64_t>(pages_resident) * sysconf(_SC_PAGESIZE);
}

ServerMetrics::ServerMetrics(std::string prefix, std::string model_name, int64_t max_model_len)
    : prefix_(std::move(prefix)),
      labels_(fmt::format("model_name=\"{}\",engine=\"0\"", EscapeLabelValue(model_name))),
      ttft_(TtftBuckets()),
      itl_(ItlBuckets()),
      tpot_(ItlBuckets()),
      e2e_(LatencyBuckets()),
      queue_(LatencyBuckets()),
      inference_(LatencyBuckets()),
      prefill_(LatencyBuckets()),
      decode_(LatencyBuckets()),
      prompt_len_(Buckets125(max_model_len)),
      gen_len_(Buckets125(max_model_len)),
      max_gen_(Buckets125(max_model_len)),
      params_n_({1, 2, 5, 10, 20}),
      params_max_tokens_(Buckets125(max_model_len)),
      // 50 us (an all-reduce on one host) to 2.5 s (a slow network, a long prefill).
      step_collective_seconds_({5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
                                0.1, 0.25, 0.5, 1.0, 2.5}) {}

void ServerMetrics::RecordRequest(const RequestRecord& r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++success_by_reason_[r.finished_reason];
  }
  if (r.ttft >= 0) ttft_.Observe(r.ttft);
  for (double gap : r.itls) itl_.Observe(gap);
  if (r.generation_tokens > 1 && r.ttft >= 0)
    tpot_.Observe((r.e2e - r.ttft) / static_cast<double>(r.generation_tokens - 1));
  e2e_.Observe(r.e2e);
  queue_.Observe(r.queue_time);
  inference_.Observe(r.prefill_time + r.decode_time);
  prefill_.Observe(r.prefill_time);
  decode_.Observe(r.decode_time);
  prompt_len_.Observe(static_cast<double>(r.prompt_tokens));
  gen_len_.Observe(static_cast<double>(r.generation_tokens));
  max_gen_.Observe(static_cast<double>(r.generation_tokens));
  params_n_.Observe(r.n);
  params_max_tokens_.Observe(static_cast<double>(r.max_tokens));
}

void ServerMetrics::RecordStepCollectives(double seconds, uint64_t bytes, uint64_t calls) {
  step_collective_seconds_.Observe(seconds);
  std::lock_guard<std::mutex> lock(mu_);
  collective_bytes_ += bytes;
  collective_calls_ += calls;
}

void ServerMetrics::RecordRejected(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++rejected_by_reason_[reason];
}

std::string ServerMetrics::Render(const EngineSnapshot& s, const ParallelSnapshot* parallel) const {
  std::string out;
  const std::string& p = prefix_;
  auto gauge = [&](const char* name, const char* help, double v) {
    Header(&out, p + name, "gauge", help);
    Sample(&out, p + name, labels_, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    Header(&out, p + name, "counter", help);
    Sample(&out, p + name + "_total", labels_, v);
  };
  gauge("num_requests_running", "Number of requests in model execution batches.",
        s.num_requests_running);
  gauge("num_requests_waiting", "Number of requests waiting to be processed.",
        s.num_requests_waiting);
  gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
        s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks_total : 0.0);
  counter("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
          static_cast<double>(s.prefix_cache_queries));
  counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
          static_cast<double>(s.prefix_cache_hits));
  counter("num_preemptions", "Cumulative number of preemptions from the engine.",
          static_cast<double>(s.num_preemptions));
  std::map<std::string, uint64_t> success, rejected;
  {
    std::lock_guard<std::mutex> lock(mu_);
    success = success_by_reason_;
    rejected = rejected_by_reason_;
  }
  counter("prompt_tokens", "Number of prefill tokens processed.", static_cast<double>(s.prompt_tokens));
  counter("generation_tokens", "Number of generation tokens processed.",
          static_cast<double>(s.generation_tokens));
  if (s.num_speculative_tokens > 0) {
    counter("spec_decode_num_drafts", "Number of spec decoding drafts.",
            static_cast<double>(s.spec_num_drafts));
    counter("spec_decode_num_draft_tokens", "Number of draft tokens.",
            static_cast<double>(s.spec_draft_tokens));
    counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.",
            static_cast<double>(s.spec_accepted_tokens));
    Header(&out, p + "spec_decode_num_accepted_tokens_per_pos", "counter",
           "Accepted tokens per draft position.");
    for (size_t j = 0; j < s.spec_accepted_per_pos.size(); ++j) {
      Sample(&out, p + "spec_decode_num_accepted_tokens_per_pos_total",
             labels_ + fmt::format(",position=\"{}\"", j),
             static_cast<double>(s.spec_accepted_per_pos[j]));
    }
  }
  Header(&out, p + "request_success", "counter", "Count of successfully processed requests.");
  for (const char* reason : {"stop", "length", "abort"}) success.try_emplace(reason, 0);
  for (const auto& [reason, n] : success) {
    Sample(&out, p + "request_success_total",
           labels_ + fmt::format(",finished_reason=\"{}\"", EscapeLabelValue(reason)),
           static_cast<double>(n));
  }
  Header(&out, p + "request_rejected", "counter",
         "Requests refused before admission, by reason (queue_full, draining, invalid).");
  for (const char* reason : {"queue_full", "draining"}) rejected.try_emplace(reason, 0);
  for (const auto& [reason, n] : rejected) {
    Sample(&out, p + "request_rejected_total",
           labels_ + fmt::format(",reason=\"{}\"", EscapeLabelValue(reason)),
           static_cast<double>(n));
  }
  auto hist = [&](const char* name, const char* help, const Histogram& h) {
    Header(&out, p + name, "histogram", help);
    h.Render(p + name, labels_, &out);
  };
  hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_);
  hist("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_);
  hist("request_time_per_output_token_seconds",
       "Histogram of time_per_output_token_seconds per request.", tpot_);
  hist("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2e_);
  hist("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
       queue_);
  hist("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
       inference_);
  hist("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
       prefill_);
  hist("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
       decode_);
  hist("request_prompt_tokens", "Number of prefill tokens processed.", prompt_len_);
  hist("request_generation_tokens", "Number of generation tokens processed.", gen_len_);
  hist("request_max_num_generation_tokens",
       "Histogram of maximum number of requested generation tokens.", max_gen_);
  hist("request_params_n", "Histogram of the n request parameter.", params_n_);
  hist("request_params_max_tokens", "Histogram of the max_tokens request parameter.",
       params_max_tokens_);
  // Beyond vLLM.
  gauge("kv_cache_blocks_total", "KV-cache blocks in the pool.", s.kv_blocks_total);
  gauge("kv_cache_blocks_free", "KV-cache blocks not referenced by any sequence.", s.kv_blocks_free);
  gauge("kv_cache_blocks_used", "KV-cache blocks referenced by live sequences.", s.kv_blocks_used);
  gauge("kv_cache_blocks_cached", "KV-cache blocks holding a reusable prefix.", s.kv_blocks_cached);
  // vLLM's cache configuration gauge: always 1, the settings are its labels.
  Header(&out, p + "cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
  Sample(&out, p + "cache_config_info",
         fmt::format("block_size=\"{}\",cache_dtype=\"{}\",num_gpu_blocks=\"{}\",{}",
                     s.kv_block_size, EscapeLabelValue(s.kv_cache_dtype), s.kv_blocks_total,
                     labels_),
         1.0);
  gauge("kv_cache_capacity_tokens", "Tokens the KV-cache pool holds (blocks x block size).",
        static_cast<double>(s.kv_capacity_tokens));
  gauge("kv_cache_bytes_per_token",
        "KV-cache bytes per token over all layers, in the cache dtype (scales included).",
        static_cast<double>(s.kv_bytes_per_token));
  gauge("kv_cache_fragmentation_ratio",
        "Unused token slots in partly filled KV blocks / token slots of used blocks.",
        s.kv_fragmentation);
  gauge("model_load_time_seconds", "Seconds spent loading the model at startup.",
        s.model_load_seconds);
  gauge("resident_memory_bytes", "Resident set size of the server process.",
        static_cast<double>(s.resident_memory_bytes));
  if (parallel == nullptr) return out;
  // Tensor parallelism (docs/parallel.md): the communication time of a step, and per rank (a
  // label bounded by --tp-size) its weights and resident memory.
  hist("tensor_parallel_step_collective_seconds",
       "Seconds rank 0 spent in collectives (step broadcast, all-reduces, logits gather) per "
       "engine step.", step_collective_seconds_);
  uint64_t bytes = 0, calls = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes = collective_bytes_;
    calls = collective_calls_;
  }
  counter("tensor_parallel_collective_bytes", "Bytes rank 0 handed to collectives.",
          static_cast<double>(bytes));
  counter("tensor_parallel_collective_calls", "Collective calls made by rank 0.",
          static_cast<double>(calls));
  gauge("tensor_parallel_ranks", "Ranks the model is split over (--tp-size).",
        static_cast<double>(parallel->rank_weight_bytes.size()));
  auto per_rank = [&](const char* name, const char* help, const auto& values) {
    Header(&out, p + name, "gauge", help);
    for (size_t r = 0; r < values.size(); ++r) {
      Sample(&out, p + name, labels_ + fmt::format(",rank=\"{}\"", r),
             static_cast<double>(values[r]));
    }
  };
  per_rank("tensor_parallel_rank_weight_bytes", "Bytes of model weights each rank holds.",
           parallel->rank_weight_bytes);
  per_rank("tensor_parallel_rank_resident_memory_bytes",
           "Resident set size of each rank, gathered by rank 0 about once a second.",
           parallel->rank_resident_bytes);
  return out;
}

}  // namespace dh::server
