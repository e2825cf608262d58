// ReasoningSplitter: splits DeepSeek-R1-style output into reasoning_content and content, on text
// deltas as they stream (vLLM's deepseek_r1 semantics): the output is reasoning until `</think>`
// (a leading `<think>` is dropped, and the start tag is optional because R1 templates open the
// think block in the prompt); everything after the end tag is content. A partial tag at the end
// of a delta is held back until the next delta decides it.
#pragma once

#include <string>
#include <string_view>

namespace dh::server {

struct SplitDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningSplitter {
 public:
  SplitDelta Push(std::string_view text);
  SplitDelta Finish();                 // releases any held-back text
  bool in_reasoning() const { return in_reasoning_; }
  bool saw_end() const { return !in_reasoning_; }

 private:
  void Emit(std::string_view text, SplitDelta* out);
  bool in_reasoning_ = true;
  bool at_start_ = true;  // the start is undecided: a leading <think> is dropped
  std::string held_;
};

}  // namespace dh::server
