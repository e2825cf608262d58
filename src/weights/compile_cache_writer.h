// Compile cache writer (compile_cache.h has the file layout) and the WeightLoader that records
// a checkpoint load into it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "weights/load_options.h"
#include "weights/weight_loader.h"

namespace dh {

// Streams each weight into a temporary file next to `final_path`; Commit writes the key, table
// and header, syncs and renames. The destructor removes an uncommitted temporary file. The first
// failing Add sticks and makes Commit fail.
class CompileCacheWriter {
 public:
  CompileCacheWriter(std::string final_path, Backend& backend);
  ~CompileCacheWriter();
  CompileCacheWriter(const CompileCacheWriter&) = delete;
  CompileCacheWriter& operator=(const CompileCacheWriter&) = delete;

  // Creates the directory and a unique temporary file (removing ones whose writer died).
  Status Open();
  void AddWeight(const std::string& name, const Weight& w);
  void AddVector(const std::string& name, const Tensor& t);  // f32 [n]
  void AddMeta(std::string key, std::string value);
  void SetNames(std::vector<std::string> names);  // checkpoint tensor names (for Has())
  // Writes key, table and header, syncs and renames into place. Returns the file size.
  Result<uint64_t> Commit(const std::string& key);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// A WeightLoader that loads `checkpoint` as usual and hands every weight it produces to
// `writer` (with a "compiling" progress bar when `progress`).
std::unique_ptr<WeightLoader> MakeRecordingLoader(const Checkpoint& checkpoint,
                                                  const ModelConfig& config, Backend& backend,
                                                  const LoadOptions& options,
                                                  CompileCacheWriter* writer, bool progress);

}  // namespace dh
