// Shared layers and per-step input preparation.
#include "model/layers/common.h"

#include <array>

#include "base/check.h"
#include "model/layers/parallel.h"
#include "model/tap.h"

namespace dh {

Result<Linear> Linear::Load(WeightLoader& loader, const std::string& prefix, int64_t out_features,
                            int64_t in_features, bool bias, const MatrixSlice& slice) {
  Linear l;
  DH_ASSIGN_OR_RETURN(l.weight,
                      loader.MatrixPart(prefix + ".weight", out_features, in_features, slice));
  if (slice.whole()) l.tap_name = prefix;
  if (!bias) return l;
  if (slice.axis == MatrixSlice::Axis::kRows) {
    DH_ASSIGN_OR_RETURN(l.bias,
                        loader.VectorPart(prefix + ".bias", out_features, slice.begin, slice.count));
  } else {
    DH_ASSIGN_OR_RETURN(l.bias, loader.Vector(prefix + ".bias", out_features));
    // Column-split outputs are partial sums: the bias is added once, by rank 0.
    if (slice.axis == MatrixSlice::Axis::kCols && loader.options().parallel.rank != 0) {
      l.bias = Tensor();
    }
  }
  return l;
}

Tensor Linear::Forward(Backend& backend, Arena& arena, const Tensor& x) const {
  Tensor out = arena.Alloc(DType::kF32, {x.dim(0), weight.rows});
  backend.MatMul(x, weight, bias, out);
  if (!tap_name.empty()) Tap(backend, tap_name, out);
  return out;
}

void ForwardSameX(Backend& backend, Arena& arena, const Tensor& x,
                  std::span<const Linear* const> layers, std::span<Tensor> out) {
  constexpr size_t kMax = 4;
  DH_CHECK(layers.size() <= kMax && out.size() == layers.size(), "{} linears over one x",
           layers.size());
  std::array<MatMulTarget, kMax> targets;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Linear& l = *layers[i];
    out[i] = arena.Alloc(DType::kF32, {x.dim(0), l.weight.rows});
    targets[i] = {&l.weight, l.bias, out[i]};
  }
  backend.MatMuls(x, std::span<const MatMulTarget>(targets.data(), layers.size()));
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i]->tap_name.empty()) Tap(backend, layers[i]->tap_name, out[i]);
  }
}

Result<Mlp> Mlp::Load(WeightLoader& loader, const std::string& prefix, int64_t hidden,
                      int64_t intermediate, bool split) {
  Mlp m;
  const TensorParallel tp = TensorParallel::From(loader.options());
  PartRange part{0, intermediate};
  if (split) {
    DH_ASSIGN_OR_RETURN(part, tp.Split(intermediate, "intermediate size of " + prefix));
  }
  const MatrixSlice rows = TensorParallel::Rows(part, 1, intermediate);
  const MatrixSlice cols = TensorParallel::Cols(part, 1, intermediate);
  DH_ASSIGN_OR_RETURN(m.gate, Linear::Load(loader, prefix + ".gate_proj", intermediate, hidden, false, rows));
  DH_ASSIGN_OR_RETURN(m.up, Linear::Load(loader, prefix + ".up_proj", intermediate, hidden, false, rows));
  DH_ASSIGN_OR_RETURN(m.down, Linear::Load(loader, prefix + ".down_proj", hidden, intermediate, false, cols));
  return m;
}

Tensor Mlp::Forward(Backend& backend, Arena& arena, const Tensor& x) const {
  const Linear* const gate_up[] = {&gate, &up};
  Tensor gu[2];
  ForwardSameX(backend, arena, x, gate_up, gu);
  Tensor g = gu[0], u = gu[1];  // [T, I]
  backend.SiluMul(g, u, g);
  return down.Forward(backend, arena, g);      // [T, H]
}

