// Flags shared by every subcommand that loads a model (--model-path, --device, --dtype,
// --threads, --mmap/--no-mmap, --mlock, --trace-kernels) and the code that turns them into a loaded
// backend + model.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/observability.h"
#include "apps/parallel.h"
#include "backend/backend.h"
#include "model/model.h"
#include "weights/compile_cache.h"

namespace dh {
struct EngineStats;
}  // namespace dh

namespace dh::app {

struct ModelOptions {
  std::string model_path;
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string quant = "none";
  bool quant_lm_head = false;
  std::string policy;  // --policy (weights/precision_policy.h)
  int threads = 0;
  // Weights are read into anonymous memory by default: mapped weights were evicted from the page
  // cache by other processes' file reading and decode fell 2-5x (docs/DESIGN.md "Traps").
  bool mmap = false;
  bool no_mmap = false;
  bool mlock = false;
  // CompileCacheOptions::compile_only (set by compile, not a flag).
  bool compile_only = false;
  bool trace_kernels = false;
  bool quiet = false;
  // Compiled weight cache (docs/compile-cache.md): --compile-cache DIR (default
  // DefaultCompileCacheDir()), --no-compile-cache; `compile` sets write to kAlways.
  std::string compile_cache_dir;
  bool no_compile_cache = false;
  CompileCacheOptions::Write compile_cache_write = CompileCacheOptions::Write::kReplaceStale;
  bool compile_cache_force = false;
  // Tensor / expert parallelism (apps/parallel.h, docs/parallel.md); > 1 needs mpirun -np N.
  int tp_size = 1;
  int ep_size = 0;  // 0: = tp_size
  // Tracing, tensor dumps, plugins: flags added per command (AddObservabilityOptions).
  ObservabilityOptions observe;
  // --kv-cache-dtype (AddKvCacheOptions), parsed by LoadFromOptions (model/kv_storage.h).
  std::string kv_cache_dtype = "auto";
  // --speculative mtp --num-speculative-tokens K (AddSpeculativeOptions, docs/mtp.md): loads the
  // MTP layer; SpeculativeTokens() is the engine's num_speculative_tokens.
  std::string speculative;
  int num_speculative_tokens = 1;
};

// Adds the flags; `require_model` makes --model-path mandatory.
void AddModelOptions(CLI::App* sub, ModelOptions* o, bool require_model = true);
// Adds --kv-cache-dtype, for the subcommands that run the model over a KV cache.
void AddKvCacheOptions(CLI::App* sub, ModelOptions* o);
// Adds --speculative and --num-speculative-tokens, for the subcommands that decode through the
// engine. LoadFromOptions checks them (one-line errors: the method, K in 1..8, a model with an
// MTP layer, no --tp-size).
void AddSpeculativeOptions(CLI::App* sub, ModelOptions* o);
// "speculative decoding (mtp, K 2): 40 drafted, 31 accepted (77.5%); per position 90.0% 65.0%":
// the engine's counters, for run's and bench's summaries.
std::string SpeculativeSummary(const EngineStats& s);
// Drafts per step for EngineOptions::num_speculative_tokens: 0 without --speculative.
inline int SpeculativeTokens(const ModelOptions& o) {
  return o.speculative.empty() ? 0 : o.num_speculative_tokens;
}

struct LoadedModel {
  ParallelRun parallel;  // first: the communicator outlives the model and the backend
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  double load_seconds = 0;
  CompileCacheResult compile_cache;  // whether the weights came from a compiled cache
  // Last: destroyed first, so the trace and the dump are written while the model still exists.
  std::unique_ptr<Observability> observability;
};

// Parses the weight flags (ParseWeightPlan) before anything else, then creates the backend and
// loads the model. `wrap` (optional) replaces the created backend before the model is loaded on it, e.g. with
// the self-check's CheckingBackend (apps/self_check.h). With tracing options (ModelOptions::observe)
// a TracingBackend wraps the result, and the Observability session starts before the load.
using BackendWrapper = std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)>;
Result<LoadedModel> LoadFromOptions(const ModelOptions& o, const BackendWrapper& wrap = {});

// True on the rank that prints and writes files (always with --tp-size 1).
inline bool IsLeadRank(const LoadedModel& m) { return m.parallel.options.rank == 0; }

// The weight flags as given (--dtype, --quant, --quant-lm-head, --policy), for ParseWeightPlan.
WeightFlags WeightFlagsOf(const ModelOptions& o);

// Parses "1,2,3" (spaces allowed). Errors name the flag and the offending item.
Result<std::vector<int32_t>> ParseIdList(const std::string& text, const std::string& flag);

// Prints "error: <message>" on one line and returns the exit code for the status.
int ReportError(const Status& status);

}  // namespace dh::app
