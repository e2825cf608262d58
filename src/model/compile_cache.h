// Compiled weight cache (`deepharness compile`, docs/compile-cache.md). A cache file holds every
// weight exactly as WeightLoader hands it to the kernels (converted, quantized, FP8 scales as f32,
// MLA's absorbed kv_b copies), so a later start reads or maps one file instead of decoding and
// quantizing the checkpoint.
//
// File layout (little-endian, all offsets checked on open):
//   [0, 256)            FileHeader: magic, format version, region offsets, XXH3-128 hashes of
//                       the key, the table and the header itself
//   [4096, ...)         data blobs, each aligned to kCompileCacheAlignment
//   key text            what the file was compiled from (see CompileCacheKey)
//   table               meta (ModelInfo counts), checkpoint tensor names (for Has()), entries:
//                       name, kind, format, rows/cols/block/group sizes and, per tensor slot
//                       (data, scales, mins, perm), dtype, shape, offset and size
// The file is written to a temporary name in the same directory and renamed into place, so a
// reader sees either the old file or the complete new one.
//
// The key covers: the format version, the deepharness build (ELF build id), the backend name, the
// CPU's SIMD features, the options that change weights (dtype, quant, quant_lm_head, policy),
// config.json's bytes, the index file's bytes, and each *.safetensors file's name, size, mtime
// and header bytes. Tensor data is not hashed (that would read the whole checkpoint at every
// start); a checkpoint rewritten in place with the same size, mtime and header would be missed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "model/model.h"

namespace dh {

inline constexpr uint32_t kCompileCacheVersion = 1;
inline constexpr uint64_t kCompileCacheAlignment = 4096;
inline constexpr char kCompileCacheExtension[] = ".dhc";

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

std::string_view CompileCacheOutcomeName(CompileCacheResult::Outcome o);

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
Result<std::string> CompileCacheKey(const std::string& model_dir, const LoadOptions& options,
                                    const std::string& backend_name);

// The SIMD features of this CPU as the key records them (e.g. "avx2 fma avx512f ...").
std::string CpuFeatureString();

// Checks a cache file without loading a model: header, key (against `expected_key` unless it is
// empty), table bounds and overlaps, and each entry's layout. Reads the header and table only.
// On success returns the number of entries.
Result<size_t> CheckCompileCacheFile(const std::string& path, const std::string& expected_key);

// LoadModel's path when options.compile_cache.dir is set: serve the weights from a valid cache
// file, else load the checkpoint (recording the weights into a new file when the options ask for
// it). Never fails because of the cache file: a bad one is logged and ignored.
Result<std::unique_ptr<Model>> LoadModelWithCompileCache(const std::string& dir,
                                                         const ModelConfig& config,
                                                         const ModelFactory& factory,
                                                         Backend& backend,
                                                         const LoadOptions& options);

}  // namespace dh