Result<StepInputs> PrepareStep(const Batch& batch, const KvStorage& kv, int64_t vocab_size,
                               Arena& arena) {
  const int T = batch.num_tokens();
  const int S = batch.num_seqs();
  if (T == 0 || S == 0) return InvalidArgument("empty batch");
  if (batch.positions.size() != static_cast<size_t>(T) ||
      batch.slot_mapping.size() != static_cast<size_t>(T) ||
      batch.query_start.size() != static_cast<size_t>(S + 1) ||
      batch.block_tables.size() != static_cast<size_t>(S) * batch.max_blocks_per_seq ||
      batch.query_start.front() != 0 || batch.query_start.back() != T) {
    return InvalidArgument("inconsistent batch: {} tokens, {} sequences", T, S);
  }
  for (int32_t id : batch.token_ids) {
    if (id < 0 || id >= vocab_size) {
      return OutOfRange("token id {} is outside the vocabulary [0, {})", id, vocab_size);
    }
  }
  const int64_t num_slots = static_cast<int64_t>(kv.num_blocks()) * kv.block_size();
  for (int32_t slot : batch.slot_mapping) {
    if (slot < 0 || slot >= num_slots) return OutOfRange("KV slot {} outside the pool", slot);
  }
  for (int32_t b : batch.block_tables) {
    if (b >= kv.num_blocks()) return OutOfRange("KV block {} outside the pool", b);
  }
  StepInputs step;
  step.num_tokens = T;
  int max_seq = 0;
  for (int s = 0; s < S; ++s) {
    const int q = batch.query_start[s + 1] - batch.query_start[s];
    if (q <= 0 || batch.seq_lens[s] < q ||
        batch.seq_lens[s] > static_cast<int64_t>(batch.max_blocks_per_seq) * kv.block_size()) {
      return InvalidArgument("sequence {} of the batch: {} new tokens, {} cached", s, q,
                             batch.seq_lens[s]);
    }
    max_seq = std::max(max_seq, batch.seq_lens[s]);
  }
  for (int32_t rows : batch.logits_rows) {
    if (rows < 0 || rows >= T) return InvalidArgument("logits row {} outside the batch", rows);
  }
  for (int32_t p : batch.positions) step.max_position = std::max(step.max_position, p);
  step.token_ids = arena.Upload(batch.token_ids);
  step.positions = arena.Upload(batch.positions);
  step.logits_rows = arena.Upload(batch.logits_rows);
  AttentionMeta& m = step.meta;
  m.num_seqs = S;
  m.num_tokens = T;
  m.block_size = kv.block_size();
  m.max_blocks_per_seq = batch.max_blocks_per_seq;
  m.max_seq_len = max_seq;
  m.query_start = arena.Upload(batch.query_start);
  m.seq_lens = arena.Upload(batch.seq_lens);
  m.block_tables = arena.Upload(batch.block_tables);
  m.slot_mapping = arena.Upload(batch.slot_mapping);
  m.host_query_start = batch.query_start;
  m.host_seq_lens = batch.seq_lens;
  m.host_block_tables = batch.block_tables;
  m.host_slot_mapping = batch.slot_mapping;
  return step;
}

Status ComputeLogits(Backend& backend, Arena& arena, const StepInputs& step, Tensor residual,
                     const Tensor& hidden, const Tensor& norm_weight, float eps,
                     const Weight& lm_head, std::vector<float>* logits,
                     std::vector<float>* normed_rows, bool tap_logits) {
  const int64_t H = residual.dim(1);
  const int64_t R = step.logits_rows.dim(0);
  if (R == 0) {
    logits->clear();
    if (normed_rows != nullptr) normed_rows->clear();
    return Status::Ok();
  }
  Tensor normed = arena.Alloc(DType::kF32, {step.num_tokens, H});
  backend.AddRmsNorm(residual, hidden, norm_weight, eps, normed);
  Tap(backend, "model.norm", normed);
  Tensor rows = arena.Alloc(DType::kF32, {R, H});
  backend.GatherRows(normed, step.logits_rows, rows);
  if (normed_rows != nullptr) {
    normed_rows->resize(static_cast<size_t>(rows.numel()));
    backend.CopyToHost(normed_rows->data(), rows);
  }
  Tensor out = arena.Alloc(DType::kF32, {R, lm_head.rows});
  backend.MatMul(rows, lm_head, Tensor(), out);
  if (tap_logits) Tap(backend, "logits", out);
  logits->resize(static_cast<size_t>(out.numel()));
  backend.CopyToHost(logits->data(), out);
  return Status::Ok();
}

Result<Tensor> UploadF32(Backend& backend, std::span<const float> values,
                         std::vector<std::unique_ptr<Buffer>>& owner) {
  auto buf = backend.Allocate(values.size_bytes());
  if (!buf) return ResourceExhausted("cannot allocate {} bytes", values.size_bytes());
  Tensor t(buf->data(), DType::kF32, {static_cast<int64_t>(values.size())});
  backend.CopyToDevice(t, values.data());
  owner.push_back(std::move(buf));
  return t;
}

}  // namespace dh
