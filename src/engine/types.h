// The engine's value types: what a request asks for (Request, SamplingParams) and what comes back
// (RequestOutput deltas, logprobs, usage, timing). Plain data with no engine machinery, so the
// sampler, the request channel and the server can use them without engine.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace dh {

using EngineClock = std::chrono::steady_clock;
using EngineTime = EngineClock::time_point;

// Largest number of top alternatives per position (OpenAI's top_logprobs range is 0..20).
inline constexpr int kMaxLogprobs = 20;
// Limits that keep one request from costing unbounded work in the engine thread.
inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;
inline constexpr int kMaxStopTokenIds = 64;
inline constexpr int kMaxLogitBias = 1024;

// A per-sequence constraint on which tokens may come next (structured output). The engine calls
// Mask on the raw logits row before sampling and Accept with the sampled token; the server builds
// it (src/grammar), so the engine never sees schemas. One object per request, used only by the
// engine thread.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the logits of disallowed ids to -inf; `eos_ids` are allowed only where the constraint
  // may end. Returns false when no token at all is allowed (the request then finishes "stop").
  virtual bool Mask(std::span<float> logits, std::span<const int32_t> eos_ids) = 0;
  virtual void Accept(int32_t token) = 0;
};

// How one sequence is sampled and when it stops. Defaults are "plain sampling, no limits but
// max_tokens". The server maps OpenAI/vLLM fields onto these (n > 1 is n separate requests,
// each with its own seed, e.g. seed + i).
struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (argmax; ties to the lowest id)
  float top_p = 1.0f;        // (0, 1]; 1: off
  int top_k = 0;             // <= 0: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  // OpenAI-style additive penalties over the generated tokens: logit -= presence * [count > 0]
  // + frequency * count. Range [-2, 2].
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // HF-style multiplicative penalty over prompt and generated tokens (> 0; 1: off): a positive
  // logit is divided by it, a negative one multiplied.
  float repetition_penalty = 1.0f;
  std::map<int32_t, float> logit_bias;  // token id -> added to its logit; values in [-100, 100]
  // Seeds this request's own RNG; output then does not depend on what else is batched with it.
  // Without a seed the engine draws one.
  std::optional<uint64_t> seed;

  // Stop strings: matched on the detokenized output, possibly across token boundaries. The
  // matched text is not included in the output unless include_stop_str_in_output. Needs a
  // tokenizer; without one they are rejected by Validate.
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  std::vector<int32_t> stop_token_ids;  // finish "stop" when sampled (the token is output)
  bool ignore_eos = false;              // do not stop at the EOS ids
  int max_tokens = 16;                  // generated-token cap (>= 0); also capped by context
  int min_tokens = 0;                   // EOS and stop token ids are suppressed until reached
  bool skip_special_tokens = true;      // for the text output

  // Log-probabilities (log-softmax of the raw model logits, before any penalty or filter).
  // logprobs = -1: none; 0..kMaxLogprobs: the sampled token's logprob plus this many top
  // alternatives per generated token.
  int logprobs = -1;
  // The same for the prompt tokens (echo), delivered in the first output event. The first prompt
  // token has no logprob. A request with prompt logprobs bypasses the prefix cache (cached
  // tokens have no logits).
  int prompt_logprobs = -1;
  // Structured output: null for free text. min_tokens does not hold EOS back under a
  // constraint (the constraint decides where the output may end).
  std::shared_ptr<TokenConstraint> constraint;

  // Checks ranges and ids (vocab_size: the model's logits width). Errors name the field, e.g.
  // "top_p: must be in (0, 1], got 0".
  Status Validate(int64_t vocab_size, bool has_tokenizer) const;
};

struct Request {
  // Unique among requests in flight (the server uses its response id); empty: the engine makes
  // one ("req-<n>").
  std::string id;
  std::vector<int32_t> prompt_token_ids;  // non-empty, ids in [0, vocab)
  SamplingParams sampling;
  // When the request reached the server; default (epoch): the time of Submit.
  EngineTime arrival_time{};
};

enum class FinishReason { kNone, kStop, kLength, kAbort };
// "stop" | "length" | "abort" ("" for kNone): the OpenAI / vLLM label.
const char* FinishReasonName(FinishReason reason);

struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct TokenLogprob {
  int32_t token_id = 0;  // the sampled (or prompt) token
  float logprob = 0.0f;
  int32_t rank = 0;             // 1-based rank of token_id among all logits
  std::vector<TopLogprob> top;  // the `logprobs` best alternatives, best first
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens served from the prefix cache (first scheduling)
};

// Times for metrics (all from EngineClock). Unset points are the epoch.
struct RequestTiming {
  EngineTime arrival{};
  EngineTime first_scheduled{};  // queue time = first_scheduled - arrival
  // TTFT = first_token - arrival; prefill time = first_token - first_scheduled.
  EngineTime first_token{};
  EngineTime last_token{};  // decode time = last_token - first_token
  EngineTime finished{};
};

// One event on a request's channel. Events are deltas: token_ids, token_times, logprobs and text
// are what is new since the previous event read from the handle (RequestHandle::Next merges all
// pending events into one, so a slow reader catches up in one call).
struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> token_ids;       // new generated tokens
  std::vector<EngineTime> token_times;  // when each new token was sampled (parallel to token_ids)
  std::vector<TokenLogprob> logprobs;   // parallel to token_ids when sampling.logprobs >= 0
  // New text (UTF-8, complete characters only). Text that could still become part of a stop
  // string is held back until it cannot; empty without a tokenizer. Because of that hold-back
  // and multi-byte characters, text and token_ids of one event need not line up.
  std::string text;
  // Only in the first event, when sampling.prompt_logprobs >= 0: one entry per prompt token,
  // the first one empty.
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;

  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  // When finish_reason is kStop: the stop string that matched, or the stop token id (EOS or one
  // of stop_token_ids). Both unset for a natural EOS is not possible: EOS sets stop_token_id.
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token_id;
  Status error;          // set when the request ended on an engine error (finish_reason kAbort)
  Usage usage;           // running totals as of this event
  RequestTiming timing;  // as of this event (complete in the finished event)
};

}  // namespace dh
