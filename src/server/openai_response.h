// OpenAI response bodies and SSE events built from native results: chat.completion,
// chat.completion.chunk, text_completion (full and streamed), usage. The SSE stream of one
// request is: role delta per choice, content/reasoning_content deltas, one finish_reason chunk
// per choice, an optional usage chunk (choices: []), then `data: [DONE]`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/json_util.h"

namespace dh::server {

struct ResponseMeta {
  std::string id;       // chatcmpl-... / cmpl-...
  int64_t created = 0;  // unix seconds
  std::string model;    // served name
  std::string system_fingerprint = "deepharness-0.1.0";
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;     // prompt tokens served from the prefix cache
  int64_t reasoning_tokens = 0;  // completion tokens inside the thinking span
};

// One sampled position: the token text, its logprob and the top alternatives.
struct TokenLogprob {
  std::string token;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};

struct ChatChoice {
  int index = 0;
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;
  Json tool_calls;            // null or OpenAI's tool_calls array
  std::string finish_reason;  // stop | length | abort | tool_calls
  std::optional<std::string> stop_reason;  // the matched stop string (vLLM extension)
  bool has_logprobs = false;
  std::vector<TokenLogprob> logprobs;
};

// Completion logprobs entry; `logprob` is empty for the first echoed prompt token.
struct CompletionLogprob {
  std::string token;
  std::optional<float> logprob;
  std::vector<std::pair<std::string, float>> top;
  bool has_top = true;
  int64_t text_offset = 0;
};

struct CompletionChoice {
  int index = 0;
  std::string text;
  std::string finish_reason;
  std::optional<std::string> stop_reason;
  bool has_logprobs = false;
  std::vector<CompletionLogprob> logprobs;
};

Json UsageJson(const Usage& usage);
Json ChatLogprobsJson(const std::vector<TokenLogprob>& entries);
Json CompletionLogprobsJson(const std::vector<CompletionLogprob>& entries);

Json ChatCompletionJson(const ResponseMeta& meta, const std::vector<ChatChoice>& choices,
                        const Usage& usage);
Json CompletionJson(const ResponseMeta& meta, const std::vector<CompletionChoice>& choices,
                    const Usage& usage);

// Streaming pieces. A delta holds role (first chunk only), content and/or reasoning_content.
struct ChatDelta {
  bool role = false;
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;
  Json tool_calls;  // null or [{index, id?, type?, function: {name?, arguments}}]
};
Json ChatChunkJson(const ResponseMeta& meta, int index, const ChatDelta& delta,
                   const std::optional<std::string>& finish_reason, const Json& logprobs,
                   const Json& usage = nullptr);
Json CompletionChunkJson(const ResponseMeta& meta, int index, const std::string& text,
                         const std::optional<std::string>& finish_reason, const Json& logprobs,
                         const Json& usage = nullptr);
// The final usage chunk (choices: []).
Json UsageChunkJson(const ResponseMeta& meta, const char* object, const Usage& usage);

// "data: <json>\n\n" (never throws on invalid UTF-8).
std::string SseEvent(const Json& payload);
inline constexpr const char kSseDone[] = "data: [DONE]\n\n";

}  // namespace dh::server
