// The process-wide tap sink (tap.h).
#include "model/tap.h"

#include <fmt/format.h>

namespace dh {
namespace tap_internal {

std::atomic<TapSink*> sink{nullptr};

void TapLayerSlow(TapSink& s, Backend& b, int64_t layer, std::string_view suffix, const Tensor& t) {
  s.OnTap(b, fmt::format("model.layers.{}.{}", layer, suffix), t);
}

}  // namespace tap_internal

void SetTapSink(TapSink* sink) { tap_internal::sink.store(sink, std::memory_order_release); }

}  // namespace dh
