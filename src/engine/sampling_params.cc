// SamplingParams validation and small engine.h helpers. Messages name the field and the range.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/engine.h"

namespace dh {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kNone:
      break;
  }
  return "";
}

Status SamplingParams::Validate(int64_t vocab_size, bool has_tokenizer) const {
  auto finite = [](float v) { return std::isfinite(v); };
  if (!finite(temperature) || temperature < 0.0f) {
    return InvalidArgument("temperature: must be >= 0, got {}", temperature);
  }
  if (!finite(top_p) || top_p <= 0.0f || top_p > 1.0f) {
    return InvalidArgument("top_p: must be in (0, 1], got {}", top_p);
  }
  if (top_k < -1) return InvalidArgument("top_k: must be -1, 0 or positive, got {}", top_k);
  if (!finite(min_p) || min_p < 0.0f || min_p > 1.0f) {
    return InvalidArgument("min_p: must be in [0, 1], got {}", min_p);
  }
  if (!finite(presence_penalty) || presence_penalty < -2.0f || presence_penalty > 2.0f) {
    return InvalidArgument("presence_penalty: must be in [-2, 2], got {}", presence_penalty);
  }
  if (!finite(frequency_penalty) || frequency_penalty < -2.0f || frequency_penalty > 2.0f) {
    return InvalidArgument("frequency_penalty: must be in [-2, 2], got {}", frequency_penalty);
  }
  if (!finite(repetition_penalty) || repetition_penalty <= 0.0f) {
    return InvalidArgument("repetition_penalty: must be > 0, got {}", repetition_penalty);
  }
  if (logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return InvalidArgument("logit_bias: at most {} entries, got {}", kMaxLogitBias,
                           logit_bias.size());
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return InvalidArgument("logit_bias: token id {} is out of vocabulary (size {})", id,
                             vocab_size);
    }
    if (!finite(bias) || bias < -100.0f || bias > 100.0f) {
      return InvalidArgument("logit_bias: value for token {} must be in [-100, 100], got {}", id,
                             bias);
    }
  }
  if (stop.size() > static_cast<size_t>(kMaxStopStrings)) {
    return InvalidArgument("stop: at most {} stop strings, got {}", kMaxStopStrings, stop.size());
  }
  for (const auto& s : stop) {
    if (s.size() > kMaxStopStringBytes) {
      return InvalidArgument("stop: each stop string must be at most {} bytes, got {}",
                             kMaxStopStringBytes, s.size());
    }
  }
  if (!stop.empty() && !has_tokenizer) {
    return InvalidArgument("stop: stop strings need a tokenizer");
  }
  if (stop_token_ids.size() > static_cast<size_t>(kMaxStopTokenIds)) {
    return InvalidArgument("stop_token_ids: at most {} ids, got {}", kMaxStopTokenIds,
                           stop_token_ids.size());
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return InvalidArgument("stop_token_ids: token id {} is out of vocabulary (size {})", id,
                             vocab_size);
    }
  }
  if (max_tokens < 0) return InvalidArgument("max_tokens: must be >= 0, got {}", max_tokens);
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return InvalidArgument("min_tokens: must be in [0, max_tokens = {}], got {}", max_tokens,
                           min_tokens);
  }
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    return InvalidArgument("logprobs: must be in [0, {}], got {}", kMaxLogprobs, logprobs);
  }
  if (prompt_logprobs < -1 || prompt_logprobs > kMaxLogprobs) {
    return InvalidArgument("prompt_logprobs: must be in [0, {}], got {}", kMaxLogprobs,
                           prompt_logprobs);
  }
  return Status::Ok();
}

uint64_t DefaultKvCacheMemory() {
  constexpr uint64_t kMin = 64ull << 20;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    fields >> kib;
    return std::max(kMin, kib * 1024 / 2);
  }
  return kMin;
}

}  // namespace dh
