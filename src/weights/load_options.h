// What a load is asked to do (LoadOptions: the parsed WeightPlan, file and compile-cache
// options) and what it reports back (ModelInfo, CompileCacheResult). The weights layer reads
// these; src/model passes them through to the architecture.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "base/mapped_file.h"
#include "tensor/dtype.h"
#include "weights/weight_plan.h"

namespace dh {

namespace comm {
class Communicator;  // comm/communicator.h; the weights layer only carries the pointer
}

// Tensor and expert parallelism (docs/parallel.md): this process is rank `rank` of `size`, and
// loads only its slice of the weights that are split over ranks. `comm` (not owned) carries the
// collectives the model makes; null when size is 1. `ep_size`: groups of ranks the routed
// experts are distributed over, a divisor of size (0: the same as size, each rank's experts
// whole; 1: every rank holds every expert, split like a dense MLP; between: each group's ranks
// split its experts).
struct ParallelOptions {
  int rank = 0;
  int size = 1;
  int ep_size = 0;
  comm::Communicator* comm = nullptr;
};

// What happened to the compile cache during one LoadModel (LoadOptions::compile_cache.result).
struct CompileCacheResult {
  enum class Outcome {
    kOff,          // no cache directory given
    kHit,          // weights served from `path`
    kAbsent,       // no file at `path`; loaded from the checkpoint
    kNotUsed,      // a file at `path` was stale or invalid (`reason`); loaded from the checkpoint
    kWritten,      // loaded from the checkpoint and wrote `path`
    kWriteFailed,  // loaded from the checkpoint; writing `path` failed (`reason`)
  };
  Outcome outcome = Outcome::kOff;
  std::string path;
  std::string reason;      // why an existing file was not used, or why writing failed
  uint64_t file_bytes = 0; // size of the file used or written
  double write_seconds = 0;
};

// Compiled weight cache (weights/compile_cache.h, docs/compile-cache.md). Off when `dir` is empty.
struct CompileCacheOptions {
  std::string dir;
  // kNever: only read. kReplaceStale: rewrite a stale or damaged file found at this model's
  // cache path (someone compiled it before), never create one. kAlways: also create one.
  enum class Write { kNever, kReplaceStale, kAlways };
  Write write = Write::kReplaceStale;
  bool force = false;        // rebuild even a valid file (compile --force)
  // `deepharness compile`: nothing runs on the loaded model, so the recording loader hands each
  // weight's packed copy (Backend::PrepareWeight) back to the system once it is written.
  bool compile_only = false;
  CompileCacheResult* result = nullptr;  // filled in when not null
};

struct LoadOptions {
  FileLoadOptions file;
  bool show_progress = false;  // progress bar on a terminal
  // --dtype, the format of every matrix (--quant / --policy) and the MLA mode, already parsed
  // (ParseWeightPlan). Activations stay f32. A field that changes the loaded weights must also
  // enter the compile cache key (WeightPlan::Canonical, used by weights/compile_cache_key.cc).
  WeightPlan plan;
  CompileCacheOptions compile_cache;
  ParallelOptions parallel;  // --tp-size / --ep-size under mpirun
  // --kv-cache-dtype (model/kv_storage.h ParseKvCacheDtype): the element type of the KV cache
  // the model's kv_spec() asks for. Not a weight: outside the compile cache key.
  DType kv_cache_dtype = DType::kF32;
  // Load the checkpoint's multi-token-prediction layer (DeepSeek-V3's num_nextn_predict_layers,
  // at layer index num_hidden_layers; docs/mtp.md) instead of skipping it. It adds one layer to
  // the KV cache.
  bool load_mtp = false;
};

struct ModelInfo {
  std::string architecture;
  int64_t num_parameters = 0;
  int64_t num_tensors = 0;
  std::map<std::string, int64_t> bytes_by_dtype;
  uint64_t weight_bytes = 0;
  // What a decode step reads: every weight but the unchosen routed experts and the embedding
  // table (a step reads its tokens' rows; counted when lm_head is the tied table itself).
  uint64_t active_weight_bytes_per_token = 0;
  int64_t active_parameters_per_token = 0;  // the same weights' parameters
  size_t kv_bytes_per_token = 0;
  int64_t skipped_tensors = 0;  // e.g. multi-token-prediction layers
};

}  // namespace dh
