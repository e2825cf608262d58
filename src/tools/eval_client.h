// The client side of `deepharness eval`: OpenAI-compatible /v1/completions (plus /tokenize and
// /v1/models) as lm-eval's local-completions model uses them, so any vLLM-style server works.
// Log-likelihoods: context and context+continuation are tokenized by the server, the continuation
// is whole[len(context):] (lm-eval's _encode_pair), the token ids are left-truncated to
// max_length and sent with echo + logprobs; the continuation's prompt-token logprobs are summed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace dh::tools {

struct EvalClientOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;    // empty: the first model of GET /v1/models
  std::string api_key;  // empty: none
  int max_length = 0;   // tokens of prompt sent; 0: the server's max_model_len - 1 (else 2047)
  int timeout_s = 600;
  int max_retries = 3;   // for connection errors, 429 and 5xx
  uint64_t seed = 1234;  // the request 'seed'
};

struct ContinuationScore {
  double logprob = 0;      // sum over the continuation's tokens
  int num_tokens = 0;      // continuation tokens
  bool truncated = false;  // the context was cut on the left to fit max_length
};

struct Generation {
  std::string text;  // cut at the first stop sequence
  int prompt_tokens = 0;
  bool truncated = false;
};

// One connection to the server; use one per worker thread (not thread-safe).
class CompletionClient {
 public:
  // Checks the URL, resolves the model name and max_length from /v1/models.
  static Result<EvalClientOptions> Resolve(EvalClientOptions options);
  explicit CompletionClient(EvalClientOptions resolved);
  ~CompletionClient();

  Result<std::vector<ContinuationScore>> Loglikelihoods(
      const std::string& context, const std::vector<std::string>& continuations);
  // Greedy generation of up to `max_tokens` after the prompt (left-truncated to
  // max_length - max_tokens tokens).
  Result<Generation> Generate(const std::string& prompt, const std::vector<std::string>& stops,
                              int max_tokens);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dh::tools
