// The architecture registry and LoadModel: config -> factory -> weights from the checkpoint or
// from a compile cache file (src/weights does the reading, writing and keying; this file decides
// which, and keeps what the weights point into alive with the model).
#include <sys/stat.h>

#include <chrono>
#include <map>
#include <mutex>

#include <fmt/ranges.h>

#include "base/log.h"
#include "io/safetensors.h"
#include "model/layers/parallel.h"
#include "model/model.h"
#include "weights/compile_cache.h"
#include "weights/compile_cache_reader.h"
#include "weights/compile_cache_writer.h"
#include "weights/weight_loader.h"

namespace dh {

void RegisterBuiltinArchitectures();  // arch/architectures.cc

namespace {

using ModelPtr = std::unique_ptr<Model>;

Result<ModelPtr> LoadFromCheckpoint(const std::string& dir, const ModelConfig& config,
                                    const ModelFactory& factory, Backend& backend,
                                    const LoadOptions& options,
                                    CompileCacheWriter* writer) {
  DH_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(dir, options.file));
  std::unique_ptr<WeightLoader> loader;
  if (writer != nullptr) {
    loader = MakeRecordingLoader(checkpoint, config, backend, options, writer,
                                 options.show_progress);
  } else {
    loader = std::make_unique<WeightLoader>(checkpoint, config, backend, options);
  }
  auto model = factory(config, *loader, backend);
  if (!model.ok()) return model.status();
  (*model)->KeepAlive(std::make_shared<Checkpoint>(std::move(checkpoint)));
  for (auto& r : loader->TakeResources()) (*model)->KeepAlive(std::move(r));
  return std::move(model).value();
}

Result<ModelPtr> ServeFromCache(const std::string& path, const std::string& key,
                                const ModelConfig& config, const ModelFactory& factory,
                                Backend& backend, const LoadOptions& options, bool* stale,
                                uint64_t* file_bytes) {
  DH_ASSIGN_OR_RETURN(std::unique_ptr<WeightLoader> loader,
                      OpenCompileCacheLoader(path, key, config, backend, options, stale,
                                             file_bytes));
  auto model = factory(config, *loader, backend);
  if (!model.ok()) return model.status();
  for (auto& r : loader->TakeResources()) (*model)->KeepAlive(std::move(r));
  return std::move(model).value();
}

std::string SizeText(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
  return fmt::format("{:.1f} MiB", bytes / double(1ull << 20));
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::mutex& ArchMutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, ModelFactory>& Architectures() {
  static std::map<std::string, ModelFactory> archs;
  return archs;
}
void EnsureBuiltins() {
  static std::once_flag once;
  std::call_once(once, [] { RegisterBuiltinArchitectures(); });
}
// LoadModel's path: serve the weights from a valid cache file when options.compile_cache.dir is
// set, else load the checkpoint (recording the weights into a new file when the options ask for
// it). Never fails because of the cache file: a bad one is logged and ignored.
Result<ModelPtr> LoadWithCompileCache(const std::string& dir, const ModelConfig& config,
                                      const ModelFactory& factory, Backend& backend,
                                      const LoadOptions& options) {
  using O = CompileCacheResult::Outcome;
  const CompileCacheOptions& cc = options.compile_cache;
  CompileCacheResult local;
  CompileCacheResult& res = cc.result != nullptr ? *cc.result : local;
  res = CompileCacheResult();
  if (cc.dir.empty()) {
    return LoadFromCheckpoint(dir, config, factory, backend, options, nullptr);
  }
  res.path = CompileCachePath(cc.dir, dir, options, backend.name());
  auto key = CompileCacheKey(dir, options, backend.name(), backend.KernelTag());
  if (!key.ok()) {
    // The checkpoint load reports the real problem (a missing config, an unreadable shard).
    res.outcome = O::kNotUsed;
    res.reason = key.status().message();
    return LoadFromCheckpoint(dir, config, factory, backend, options, nullptr);
  }
  struct stat st;
  const bool exists = ::stat(res.path.c_str(), &st) == 0;
  res.outcome = exists ? O::kNotUsed : O::kAbsent;
  if (exists && !cc.force) {
    const auto start = std::chrono::steady_clock::now();
    bool stale = false;
    uint64_t bytes = 0;
    auto model =
        ServeFromCache(res.path, *key, config, factory, backend, options, &stale, &bytes);
    if (model.ok()) {
      res.outcome = O::kHit;
      res.file_bytes = bytes;
      DH_LOG(Info, "compile cache: loaded {} ({}, {}) in {:.2f} s", res.path, SizeText(bytes),
             options.file.use_mmap ? "mapped" : "read", SecondsSince(start));
      return model;
    }
    res.reason = model.status().message();
    DH_LOG(Warning, "compile cache: not using {}: {}; loading the checkpoint", res.path,
           res.reason);
  } else if (!exists) {
    DH_LOG(Debug, "compile cache: no {}", res.path);
  }
  using W = CompileCacheOptions::Write;
  const bool write = cc.write == W::kAlways || (cc.write == W::kReplaceStale && exists);
  if (!write) return LoadFromCheckpoint(dir, config, factory, backend, options, nullptr);

  CompileCacheWriter writer(res.path, backend);
  if (Status open = writer.Open(); !open.ok()) {
    res.outcome = O::kWriteFailed;
    res.reason = open.message();
    DH_LOG(Warning, "compile cache: cannot write {}: {}", res.path, res.reason);
    return LoadFromCheckpoint(dir, config, factory, backend, options, nullptr);
  }
  DH_LOG(Info, "compile cache: {} {}", exists ? "rebuilding" : "writing", res.path);
  DH_ASSIGN_OR_RETURN(ModelPtr model,
                      LoadFromCheckpoint(dir, config, factory, backend, options, &writer));
  const auto start = std::chrono::steady_clock::now();
  auto bytes = writer.Commit(*key);
  res.write_seconds = SecondsSince(start);
  if (bytes.ok()) {
    res.outcome = O::kWritten;
    res.file_bytes = *bytes;
    DH_LOG(Info, "compile cache: wrote {} ({}; key, table and sync {:.1f} s)", res.path,
           SizeText(*bytes), res.write_seconds);
  } else {
    res.outcome = O::kWriteFailed;
    res.reason = bytes.status().message();
    DH_LOG(Warning, "compile cache: not written: {}", res.reason);
  }
  return model;
}

}  // namespace


void RegisterArchitecture(const std::string& name, ModelFactory factory) {
  std::lock_guard<std::mutex> lock(ArchMutex());
  Architectures()[name] = std::move(factory);
}

std::vector<std::string> SupportedArchitectures() {
  EnsureBuiltins();
  std::lock_guard<std::mutex> lock(ArchMutex());
  std::vector<std::string> names;
  for (const auto& [name, f] : Architectures()) names.push_back(name);
  return names;
}

Result<ModelFactory> FindArchitecture(const std::string& name) {
  EnsureBuiltins();
  {
    std::lock_guard<std::mutex> lock(ArchMutex());
    auto it = Architectures().find(name);
    if (it != Architectures().end()) return it->second;
  }
  return NotFound("architecture '{}' is not supported (supported: {})", name,
                  fmt::join(SupportedArchitectures(), ", "));
}

Result<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend& backend,
                                         const LoadOptions& options) {
  EnsureBuiltins();
  DH_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ModelFactory factory;
  {
    std::lock_guard<std::mutex> lock(ArchMutex());
    auto it = Architectures().find(config.architecture);
    if (it != Architectures().end()) factory = it->second;
  }
  if (!factory) {
    return Unsupported("{}/config.json: architecture '{}' is not supported; supported: {}", dir,
                       config.architecture, fmt::join(SupportedArchitectures(), ", "));
  }
  DH_RETURN_IF_ERROR(ValidateParallel(options.parallel));
  if (options.parallel.size > 1 && !options.compile_cache.dir.empty()) {
    // A compile cache file holds one rank's weights of one partition: not built (issue 13).
    DH_LOG(Info, "compile cache: not used with --tp-size {}", options.parallel.size);
    LoadOptions uncached = options;
    uncached.compile_cache.dir.clear();
    return LoadWithCompileCache(dir, config, factory, backend, uncached);
  }
  return LoadWithCompileCache(dir, config, factory, backend, options);
}

}  // namespace dh
