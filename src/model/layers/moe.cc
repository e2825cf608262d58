// MoE FFN loading and forward.
#include "model/layers/moe.h"

#include "model/layers/parallel.h"
#include "model/tap.h"

namespace dh {
namespace {

// Expert parallelism: ids of experts this rank holds become indices into its own experts; the
// rest become -1 (a slot MoeExperts skips).
void KeepLocalExperts(Backend& b, const Tensor& ids, int64_t first, int64_t count) {
  std::vector<int32_t> host(static_cast<size_t>(ids.numel()));
  b.CopyToHost(host.data(), ids);
  for (int32_t& e : host) e = (e >= first && e < first + count) ? e - first : -1;
  b.CopyToDevice(ids, host.data());
}

}  // namespace

Status ValidateMoeConfig(const ModelConfig& c) {
  if (c.n_routed_experts == 0) return Status::Ok();
  // scoring_func and topk_method are enums, checked when config.json was parsed.
  if (c.topk_method != MoeTopkMethod::kGreedy) {
    if (c.n_group <= 0 || c.n_routed_experts % c.n_group != 0) {
      return InvalidArgument("config.json: field 'n_group': {} must divide n_routed_experts {}",
                             c.n_group, c.n_routed_experts);
    }
    if (c.topk_group <= 0 || c.topk_group > c.n_group) {
      return InvalidArgument("config.json: field 'topk_group': expected 1..n_group ({}), got {}",
                             c.n_group, c.topk_group);
    }
    if (c.num_experts_per_tok > c.topk_group * (c.n_routed_experts / c.n_group)) {
      return InvalidArgument("config.json: num_experts_per_tok {} exceeds the experts in "
                             "topk_group {} groups", c.num_experts_per_tok, c.topk_group);
    }
    if (c.topk_method == MoeTopkMethod::kNoauxTc && c.n_routed_experts / c.n_group < 2) {
      return InvalidArgument("config.json: noaux_tc needs at least 2 experts per group");
    }
  }
  return Status::Ok();
}

Result<MoeFfn> MoeFfn::Load(WeightLoader& w, const std::string& p, const ModelConfig& c) {
  MoeFfn m;
  const int64_t E = c.n_routed_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  DH_ASSIGN_OR_RETURN(m.gate, w.Matrix(p + ".gate.weight", E, H));
  m.gate_tap = p + ".gate";
  if (c.topk_method == MoeTopkMethod::kNoauxTc) {
    DH_ASSIGN_OR_RETURN(m.gate_bias, w.Vector(p + ".gate.e_score_correction_bias", E));
  }
  // Expert parallelism: the experts are dealt out to --ep-size groups of ranks; the ranks of a
  // group split each of its experts like a dense MLP (--ep-size = --tp-size: one rank per group,
  // experts whole; --ep-size 1: one group, every expert split over every rank).
  const TensorParallel tp = TensorParallel::From(w.options());
  DH_ASSIGN_OR_RETURN(const PartRange mine, tp.Experts(E));
  DH_ASSIGN_OR_RETURN(const PartRange cols, tp.ExpertColumns(I));
  const MatrixSlice rows_part = TensorParallel::Rows(cols, 1, I);
  const MatrixSlice cols_part = TensorParallel::Cols(cols, 1, I);
  m.first_expert = mine.first;
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = fmt::format("{}.experts.{}", p, e);
    if (e < mine.first || e >= mine.first + mine.count) {
      w.SkipOtherRank(ep + ".");
      continue;
    }
    ExpertWeights ew;
    DH_ASSIGN_OR_RETURN(ew.gate, w.MatrixPart(ep + ".gate_proj.weight", I, H, rows_part));
    DH_ASSIGN_OR_RETURN(ew.up, w.MatrixPart(ep + ".up_proj.weight", I, H, rows_part));
    DH_ASSIGN_OR_RETURN(ew.down, w.MatrixPart(ep + ".down_proj.weight", H, I, cols_part));
    m.experts.push_back(ew);
  }
  if (c.n_shared_experts > 0) {
    DH_ASSIGN_OR_RETURN(m.shared, Mlp::Load(w, p + ".shared_experts", H, c.n_shared_experts * I));
  }
  MoeGateParams& g = m.gate_params;
  // The config's names map one to one onto the backend op's parameters.
  switch (c.scoring_func) {
    case MoeScoringFunc::kSoftmax: g.scoring = ScoringFunc::kSoftmax; break;
    case MoeScoringFunc::kSigmoid: g.scoring = ScoringFunc::kSigmoid; break;
  }
  switch (c.topk_method) {
    case MoeTopkMethod::kGreedy: g.method = TopkMethod::kGreedy; break;
    case MoeTopkMethod::kGroupLimitedGreedy: g.method = TopkMethod::kGroupLimitedGreedy; break;
    case MoeTopkMethod::kNoauxTc: g.method = TopkMethod::kNoauxTc; break;
  }
  g.top_k = static_cast<int>(c.num_experts_per_tok);
  g.n_group = static_cast<int>(c.n_group);
  g.topk_group = static_cast<int>(c.topk_group);
  g.norm_topk_prob = c.norm_topk_prob && g.top_k > 1;
  g.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  // DeepSeek-V2's gate scales only weights it did not renormalise; V3 scales both.
  if (c.architecture == "DeepseekV2ForCausalLM" && g.norm_topk_prob) g.routed_scaling_factor = 1.0f;
  return m;
}

Tensor MoeFfn::Forward(Backend& b, Arena& a, const Tensor& h) const {
  const int64_t T = h.dim(0), H = h.dim(1), E = gate.rows;
  const int64_t k = gate_params.top_k;
  Tensor logits = a.Alloc(DType::kF32, {T, E});
  b.MatMul(h, gate, Tensor(), logits);
  Tensor ids = a.Alloc(DType::kI32, {T, k});
  Tensor weights = a.Alloc(DType::kF32, {T, k});
  b.MoeGate(logits, gate_bias, gate_params, ids, weights);
  if (ActiveTapSink()) {  // names (the HF gate's outputs) built only when tapping
    Tap(b, gate_tap, logits);
    Tap(b, gate_tap + ".topk_idx", ids);
    Tap(b, gate_tap + ".topk_weight", weights);
  }
  if (static_cast<int64_t>(experts.size()) != E) {
    KeepLocalExperts(b, ids, first_expert, static_cast<int64_t>(experts.size()));
  }
  Tensor out = a.Alloc(DType::kF32, {T, H});
  b.MoeExperts(h, ids, weights, experts, out);
  if (shared) b.Add(out, shared->Forward(b, a, h), out);
  return out;
}

}  // namespace dh
