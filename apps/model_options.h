// Flags shared by every subcommand that loads a model (--model-path, --device, --dtype,
// --threads, --mmap/--no-mmap, --mlock, --trace-kernels) and the code that turns them into a loaded
// backend + model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/backend.h"
#include "model/model.h"
#include "weights/compile_cache.h"

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
  bool trace_kernels = false;
  bool quiet = false;
  // Compiled weight cache (docs/compile-cache.md): --compile-cache DIR (default
  // DefaultCompileCacheDir()), --no-compile-cache; `compile` sets write to kAlways.
  std::string compile_cache_dir;
  bool no_compile_cache = false;
  CompileCacheOptions::Write compile_cache_write = CompileCacheOptions::Write::kReplaceStale;
  bool compile_cache_force = false;
};

// Adds the flags; `require_model` makes --model-path mandatory.
void AddModelOptions(CLI::App* sub, ModelOptions* o, bool require_model = true);

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  double load_seconds = 0;
  CompileCacheResult compile_cache;  // whether the weights came from a compiled cache
};

// Parses the weight flags (ParseWeightPlan) before anything else, then creates the backend and
// loads the model.
Result<LoadedModel> LoadFromOptions(const ModelOptions& o);

// The weight flags as given (--dtype, --quant, --quant-lm-head, --policy), for ParseWeightPlan.
WeightFlags WeightFlagsOf(const ModelOptions& o);

// Parses "1,2,3" (spaces allowed). Errors name the flag and the offending item.
Result<std::vector<int32_t>> ParseIdList(const std::string& text, const std::string& flag);

// Prints "error: <message>" on one line and returns the exit code for the status.
int ReportError(const Status& status);

}  // namespace dh::app
