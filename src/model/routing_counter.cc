// RoutingCounter (routing_counter.h).
#include "model/routing_counter.h"

#include <charconv>

namespace dh {
namespace {

constexpr std::string_view kPrefix = "model.layers.";
constexpr std::string_view kSuffix = ".mlp.gate.topk_idx";

}  // namespace

RoutingCounter::RoutingCounter(int64_t num_layers, int64_t num_experts)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      counts_(new std::atomic<uint64_t>[static_cast<size_t>(num_layers * num_experts)]()),
      seen_(new std::atomic<bool>[static_cast<size_t>(num_layers)]()) {}

void RoutingCounter::OnTap(Backend& backend, std::string_view name, const Tensor& t) {
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix)) {
    return;
  }
  const std::string_view digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  int64_t layer = -1;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), layer);
  if (ec != std::errc() || end != digits.data() + digits.size() || layer < 0 ||
      layer >= num_layers_ || t.dtype != DType::kI32) {
    return;
  }
  host_.resize(static_cast<size_t>(t.numel()));
  backend.CopyToHost(host_.data(), t);
  for (const int32_t e : host_) {
    if (e >= 0 && e < num_experts_) {
      counts_[static_cast<size_t>(layer * num_experts_ + e)].fetch_add(1,
                                                                       std::memory_order_relaxed);
    }
  }
  seen_[static_cast<size_t>(layer)].store(true, std::memory_order_relaxed);
}

uint64_t RoutingCounter::Count(int64_t layer, int64_t expert) const {
  return counts_[static_cast<size_t>(layer * num_experts_ + expert)].load(
      std::memory_order_relaxed);
}

bool RoutingCounter::LayerSeen(int64_t layer) const {
  return seen_[static_cast<size_t>(layer)].load(std::memory_order_relaxed);
}

}  // namespace dh
