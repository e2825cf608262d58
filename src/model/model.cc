// Architecture registry, LoadModel and Batch helpers.
#include "model/model.h"

#include <map>
#include <mutex>

#include <fmt/ranges.h>

#include "base/log.h"
#include "io/safetensors.h"
#include "model/compile_cache.h"
#include "model/weight_loader.h"

namespace dh {

void RegisterBuiltinArchitectures();  // arch/architectures.cc

namespace {
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
  if (options.dtype != "auto" && options.dtype != "float32" && options.dtype != "bfloat16" &&
      options.dtype != "float16" && options.dtype != "f32" && options.dtype != "bf16" &&
      options.dtype != "f16" && options.dtype != "half") {
    return InvalidArgument("--dtype '{}': expected auto, float32, bfloat16 or float16",
                           options.dtype);
  }
  if (!options.compile_cache.dir.empty()) {
    return LoadModelWithCompileCache(dir, config, factory, backend, options);
  }
  DH_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(dir, options.file));
  WeightLoader loader(checkpoint, config, backend, options);
  auto model = factory(config, loader, backend);
  if (!model.ok()) return model.status();
  // Weights of a mapped checkpoint stay referenced through views: keep the files alive.
  auto holder = std::make_shared<Checkpoint>(std::move(checkpoint));
  (*model)->KeepAlive(holder);
  (*model)->KeepAlive(loader.TakeOwnedBuffers());
  return std::move(model).value();
}

void Batch::AddSequence(std::span<const int32_t> ids, int start_pos,
                        std::span<const int32_t> block_table, int block_size, bool all_logits) {
  const int seq = num_seqs();
  if (query_start.empty()) query_start.push_back(0);
  const int first_row = num_tokens();
  for (size_t i = 0; i < ids.size(); ++i) {
    const int pos = start_pos + static_cast<int>(i);
    token_ids.push_back(ids[i]);
    positions.push_back(pos);
    slot_mapping.push_back(block_table[pos / block_size] * block_size + pos % block_size);
    if (all_logits || i + 1 == ids.size()) logits_rows.push_back(first_row + static_cast<int>(i));
  }
  query_start.push_back(num_tokens());
  seq_lens.push_back(start_pos + static_cast<int>(ids.size()));
  // Re-pad every block table to the widest one.
  const int width = std::max(max_blocks_per_seq, static_cast<int>(block_table.size()));
  if (width != max_blocks_per_seq) {
    std::vector<int32_t> padded(static_cast<size_t>(seq) * width, -1);
    for (int s = 0; s < seq; ++s) {
      std::copy_n(block_tables.begin() + static_cast<size_t>(s) * max_blocks_per_seq,
                  max_blocks_per_seq, padded.begin() + static_cast<size_t>(s) * width);
    }
    block_tables = std::move(padded);
    max_blocks_per_seq = width;
  }
  block_tables.insert(block_tables.end(), block_table.begin(), block_table.end());
  block_tables.resize(static_cast<size_t>(seq + 1) * width, -1);
}

}  // namespace dh
