// Internals shared by the full-response and streaming paths of GenerationService: the
// per-choice accumulator, engine-request submission and the conversions to OpenAI structs.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/reasoning_stream.h"
#include "server/structured_output.h"
#include "server/tool_calls.h"

namespace dh::server::internal {

// Everything one engine request (one choice) has produced so far.
struct ChoiceState {
  std::shared_ptr<RequestHandle> handle;
  int index = 0;         // choice index in the response
  int prompt_index = 0;  // which prompt (completions with a list of prompts)
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<dh::TokenLogprob> logprobs;
  std::vector<std::optional<dh::TokenLogprob>> prompt_logprobs;
  std::vector<EngineTime> token_times;
  RequestOutput last;  // finish info, usage, timing of the latest event
  bool finished = false;
  bool recorded = false;
  ReasoningSplitter splitter;
  // Tool calls (generation_tools.cc): streamed state of this choice.
  std::shared_ptr<ToolCallStreamer> tool_stream;
  std::shared_ptr<ForcedCallStreamer> forced_stream;
  std::string tool_text;
  std::string tool_id;
};

// Appends an event's deltas to `state`.
void Absorb(ChoiceState& state, RequestOutput&& out);

// The shared state of one HTTP request.
struct Job {
  ResponseMeta meta;
  std::vector<ChoiceState> choices;
  std::vector<std::string> echo_text;  // per prompt (completions with echo)
  std::vector<std::vector<int32_t>> prompts;
  SamplingOptions sampling;
  StreamOptions stream;
  bool reasoning = false;
  bool include_reasoning = true;
  std::optional<int32_t> think_end_id;
  int completion_logprobs = -1;  // completions: alternatives per position; -1 none
  bool echo = false;
  int64_t max_tokens = 0;
  const Tokenizer* tokenizer = nullptr;
  ServerMetrics* metrics = nullptr;
  StructuredOutput::Compiled grammar;  // structured output: each choice gets its own matcher
  std::optional<ToolRequest> tools;    // chat with tools and tool_choice != none
  ToolParser tool_parser = ToolParser::kNone;
  std::vector<std::string> tool_trailing;  // end-of-turn texts stripped before parsing
};

// Maps validated options onto the engine's params (seed + choice for n > 1).
SamplingParams ToEngineParams(const SamplingOptions& s, int64_t max_tokens, int choice,
                              int prompt_logprobs, int logprobs);

// Submits one engine request per (prompt, choice); on failure the already-submitted ones are
// cancelled (their handles dropped) and the error is returned.
std::optional<ApiError> SubmitAll(Engine& engine, Job& job, int logprobs, int prompt_logprobs,
                                  ServerMetrics* metrics);

// Records a finished (or abandoned) choice in the metrics once.
void RecordChoice(Job& job, ChoiceState& state, bool aborted);

Usage TotalUsage(const Job& job);
std::string TokenText(const Tokenizer* tokenizer, int32_t id);
std::vector<TokenLogprob> ChatLogprobs(const Tokenizer* tokenizer,
                                       const std::vector<dh::TokenLogprob>& entries);
// Completion-format entries; `offset` is the running text offset, advanced by each token.
std::vector<CompletionLogprob> CompletionLogprobs(
    const Tokenizer* tokenizer, const std::vector<std::optional<dh::TokenLogprob>>& entries,
    int64_t* offset);
std::optional<std::string> StopReason(const RequestOutput& out, const Tokenizer* tokenizer);

std::unique_ptr<StreamJob> MakeChatStream(std::shared_ptr<Job> job);
std::unique_ptr<StreamJob> MakeCompletionStream(std::shared_ptr<Job> job);

}  // namespace dh::server::internal
