// StopMatcher: finds stop strings in streamed text that arrives in arbitrary pieces (a stop
// string may span token boundaries). Text that could still be the start of a stop string is held
// back; everything else is released as soon as it is known not to be part of a match.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dh {

class StopMatcher {
 public:
  StopMatcher(std::vector<std::string> stops, bool include_stop_in_output);

  struct Step {
    std::string text;                  // released text
    std::optional<size_t> stop_index;  // set when stops[stop_index] matched (text ends there)
  };
  // Appends `piece`. After a match, further pushes release nothing.
  Step Push(std::string_view piece);
  // Releases the held-back text (at the end of generation).
  std::string Flush();
  const std::vector<std::string>& stops() const { return stops_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_;
  bool matched_ = false;
  std::string pending_;  // held back: a suffix that is a proper prefix of some stop string
};

}  // namespace dh
