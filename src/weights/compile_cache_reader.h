// Compile cache reader: a WeightLoader that serves every weight from a cache file
// (compile_cache.h has the file layout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "base/status.h"
#include "io/model_config.h"
#include "weights/load_options.h"
#include "weights/weight_loader.h"

namespace dh {

// Opens the cache file at `path` and checks its header, its key (against `expected_key`) and its
// table; on success returns a loader that serves the weights from the file's bytes (mapped or
// read per options.file). The model built from it must keep loader->TakeResources() alive.
// *stale is set when the file is valid but was compiled from other inputs; *file_bytes gets the
// file's size.
Result<std::unique_ptr<WeightLoader>> OpenCompileCacheLoader(
    const std::string& path, const std::string& expected_key, const ModelConfig& config,
    Backend& backend, const LoadOptions& options, bool* stale,
    uint64_t* file_bytes);

}  // namespace dh
