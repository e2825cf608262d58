// Text-level <think>...</think> splitting with hold-back of partial tags.
#include "server/reasoning_stream.h"

#include <algorithm>

namespace dh::server {
namespace {

constexpr std::string_view kStart = "<think>";
constexpr std::string_view kEnd = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

void ReasoningSplitter::Emit(std::string_view text, SplitDelta* out) {
  if (text.empty()) return;
  (in_reasoning_ ? out->reasoning : out->content).append(text);
}

SplitDelta ReasoningSplitter::Push(std::string_view text) {
  SplitDelta out;
  held_.append(text);
  if (at_start_) {
    // Skip leading whitespace-free "<think>" (possibly split across deltas).
    if (held_.size() < kStart.size() && kStart.substr(0, held_.size()) == held_) return out;
    if (held_.compare(0, kStart.size(), kStart) == 0) held_.erase(0, kStart.size());
    at_start_ = false;
  }
  if (in_reasoning_) {
    size_t end = held_.find(kEnd);
    if (end != std::string::npos) {
      Emit(std::string_view(held_).substr(0, end), &out);
      in_reasoning_ = false;
      std::string rest = held_.substr(end + kEnd.size());
      held_.clear();
      Emit(rest, &out);
      return out;
    }
    size_t keep = PartialTagSuffix(held_, kEnd);
    Emit(std::string_view(held_).substr(0, held_.size() - keep), &out);
    held_.erase(0, held_.size() - keep);
    return out;
  }
  Emit(held_, &out);
  held_.clear();
  return out;
}

SplitDelta ReasoningSplitter::Finish() {
  SplitDelta out;
  Emit(held_, &out);
  held_.clear();
  return out;
}

}  // namespace dh::server
