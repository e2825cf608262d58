// Building blocks shared by the architectures: a linear layer with optional bias, the SwiGLU MLP,
// and the per-step inputs (ids, positions, paged-attention metadata) uploaded once per Forward.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/arena.h"
#include "model/kv_storage.h"
#include "model/model.h"
#include "weights/weight_loader.h"

namespace dh {

struct Linear {
  Weight weight;
  Tensor bias;  // empty: none
  // The tap of its output (model/tap.h): the HF module name, or empty for a tensor-parallel
  // slice, whose output is not the module's.
  std::string tap_name;

  // `prefix` is the HF module name ("model.layers.0.self_attn.q_proj"); the features are the
  // checkpoint's. A row slice (tensor parallelism) takes the matching part of the bias; a column
  // slice gives partial sums, so only rank 0 (`bias_rank0`) adds the bias.
  static Result<Linear> Load(WeightLoader& loader, const std::string& prefix, int64_t out_features,
                             int64_t in_features, bool bias, const MatrixSlice& slice = {});
  // out: [T, out_features]
  Tensor Forward(Backend& backend, Arena& arena, const Tensor& x) const;
};

// Up to four Linears over the same x (a layer's q, k and v projections, an MLP's gate and up)
// through Backend::MatMuls, which may prepare x once for them all: out[i] as layers[i]->Forward
// gives it, taps included.
void ForwardSameX(Backend& backend, Arena& arena, const Tensor& x,
                  std::span<const Linear* const> layers, std::span<Tensor> out);

// down(silu(gate(x)) * up(x))
struct Mlp {
  Linear gate, up, down;
  // `split`: with tensor parallelism, this rank loads its share of the intermediate columns
  // (gate/up rows, down columns) and Forward returns a partial sum; else every rank loads it all.
  static Result<Mlp> Load(WeightLoader& loader, const std::string& prefix, int64_t hidden,
                          int64_t intermediate, bool split = true);
  Tensor Forward(Backend& backend, Arena& arena, const Tensor& x) const;
};

struct StepInputs {
  int num_tokens = 0;
  int32_t max_position = 0;
  Tensor token_ids;    // [T] i32
  Tensor positions;    // [T] i32
  Tensor logits_rows;  // [R] i32
  AttentionMeta meta;
};

// Checks the batch against the model and the cache (ids < vocab, consistent sizes, slots and
// block ids inside the pool) and uploads it.
Result<StepInputs> PrepareStep(const Batch& batch, const KvStorage& kv, int64_t vocab_size,
                               Arena& arena);

// Final norm -> rows wanted -> lm_head -> host logits [R, vocab]; with `normed_rows`, the
// normed rows [R, H] too (host). `tap_logits` false: the caller taps "logits" itself (a rank's
// vocabulary slice is not the logits; the decoder taps them once gathered).
Status ComputeLogits(Backend& backend, Arena& arena, const StepInputs& step, Tensor residual,
                     const Tensor& hidden, const Tensor& norm_weight, float eps,
                     const Weight& lm_head, std::vector<float>* logits,
                     std::vector<float>* normed_rows = nullptr, bool tap_logits = true);

// Uploads f32 host values as a device tensor owned by `owner`.
Result<Tensor> UploadF32(Backend& backend, std::span<const float> values,
                         std::vector<std::unique_ptr<Buffer>>& owner);

}  // namespace dh
