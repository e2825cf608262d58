// `deepharness bench serve`: a streaming load generator for any OpenAI-compatible server,
// reporting the metrics of `vllm bench serve` with the same definitions and JSON keys
// (conventions.md g.1): TTFT, TPOT, ITL, E2EL (mean/median/std/p99, ms), request and token
// throughput, plus the error rate. Prompts are token-id slices of natural text (tokenized once
// through the server's /tokenize) in a short/medium/long mix scaled to the model's context.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dh::tools {

struct PromptClass {
  std::string name;   // short | medium | long
  int input_tokens;   // prompt length
  int output_tokens;  // max_tokens (ignore_eos makes it exact)
};

struct BenchServeOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;    // empty: the first model of GET /v1/models
  std::string api_key;  // empty: env DEEPHARNESS_API_KEY, else none
  int concurrency = 8;
  int num_prompts = 100;
  std::vector<std::pair<std::string, int>> mix = {{"short", 20}, {"medium", 60}, {"long", 20}};
  double request_rate = std::numeric_limits<double>::infinity();  // req/s, Poisson; inf: no pacing
  double duration_s = 0;  // > 0: keep sending until this many seconds have passed
  uint64_t seed = 0;
  bool ignore_eos = true;
  double temperature = 0.0;
  int timeout_s = 600;
  bool detailed = false;  // JSON also lists every request (class, tokens, text), in plan order
};

// One request as the client saw it (times in seconds).
struct RequestResult {
  int index = 0;  // position in the plan (stable across concurrency levels for the same seed)
  bool success = false;
  int status = 0;
  std::string error;
  std::string prompt_class;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  double ttft = 0;
  double latency = 0;
  std::vector<double> itl;
  std::string text;
};

struct LatencyStats {
  double mean = 0, median = 0, std = 0, p99 = 0;  // milliseconds
};

struct BenchServeResult {
  std::string model;
  int max_model_len = 0;
  std::vector<PromptClass> classes;
  int num_requests = 0;
  int completed = 0;
  int failed = 0;
  std::map<int, int> status_counts;  // HTTP status -> requests (0: connection error)
  std::vector<std::string> sample_errors;
  double duration_s = 0;
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  double request_throughput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  double error_rate = 0;  // failed / requests
  LatencyStats ttft, tpot, itl, e2el;
  std::vector<RequestResult> requests;
};

// Parses "short:20,medium:60,long:20" (weights, any positive integers).
Result<std::vector<std::pair<std::string, int>>> ParseMix(const std::string& text);
// Lengths of each class for a model with `max_model_len` tokens of context.
std::vector<PromptClass> ScaledClasses(int max_model_len);
// Mean, median, population std and linearly interpolated p99 (numpy's default), in ms of the
// given seconds.
LatencyStats ComputeStats(std::vector<double> seconds);

Result<BenchServeResult> RunBenchServe(const BenchServeOptions& options);

std::string FormatTable(const BenchServeResult& result, const BenchServeOptions& options);
std::string FormatJson(const BenchServeResult& result, const BenchServeOptions& options);

}  // namespace dh::tools
