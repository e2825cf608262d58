// OpenAI request schemas parsed from JSON into native structs, with full validation (types,
// ranges, counts). Everything past this file sees only these structs: JSON stays in src/server.
// Unknown fields are ignored (vLLM behaviour); fields we cannot honour are a 400 naming them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "server/api_error.h"
#include "server/json_util.h"

namespace dh::server {

// Limits a client cannot exceed (reliability.md §1.D). All are checked before anything is
// allocated in proportion to the value.
struct RequestLimits {
  int max_n = 8;                    // n (and best_of)
  int max_top_logprobs = 20;        // chat top_logprobs
  int max_completion_logprobs = 5;  // /v1/completions logprobs
  int max_stop_strings = 4;
  size_t max_stop_string_bytes = 512;
  int max_stop_token_ids = 64;
  int max_logit_bias = 1024;
  int max_prompts = 64;             // prompts in one /v1/completions request
  int64_t max_seed = INT64_MAX;
  bool allow_request_chat_template = false;
};

// What the validator needs to know about the served model.
struct ModelLimits {
  int32_t vocab_size = 0;   // token ids must be in [0, vocab_size)
  int64_t max_model_len = 0;
};

// Sampling and stopping settings (the engine's SamplingParams is filled from these).
struct SamplingOptions {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;
  int top_k = -1;            // -1 or 0 = off
  double min_p = 0.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;  // empty strings dropped
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  std::optional<int64_t> max_tokens;  // max_completion_tokens wins over max_tokens
  int64_t min_tokens = 0;
  bool ignore_eos = false;
  int n = 1;
  bool logprobs = false;     // return logprobs of the sampled tokens
  int top_logprobs = 0;      // alternatives per position
  bool skip_special_tokens = true;
};

struct StreamOptions {
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage_stats = false;
};

// One chat message, normalized: content parts joined with "\n"; `content` null only for an
// assistant message (e.g. one that carried tool calls).
struct ChatMessage {
  std::string role;  // system | user | assistant | tool (developer is mapped to system)
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;
  std::optional<std::string> name;
  std::optional<std::string> tool_call_id;
  Json tool_calls;  // null or the array as sent (rendered by templates that know it)
};

struct ChatCompletionRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  SamplingOptions sampling;
  StreamOptions stream;
  Json tools;                  // null or array of tool definitions, passed to the template
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool include_reasoning = true;
  Json chat_template_kwargs;   // null or object
  std::optional<std::string> chat_template;  // only with RequestLimits::allow_request_chat_template
};

// A completion prompt: text or token ids.
using Prompt = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest {
  std::string model;
  std::vector<Prompt> prompts;
  SamplingOptions sampling;
  StreamOptions stream;
  bool echo = false;
  std::optional<int> logprobs;  // 0..max_completion_logprobs alternatives
  bool add_special_tokens = true;
};

// Parse + validate. `body` must already be a JSON object (ParseRequestBody).
std::variant<ChatCompletionRequest, ApiError> ParseChatCompletionRequest(
    const Json& body, const RequestLimits& limits, const ModelLimits& model);
std::variant<CompletionRequest, ApiError> ParseCompletionRequest(const Json& body,
                                                                 const RequestLimits& limits,
                                                                 const ModelLimits& model);

// /tokenize: {"model"?, "prompt": str} or {"model"?, "messages": [...]} (+ add_special_tokens,
// add_generation_prompt). /detokenize: {"model"?, "tokens": [int]}.
struct TokenizeRequest {
  std::optional<std::string> model;
  std::optional<std::string> prompt;
  std::vector<ChatMessage> messages;  // used when prompt is absent
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
};
struct DetokenizeRequest {
  std::optional<std::string> model;
  std::vector<int32_t> tokens;
};
std::variant<TokenizeRequest, ApiError> ParseTokenizeRequest(const Json& body);
std::variant<DetokenizeRequest, ApiError> ParseDetokenizeRequest(const Json& body,
                                                                 const ModelLimits& model);

// Checks prompt length + max_tokens against the context; fills max_tokens when absent
// (chat: the rest of the context; completions: 16, capped by the context).
std::optional<ApiError> CheckContextLength(int64_t prompt_tokens, int64_t max_model_len,
                                           std::optional<int64_t>* max_tokens,
                                           int64_t default_max_tokens);

}  // namespace dh::server
