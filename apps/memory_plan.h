// The memory planner: before anything is loaded, estimates what a model will need (weights in
// the chosen format, the KV pool, the activation arena's peak, a fixed runtime share) from
// config.json and the safetensors headers alone, and compares it with the memory this process
// may use (MemAvailable and the cgroup limit, base/memory_info.h). `info --plan` prints it;
// `serve`, `run` refuse a plan that does not fit with a message that says what would fit.
#pragma once

#include <cstdint>
#include <string>

#include "apps/model_options.h"
#include "base/memory_info.h"
#include "base/status.h"

namespace dh::app {

struct PlanInputs {
  ModelOptions model;
  int max_seq_len = 0;             // 0: max_position_embeddings
  int max_num_seqs = 1;
  int max_num_batched_tokens = 2048;
  uint64_t kv_cache_memory = 0;    // 0: the engine's default (half of what is left, capped)
  int num_kv_blocks = 0;           // > 0: exact pool
};

struct MemoryPlan {
  uint64_t weights = 0;       // resident weights after conversion/quantization (estimate)
  uint64_t stored = 0;        // bytes of the checkpoint's tensors on disk
  uint64_t kv_pool = 0;
  uint64_t kv_per_token = 0;  // in the cache dtype, scales included
  uint64_t kv_tokens = 0;     // tokens the pool holds (whole blocks of 16)
  std::string kv_cache_dtype; // --kv-cache-dtype as named: auto, bf16, fp8, int8
  uint64_t activations = 0;   // peak of one step's arena (estimate)
  uint64_t runtime = 0;       // fixed share: code, tokenizer, threads, buffers
  uint64_t total = 0;
  int64_t context = 0;
  std::string weight_format;  // "as stored", "int4", ...
  MemoryInfo memory;
  bool fits = true;
};

Result<MemoryPlan> PlanMemory(const PlanInputs& in);

// Multi-line human-readable plan.
std::string FormatPlan(const MemoryPlan& plan);

// Ok when the plan fits (or the available memory is unknown); otherwise InvalidArgument with
// "needs X, Y available (source): try --quant int4 (≈ Z) or --max-seq-len N ...".
Status CheckPlanFits(const PlanInputs& in, const MemoryPlan& plan);

}  // namespace dh::app
