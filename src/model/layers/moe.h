// Mixture-of-experts FFN of the DeepSeek family: router (softmax or sigmoid scores; greedy,
// group-limited greedy or noaux_tc top-k), routed SwiGLU experts computed grouped by expert
// (the backend's MoeExperts op), plus always-on shared experts.
#pragma once

#include <optional>

#include "model/layers/common.h"

namespace dh {

struct MoeFfn {
  Weight gate;       // [n_routed_experts, hidden]
  Tensor gate_bias;  // [n_routed_experts] e_score_correction_bias (noaux_tc), else empty
  // Routed experts [first_expert, first_expert + experts.size()): all of them, or with expert
  // parallelism this rank's share (the router still scores all; Forward then returns this
  // rank's partial sum, and the decoder all-reduces it).
  std::vector<ExpertWeights> experts;
  int64_t first_expert = 0;
  std::optional<Mlp> shared;
  MoeGateParams gate_params;
  std::string gate_tap;  // "<prefix>.gate": router logits, then .topk_idx and .topk_weight

  static Result<MoeFfn> Load(WeightLoader& w, const std::string& prefix, const ModelConfig& c);
  Tensor Forward(Backend& b, Arena& a, const Tensor& h) const;  // [T, hidden]
};

// The group counts against the expert counts (scoring_func and topk_method were checked when
// config.json was parsed): refused with the field named.
Status ValidateMoeConfig(const ModelConfig& c);

}  // namespace dh
