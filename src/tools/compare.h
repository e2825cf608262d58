// `deepharness compare`: runs every prompt of a JSONL file on two OpenAI-compatible endpoints
// (greedy, plus seeded sampled runs), measures how alike the answers are (compare_metrics.h) and
// reports per prompt and overall, with pass/fail against thresholds (compare_report.h).
// Only the public API is used — /v1/models, /v1/completions for {"prompt": ...} lines,
// /v1/chat/completions for {"messages": [...]} lines, with logprobs + top_logprobs — so vLLM,
// llama.cpp's server and ours all work; a local model is served on a private loopback port by the
// caller (apps/cmd_compare.cc) and measured through this same client.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "tools/compare_metrics.h"

namespace dh::tools {

struct ComparePrompt {
  int line = 0;             // 1-based line in the file
  std::string id;           // "id" field, else "line N"
  bool chat = false;        // messages (chat) or prompt (completion)
  std::string prompt;       // completion prompt
  nlohmann::json messages;  // chat messages
};

// Reads the JSONL file. Errors are "FILE:LINE: <what was expected>" (blank lines are skipped).
Result<std::vector<ComparePrompt>> ReadComparePrompts(const std::string& path);

// A target as given on the command line: an http:// URL (optionally ",name=SERVED_MODEL"), or a
// local model spec "model=DIR[,device=cpu][,dtype=auto][,quant=none][,tp=1][,threads=N]".
struct CompareTargetSpec {
  bool local = false;
  std::string url;         // URL targets: base URL as given
  std::string model_name;  // URL targets: served model name (empty: the first of /v1/models)
  std::string model_path;  // local targets
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string quant = "none";
  int tp = 1;
  int threads = 0;
  std::string text;  // as given, for reports
};

// `flag` names the option in errors ("--a").
Result<CompareTargetSpec> ParseCompareTarget(const std::string& text, const std::string& flag);

struct CompareOptions {
  int max_tokens = 32;
  int top_logprobs = 5;  // alternatives per token (our /v1/completions allows up to 5)
  int samples = 2;       // seeded sampled runs per prompt (0: greedy only)
  uint64_t seed = 1234;  // sampled run i uses seed + i
  double temperature = 0.8;
  double top_p = 0.95;
  int concurrency = 1;  // prompts in flight (1: batch composition cannot change the numbers)
  int timeout_s = 600;
  bool progress = true;
  std::string api_key;  // sent to URL targets (Bearer)
};

Status CheckCompareOptions(const CompareOptions& o);

// One endpoint: base URL (http://HOST:PORT[/prefix]) and the model name to send.
struct CompareEndpoint {
  std::string url;
  std::string model;  // empty: resolved from /v1/models
  std::string label;  // "a" / "b"
};

struct CompareRun {
  std::string mode;  // "greedy" or "sampled"
  uint64_t seed = 0;
  CompareCompletion a, b;
  PairMetrics metrics;
};

struct ComparePromptResult {
  const ComparePrompt* prompt = nullptr;
  std::vector<CompareRun> runs;  // greedy first, then the sampled runs
};

struct CompareResult {
  std::vector<ComparePromptResult> prompts;
  ModeSummary greedy, sampled;
  std::string model_a, model_b;  // resolved served names
  double seconds = 0;
};

// Resolves both endpoints' model names, then runs everything. A failed request (HTTP error, a
// malformed response) stops the run with an error naming the target, the prompt's line and the
// server's message.
Result<CompareResult> RunCompare(const std::vector<ComparePrompt>& prompts, CompareEndpoint a,
                                 CompareEndpoint b, const CompareOptions& options);

}  // namespace dh::tools
