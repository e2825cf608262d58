// Taps: named intermediate tensors of a forward step (docs/observability.md). Names are the
// Hugging Face module names ("model.layers.0.self_attn.q_a_proj", "model.norm") so a dump lines
// up with a PyTorch forward-hook dump, plus "logits". One process-wide sink receives them (the
// engine runs Forward on its own thread); with none installed a tap costs one atomic load and a
// branch, and no name is formatted.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include "backend/backend.h"

namespace dh {

class TapSink {
 public:
  virtual ~TapSink() = default;
  // A forward step starts (steps are counted from 0 by the sink).
  virtual void BeginStep() = 0;
  // `t` is contiguous and lives on `backend`; it is valid only during the call.
  virtual void OnTap(Backend& backend, std::string_view name, const Tensor& t) = 0;
};

namespace tap_internal {
extern std::atomic<TapSink*> sink;
void TapLayerSlow(TapSink& s, Backend& b, int64_t layer, std::string_view suffix,
                  const Tensor& t);
}  // namespace tap_internal

// Installs `sink` (nullptr: taps off). The caller keeps it alive until it is replaced.
void SetTapSink(TapSink* sink);

inline TapSink* ActiveTapSink() { return tap_internal::sink.load(std::memory_order_acquire); }

inline void TapStepBegins() {
  if (TapSink* s = ActiveTapSink()) [[unlikely]] s->BeginStep();
}

inline void Tap(Backend& b, std::string_view name, const Tensor& t) {
  if (TapSink* s = ActiveTapSink()) [[unlikely]] s->OnTap(b, name, t);
}

// The tap "model.layers.<layer>.<suffix>".
inline void TapLayer(Backend& b, int64_t layer, std::string_view suffix, const Tensor& t) {
  if (TapSink* s = ActiveTapSink()) [[unlikely]] tap_internal::TapLayerSlow(*s, b, layer, suffix, t);
}

}  // namespace dh
