// StopMatcher: earliest-match search over the held-back tail plus the new piece.
#include "engine/stop_matcher.h"

#include <algorithm>

namespace dh {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop_in_output)
    : include_stop_(include_stop_in_output) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopMatcher::Step StopMatcher::Push(std::string_view piece) {
  Step step;
  if (matched_) return step;
  pending_.append(piece);
  // The earliest occurrence of any stop string wins; at equal starts the first listed.
  size_t best_pos = std::string::npos;
  size_t best_index = 0;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = pending_.find(stops_[i]);
    if (pos < best_pos) {
      best_pos = pos;
      best_index = i;
    }
  }
  if (best_pos != std::string::npos) {
    matched_ = true;
    const size_t end = best_pos + (include_stop_ ? stops_[best_index].size() : 0);
    step.text = pending_.substr(0, end);
    step.stop_index = best_index;
    pending_.clear();
    return step;
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max_k = std::min(s.size() - 1, pending_.size());
    for (size_t k = max_k; k > hold; --k) {
      if (std::string_view(pending_).substr(pending_.size() - k) ==
          std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  step.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return step;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace dh
