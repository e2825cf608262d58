// DeepSeek-R1-style reasoning split: "<think>reasoning</think>answer" -> reasoning_content and
// content, for a whole completion or incrementally for streamed text deltas (a delta may cut a tag
// anywhere). Semantics follow vLLM's deepseek_r1 parser: text before "</think>" is reasoning; with
// no "</think>" at all, everything is reasoning and content is null.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dh::chat {

class ChatTemplate;

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

struct ReasoningOptions {
  // True when the prompt already opened "<think>" (R1 templates), so the output starts inside the
  // reasoning. False: only an output that begins with "<think>" has reasoning; otherwise it is all
  // content (Qwen3, R1-Distill models that emit the tag themselves).
  bool starts_in_reasoning = true;
};

struct ReasoningResult {
  std::optional<std::string> reasoning_content;  // null when there was no reasoning part
  std::optional<std::string> content;            // null when empty
};

// Splits a whole completion. Equal to feeding it to ReasoningStreamParser in any pieces.
ReasoningResult ParseReasoning(std::string_view text, const ReasoningOptions& options = {});

struct ReasoningDelta {
  std::string reasoning_content;
  std::string content;
};

// Incremental splitter. Push() returns what can be emitted now; text that might be the start of
// a tag is held back until the next Push() or Finish().
class ReasoningStreamParser {
 public:
  explicit ReasoningStreamParser(const ReasoningOptions& options = {});

  ReasoningDelta Push(std::string_view delta);
  // Flushes held-back text at the end of the stream.
  ReasoningDelta Finish();

  bool in_reasoning() const { return state_ == State::kReasoning; }
  bool saw_reasoning() const { return saw_reasoning_; }

 private:
  enum class State { kStart, kReasoning, kContent };
  ReasoningDelta Drain(bool final);

  ReasoningOptions options_;
  State state_ = State::kStart;
  std::string pending_;
  bool saw_reasoning_ = false;
};

// How a chat template treats thinking, so a server can pick the parser on its own.
enum class ReasoningStart {
  kNone,         // the template never mentions <think>: no reasoning parsing
  kMayOpen,      // the template knows <think> but the generation prompt leaves it to the model
  kInReasoning,  // the generation prompt ends with an open "<think>": output starts in reasoning
};

// Renders a one-message conversation with and without the generation prompt and looks at what the
// prompt adds; falls back to scanning the source when the probe render fails.
ReasoningStart DetectReasoningStart(const ChatTemplate& tmpl, std::string_view bos_token = "",
                                    std::string_view eos_token = "");

}  // namespace dh::chat
