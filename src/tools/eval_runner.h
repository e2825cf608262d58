// `deepharness eval`: runs MMLU, CMMLU, C-Eval (letter log-likelihoods) and GSM8K (8-shot CoT,
// greedy) against an OpenAI-compatible server with a bounded pool of workers, checkpoints the
// per-item records to the output file (so an interrupted run resumes) and scores them as
// lm-evaluation-harness does (eval_tasks.h). The report JSON holds the configuration, the scores
// and every item, so two reports compare item by item (eval_compare.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "tools/eval_client.h"

namespace dh::tools {

inline constexpr const char* kEvalTasks[] = {"mmlu", "cmmlu", "ceval", "gsm8k"};

struct EvalOptions {
  std::vector<std::string> tasks;  // subset of kEvalTasks
  std::string data_dir;            // one task: its folder; several: a folder with one per task
  int num_fewshot = -1;            // -1: 5 for the multiple-choice tasks, 8 for gsm8k
  int limit = 0;                   // > 0: the first N items per subject (gsm8k: N items)
  int concurrency = 1;
  int max_gen_toks = 256;  // gsm8k generation length (lm-eval's max_gen_toks)
  uint64_t seed = 1234;    // sent as the request seed; recorded
  std::string output;      // report JSON (also the checkpoint); empty: none
  bool resume = false;     // reuse matching records of an existing `output`
  bool progress = true;
  double checkpoint_interval_s = 10;
  EvalClientOptions client;
  nlohmann::json extra_config;  // recorded as config.extra (e.g. --model-path details)
};

// Checks the flags and loads the datasets (errors name the flag or the file), without running.
Status CheckEvalInputs(const EvalOptions& options);
// CheckEvalInputs, then runs.
Result<nlohmann::json> RunEval(const EvalOptions& options);

// The scores of the records (per task: overall micro and macro, per subject and category; gsm8k
// strict and flexible exact match), each with its standard error.
nlohmann::json ScoreRecords(const nlohmann::json& items);

// A short human-readable table of a report's results.
std::string FormatEvalSummary(const nlohmann::json& report);

// Writes `report` to `path` atomically (temporary file + rename).
Status WriteReport(const nlohmann::json& report, const std::string& path);
Result<nlohmann::json> ReadReport(const std::string& path);

}  // namespace dh::tools
