// Model: the interface every architecture implements, and the loader that picks one by the
// config's `architectures`. A forward step takes a host-side Batch (flat tokens of many
// sequences, their positions and paged-cache slots) and returns logits for the requested rows.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "io/model_config.h"
#include "model/kv_storage.h"
#include "weights/load_options.h"

namespace dh {

// One forward step. Sequence s contributes tokens [query_start[s], query_start[s+1]); after the
// step it has seq_lens[s] tokens in the cache (the new ones last).
struct Batch {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int32_t> query_start;   // [S + 1]
  std::vector<int32_t> seq_lens;      // [S]
  int max_blocks_per_seq = 0;
  std::vector<int32_t> block_tables;  // [S * max_blocks_per_seq], -1 padded
  std::vector<int32_t> slot_mapping;  // [T]
  std::vector<int32_t> logits_rows;   // rows of T to compute logits for, in output order
  // Tensor parallelism: only rank 0 needs the logits (it samples for every rank); the vocabulary
  // slices are then gathered there alone. Every rank of a step must set it alike.
  bool logits_on_rank0_only = false;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
  // Adds one sequence's chunk: tokens at positions [start_pos, start_pos + ids.size()) with the
  // given block table; `all_logits` requests logits for every new token, else only the last.
  void AddSequence(std::span<const int32_t> ids, int start_pos,
                   std::span<const int32_t> block_table, int block_size, bool all_logits);
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KvCacheSpec kv_spec() const = 0;
  virtual const ModelInfo& info() const = 0;
  // Runs one step; writes [batch.logits_rows.size(), vocab] f32 logits to *logits (host).
  virtual Status Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) = 0;

  // Multi-token prediction (DeepSeek-V3's MTP module, docs/mtp.md), present when the checkpoint
  // has one and LoadOptions::load_mtp asked for it. last_hidden(): the final normed hidden
  // states [R, hidden_size] of the last Forward's logits rows (host); after a ForwardMtp, that
  // step's rows after shared_head.norm (speculative decoding chains them). ForwardMtp: row t of
  // `batch` carries token t_{i+1} at position i and reads `hidden` row t (the main model's
  // hidden state at position i); writes logits (predicting t_{i+2}) for batch.logits_rows. Its
  // cache is layer num_hidden_layers of `kv`, at the batch's slots.
  virtual bool has_mtp() const { return false; }
  virtual std::span<const float> last_hidden() const { return {}; }
  virtual Status ForwardMtp(const Batch& batch, KvStorage& kv, std::span<const float> hidden,
                            std::vector<float>* logits) {
    return Unsupported("this model has no multi-token-prediction layer loaded");
  }

  // Keeps `resource` (e.g. the mapped checkpoint the weights point into) alive with the model.
  void KeepAlive(std::shared_ptr<void> resource) { resources_.push_back(std::move(resource)); }

 private:
  std::vector<std::shared_ptr<void>> resources_;
};

class WeightLoader;
using ModelFactory =
    std::function<Result<std::unique_ptr<Model>>(const ModelConfig&, WeightLoader&, Backend&)>;

// Registers an architecture under its HF name (e.g. "LlamaForCausalLM").
void RegisterArchitecture(const std::string& name, ModelFactory factory);
std::vector<std::string> SupportedArchitectures();
// The factory registered under `name`; NotFound (listing the supported ones) otherwise. Lets a
// tool drive an architecture with its own WeightLoader (e.g. verify's shape-only loader).
Result<ModelFactory> FindArchitecture(const std::string& name);

// Loads DIR (config.json + safetensors) onto `backend`.
Result<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend& backend,
                                         const LoadOptions& options);

}  // namespace dh
