// Reasoning splitter: a three-state machine (start, reasoning, content) over text, holding back
// any suffix that could still grow into "<think>" or "</think>".
#include "chat/reasoning.h"

#include <algorithm>

#include "chat/chat_template.h"

namespace dh::chat {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  size_t max = std::min(text.size(), tag.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

ReasoningStreamParser::ReasoningStreamParser(const ReasoningOptions& options) : options_(options) {}

ReasoningDelta ReasoningStreamParser::Push(std::string_view delta) {
  pending_.append(delta);
  return Drain(false);
}

ReasoningDelta ReasoningStreamParser::Finish() { return Drain(true); }

ReasoningDelta ReasoningStreamParser::Drain(bool final) {
  ReasoningDelta out;
  while (true) {
    if (state_ == State::kStart) {
      // Optional leading whitespace, then an optional "<think>".
      size_t ws = 0;
      while (ws < pending_.size() && IsSpace(pending_[ws])) ++ws;
      std::string_view rest = std::string_view(pending_).substr(ws);
      if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
        pending_.erase(0, ws + kThinkOpen.size());
        state_ = State::kReasoning;
        saw_reasoning_ = true;
        continue;
      }
      bool could_be_tag =
          rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest;
      if (could_be_tag && !final) return out;
      state_ = options_.starts_in_reasoning ? State::kReasoning : State::kContent;
      saw_reasoning_ = saw_reasoning_ || options_.starts_in_reasoning;
      continue;
    }
    if (state_ == State::kReasoning) {
      size_t close = pending_.find(kThinkClose);
      if (close != std::string::npos) {
        out.reasoning_content.append(pending_, 0, close);
        pending_.erase(0, close + kThinkClose.size());
        state_ = State::kContent;
        continue;
      }
      size_t keep = final ? 0 : PartialTagSuffix(pending_, kThinkClose);
      out.reasoning_content.append(pending_, 0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
    out.content.append(pending_);
    pending_.clear();
    return out;
  }
}

ReasoningResult ParseReasoning(std::string_view text, const ReasoningOptions& options) {
  ReasoningStreamParser parser(options);
  ReasoningDelta a = parser.Push(text);
  ReasoningDelta b = parser.Finish();
  ReasoningResult r;
  if (parser.saw_reasoning()) r.reasoning_content = a.reasoning_content + b.reasoning_content;
  std::string content = a.content + b.content;
  if (!content.empty()) r.content = std::move(content);
  return r;
}

ReasoningStart DetectReasoningStart(const ChatTemplate& tmpl, std::string_view bos_token,
                                    std::string_view eos_token) {
  const std::string& source = tmpl.source();
  if (source.find(kThinkOpen) == std::string::npos &&
      source.find(kThinkClose) == std::string::npos) {
    return ReasoningStart::kNone;
  }
  nlohmann::json context = {
      {"messages", nlohmann::json::array({{{"role", "user"}, {"content", "ping"}}})},
      {"bos_token", bos_token},
      {"eos_token", eos_token},
  };
  context["add_generation_prompt"] = false;
  auto without = tmpl.Render(context);
  context["add_generation_prompt"] = true;
  auto with = tmpl.Render(context);
  if (!without.ok() || !with.ok()) return ReasoningStart::kMayOpen;
  std::string_view prompt = *with;
  if (prompt.substr(0, without->size()) == *without) prompt.remove_prefix(without->size());
  while (!prompt.empty() && IsSpace(prompt.back())) prompt.remove_suffix(1);
  if (prompt.size() >= kThinkOpen.size() &&
      prompt.substr(prompt.size() - kThinkOpen.size()) == kThinkOpen) {
    return ReasoningStart::kInReasoning;
  }
  return ReasoningStart::kMayOpen;
}

}  // namespace dh::chat
