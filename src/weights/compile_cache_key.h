// The compile cache's key (what a file was compiled from) and its file name. See
// compile_cache.h for the list of inputs the key covers.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "weights/load_options.h"

namespace dh {

// The default cache directory: $XDG_CACHE_HOME/deepharness, else $HOME/.cache/deepharness, else
// "" (no cache).
std::string DefaultCompileCacheDir();

// The cache file for `model_dir` loaded with `options` on backend `backend_name`: a name derived
// from the model directory's real path and the weight-changing options (not from the checkpoint's
// contents, so a stale file is found and replaced rather than left beside a new one).
std::string CompileCachePath(const std::string& cache_dir, const std::string& model_dir,
                             const LoadOptions& options, const std::string& backend_name);

// The key text a cache file must carry to be used: one "field=value" line per input (see the
// file comment). Reads config.json, the index and each safetensors header, never tensor data.
// `kernel_tag` is the backend's Backend::KernelTag() (its SIMD target, a GPU's architecture).
Result<std::string> CompileCacheKey(const std::string& model_dir, const LoadOptions& options,
                                    const std::string& backend_name,
                                    const std::string& kernel_tag);

// The first line where two keys differ, for the log line saying why a file is stale.
std::string KeyDifference(std::string_view file_key, std::string_view expected);

}  // namespace dh
