// RoutingCounter: a TapSink that counts, per MoE layer and routed expert, the tokens the router
// sent there (from the "model.layers.<l>.mlp.gate.topk_idx" taps) for `serve --op-metrics`'s
// /metrics. The label set is bounded by the config: layers x n_routed_experts.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/tap.h"

namespace dh {

class RoutingCounter final : public TapSink {
 public:
  RoutingCounter(int64_t num_layers, int64_t num_experts);

  void BeginStep() override {}
  void OnTap(Backend& backend, std::string_view name, const Tensor& t) override;

  // Tokens routed to (layer, expert) so far; layers without a router stay 0.
  uint64_t Count(int64_t layer, int64_t expert) const;
  // Whether layer `layer` routed any token yet (a MoE layer that ran).
  bool LayerSeen(int64_t layer) const;
  int64_t num_layers() const { return num_layers_; }
  int64_t num_experts() const { return num_experts_; }

 private:
  int64_t num_layers_, num_experts_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // [layer * num_experts + expert]
  std::unique_ptr<std::atomic<bool>[]> seen_;        // [layer]
  std::vector<int32_t> host_;
};

}  // namespace dh
