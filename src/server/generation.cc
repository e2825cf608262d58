// GenerationService: request preparation, submission and full (non-streamed) responses.
#include "server/generation.h"

#include <atomic>
#include <chrono>
#include <random>

#include <fmt/format.h>

#include "server/generation_internal.h"
#include "server/generation_tools.h"

namespace dh::server {
namespace internal {
namespace {

double Seconds(EngineTime from, EngineTime to) {
  if (from == EngineTime{} || to == EngineTime{} || to < from) return 0;
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

void Absorb(ChoiceState& state, RequestOutput&& out) {
  state.text += out.text;
  state.token_ids.insert(state.token_ids.end(), out.token_ids.begin(), out.token_ids.end());
  state.logprobs.insert(state.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  state.token_times.insert(state.token_times.end(), out.token_times.begin(), out.token_times.end());
  if (!out.prompt_logprobs.empty()) state.prompt_logprobs = std::move(out.prompt_logprobs);
  state.finished = state.finished || out.finished;
  state.last = std::move(out);
}

SamplingParams ToEngineParams(const SamplingOptions& s, int64_t max_tokens, int choice,
                              int prompt_logprobs, int logprobs) {
  SamplingParams p;
  p.temperature = static_cast<float>(s.temperature);
  p.top_p = static_cast<float>(s.top_p);
  p.top_k = s.top_k > 0 ? s.top_k : 0;
  p.min_p = static_cast<float>(s.min_p);
  p.presence_penalty = static_cast<float>(s.presence_penalty);
  p.frequency_penalty = static_cast<float>(s.frequency_penalty);
  p.repetition_penalty = static_cast<float>(s.repetition_penalty);
  for (const auto& [id, bias] : s.logit_bias) p.logit_bias[id] = bias;
  if (s.seed) p.seed = static_cast<uint64_t>(*s.seed) + static_cast<uint64_t>(choice);
  p.stop = s.stop;
  p.include_stop_str_in_output = s.include_stop_str_in_output;
  p.stop_token_ids = s.stop_token_ids;
  p.ignore_eos = s.ignore_eos;
  p.max_tokens = static_cast<int>(max_tokens);
  p.min_tokens = static_cast<int>(std::min<int64_t>(s.min_tokens, max_tokens));
  p.skip_special_tokens = s.skip_special_tokens;
  p.logprobs = logprobs;
  p.prompt_logprobs = prompt_logprobs;
  return p;
}

std::optional<ApiError> SubmitAll(Engine& engine, Job& job, int logprobs, int prompt_logprobs,
                                  ServerMetrics* metrics) {
  const EngineTime arrival = EngineClock::now();
  int index = 0;
  for (size_t p = 0; p < job.prompts.size(); ++p) {
    for (int i = 0; i < job.sampling.n; ++i, ++index) {
      Request request;
      request.id = fmt::format("{}-{}", job.meta.id, index);
      request.prompt_token_ids = job.prompts[p];
      request.sampling = ToEngineParams(job.sampling, job.max_tokens, i, prompt_logprobs, logprobs);
      if (job.grammar) {
        // With a reasoning template (R1), the <think> span is free and the grammar governs the
        // answer after </think>.
        request.sampling.constraint = StructuredOutput::NewConstraint(
            job.grammar, job.reasoning ? job.think_end_id : std::nullopt);
      }
      request.arrival_time = arrival;
      auto handle = engine.Submit(std::move(request));
      if (!handle.ok()) {
        job.choices.clear();  // dropping the handles cancels what was submitted
        const Status& s = handle.status();
        if (s.code() == StatusCode::kResourceExhausted) {
          if (metrics) metrics->RecordRejected("queue_full");
          return Overloaded();
        }
        if (s.code() == StatusCode::kCancelled) {
          if (metrics) metrics->RecordRejected("draining");
          return ShuttingDown();
        }
        if (s.code() == StatusCode::kOutOfRange)
          return BadRequest("max_tokens", s.message(), "context_length_exceeded");
        return FromStatus(s);
      }
      ChoiceState state;
      state.handle = std::move(handle).value();
      state.index = index;
      state.prompt_index = static_cast<int>(p);
      job.choices.push_back(std::move(state));
    }
  }
  return std::nullopt;
}

void RecordChoice(Job& job, ChoiceState& state, bool aborted) {
  if (state.recorded || !job.metrics) return;
  state.recorded = true;
  const RequestOutput& out = state.last;
  const RequestTiming& t = out.timing;
  RequestRecord r;
  r.finished_reason = aborted ? "abort" : FinishReasonName(out.finish_reason);
  if (r.finished_reason.empty()) r.finished_reason = "abort";
  r.prompt_tokens = out.usage.prompt_tokens;
  r.generation_tokens = static_cast<int64_t>(state.token_ids.size());
  r.max_tokens = job.max_tokens;
  r.n = job.sampling.n;
  EngineTime finished = t.finished != EngineTime{} ? t.finished : EngineClock::now();
  r.ttft = t.first_token != EngineTime{} ? Seconds(t.arrival, t.first_token) : -1;
  for (size_t i = 1; i < state.token_times.size(); ++i)
    r.itls.push_back(Seconds(state.token_times[i - 1], state.token_times[i]));
  r.e2e = Seconds(t.arrival, finished);
  r.queue_time = Seconds(t.arrival, t.first_scheduled);
  r.prefill_time = Seconds(t.first_scheduled, t.first_token);
  r.decode_time = Seconds(t.first_token, t.last_token);
  job.metrics->RecordRequest(r);
}

Usage TotalUsage(const Job& job) {
  Usage u;
  std::vector<bool> prompt_counted(job.prompts.size(), false);
  for (const ChoiceState& c : job.choices) {
    if (!prompt_counted[c.prompt_index]) {
      prompt_counted[c.prompt_index] = true;
      u.prompt_tokens += c.last.usage.prompt_tokens > 0
                             ? c.last.usage.prompt_tokens
                             : static_cast<int64_t>(job.prompts[c.prompt_index].size());
      u.cached_tokens += c.last.usage.cached_tokens;
    }
    u.completion_tokens += static_cast<int64_t>(c.token_ids.size());
    if (job.reasoning) {
      int64_t reasoning = static_cast<int64_t>(c.token_ids.size());
      if (job.think_end_id) {
        for (size_t i = 0; i < c.token_ids.size(); ++i) {
          if (c.token_ids[i] == *job.think_end_id) {
            reasoning = static_cast<int64_t>(i);
            break;
          }
        }
      } else if (!c.splitter.in_reasoning()) {
        reasoning = 0;  // no end-tag token to count by
      }
      u.reasoning_tokens += reasoning;
    }
  }
  return u;
}

std::string TokenText(const Tokenizer* tokenizer, int32_t id) {
  if (!tokenizer) return fmt::format("token_id:{}", id);
  auto text = tokenizer->Decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
  return text.ok() ? *text : std::string();
}

std::vector<TokenLogprob> ChatLogprobs(const Tokenizer* tokenizer,
                                       const std::vector<dh::TokenLogprob>& entries) {
  std::vector<TokenLogprob> out;
  out.reserve(entries.size());
  for (const dh::TokenLogprob& e : entries) {
    TokenLogprob t;
    t.token = TokenText(tokenizer, e.token_id);
    t.logprob = e.logprob;
    for (const TopLogprob& alt : e.top) t.top.emplace_back(TokenText(tokenizer, alt.token_id), alt.logprob);
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<CompletionLogprob> CompletionLogprobs(
    const Tokenizer* tokenizer, const std::vector<std::optional<dh::TokenLogprob>>& entries,
    int64_t* offset) {
  std::vector<CompletionLogprob> out;
  out.reserve(entries.size());
  for (const auto& e : entries) {
    CompletionLogprob c;
    c.text_offset = *offset;
    if (e) {
      c.token = TokenText(tokenizer, e->token_id);
      c.logprob = e->logprob;
      for (const TopLogprob& alt : e->top) c.top.emplace_back(TokenText(tokenizer, alt.token_id), alt.logprob);
    } else {
      c.has_top = false;
    }
    *offset += static_cast<int64_t>(c.token.size());
    out.push_back(std::move(c));
  }
  return out;
}

std::optional<std::string> StopReason(const RequestOutput& out, const Tokenizer* tokenizer) {
  if (out.finish_reason != FinishReason::kStop) return std::nullopt;
  if (out.stop_string) return *out.stop_string;
  return std::nullopt;
}

}  // namespace internal

using internal::ChoiceState;
using internal::Job;

// 128 random bits per id (ids are not guessable from one another, unlike a counter).
std::string NewResponseId(const char* prefix) {
  thread_local std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }();
  const uint64_t hi = rng();
  const uint64_t lo = rng();
  return fmt::format("{}{:016x}{:016x}", prefix, hi, lo);
}

GenerationService::GenerationService(Engine* engine, const Tokenizer* tokenizer,
                                     const ChatPromptRenderer* renderer, GenerationConfig config,
                                     ServerMetrics* metrics)
    : engine_(engine),
      tokenizer_(tokenizer),
      renderer_(renderer),
      config_(std::move(config)),
      metrics_(metrics) {
  if (tokenizer_) think_end_id_ = tokenizer_->TokenToId("</think>");
  structured_ = std::make_unique<StructuredOutput>(tokenizer_, model_limits().vocab_size);
  tool_parser_ = internal::ResolveToolParser(config_.tool_call_parser,
                                             renderer_ ? renderer_->Source() : std::string_view(),
                                             tokenizer_);
}

std::optional<ApiError> GenerationService::PrepareStructured(const Json& body, internal::Job& job,
                                                             Reply* reply) {
  auto spec = ParseStructuredSpec(body);
  if (auto* e = std::get_if<ApiError>(&spec)) return *e;
  const StructuredSpec& s = std::get<StructuredSpec>(spec);
  if (s.kind == StructuredSpec::Kind::kNone) return std::nullopt;
  std::vector<std::string> ignored;
  auto compiled = structured_->Compile(s, &ignored);
  if (auto* e = std::get_if<ApiError>(&compiled)) return *e;
  job.grammar = std::get<StructuredOutput::Compiled>(compiled);
  if (!ignored.empty()) {
    std::string list;
    for (const std::string& k : ignored) list += (list.empty() ? "" : "; ") + k;
    reply->warning = "JSON Schema keywords not enforced (strict: false): " + list;
  }
  return std::nullopt;
}

ModelLimits GenerationService::model_limits() const {
  ModelLimits m;
  m.vocab_size = static_cast<int32_t>(engine_->model().config().vocab_size);
  if (tokenizer_) m.vocab_size = std::min(m.vocab_size, tokenizer_->vocab_size());
  m.max_model_len = engine_->max_model_len();
  return m;
}

Reply GenerationService::Error(const ApiError& error) const {
  Reply r;
  r.status = error.status;
  r.body = ErrorBody(error);
  r.retry_after = error.status == 503;
  return r;
}

// The client closed its connection before the answer was ready: nobody reads this reply.
Reply GenerationService::ClientGoneReply() const {
  ApiError e;
  e.status = 499;
  e.type = "invalid_request_error";
  e.message = "The client closed the connection";
  e.code = "client_closed_request";
  return Error(e);
}

std::optional<ApiError> GenerationService::CheckModel(std::string& model) const {
  // 'model' is optional (vLLM, llama.cpp): without it the first served name is used.
  if (model.empty()) {
    model = config_.served_model_names.front();
    return std::nullopt;
  }
  for (const std::string& name : config_.served_model_names)
    if (name == model) return std::nullopt;
  std::string served;
  for (const std::string& name : config_.served_model_names) served += (served.empty() ? "" : ", ") + name;
  return ModelNotFound(served);
}

namespace {

// Waits for every choice to finish (full responses). When `client_alive` says the client has
// gone, every unfinished choice is cancelled (its sequence freed) and false is returned.
bool WaitAll(Job& job, const ClientAlive& client_alive) {
  auto cancel_all = [&job] {
    for (ChoiceState& c : job.choices)
      if (!c.finished) c.handle->Cancel();
  };
  for (ChoiceState& c : job.choices) {
    while (!c.finished) {
      auto out = c.handle->Next(std::chrono::milliseconds(100));
      if (out) internal::Absorb(c, std::move(*out));
      if (!c.finished && client_alive && !client_alive()) {
        cancel_all();
        return false;
      }
    }
    internal::RecordChoice(job, c, false);
  }
  return true;
}

// The first choice's engine error, or null when every choice ended normally.
const Status* FirstEngineError(const Job& job) {
  for (const ChoiceState& c : job.choices)
    if (!c.last.error.ok()) return &c.last.error;
  return nullptr;
}

}  // namespace

Reply GenerationService::ChatCompletions(const Json& body, const ClientAlive& client_alive) {
  auto parsed = ParseChatCompletionRequest(body, config_.limits, model_limits());
  if (auto* e = std::get_if<ApiError>(&parsed)) return Error(*e);
  ChatCompletionRequest& req = std::get<ChatCompletionRequest>(parsed);
  if (auto e = CheckModel(req.model)) return Error(*e);
  if (!tokenizer_ || !renderer_)
    return Error(BadRequest("messages", "this model has no tokenizer or chat template"));
  auto prompt = renderer_->Render(req.messages, req.tools, req.add_generation_prompt,
                                  req.chat_template_kwargs);
  if (!prompt.ok()) return Error(BadRequest("messages", prompt.status().message()));
  auto ids = tokenizer_->Encode(*prompt, /*add_special_tokens=*/false);
  if (!ids.ok()) return Error(BadRequest("messages", ids.status().message()));
  if (ids->empty()) return Error(BadRequest("messages", "the rendered prompt is empty"));
  std::optional<int64_t> max_tokens = req.sampling.max_tokens;
  if (auto e = CheckContextLength(static_cast<int64_t>(ids->size()), engine_->max_model_len(),
                                  &max_tokens, 0))
    return Error(*e);

  auto job = std::make_shared<Job>();
  job->meta = {NewResponseId("chatcmpl-"), std::time(nullptr), req.model};
  job->prompts.push_back(std::move(ids).value());
  job->sampling = req.sampling;
  job->stream = req.stream;
  job->reasoning = config_.reasoning;
  job->include_reasoning = req.include_reasoning;
  job->think_end_id = think_end_id_;
  job->max_tokens = *max_tokens;
  job->tokenizer = tokenizer_;
  job->metrics = metrics_;
  Reply reply;
  if (auto e = PrepareStructured(body, *job, &reply)) return Error(*e);
  if (auto e = internal::PrepareTools(body, *job, tool_parser_, *structured_)) return Error(*e);
  job->tool_trailing = internal::EndOfTurnTexts(tokenizer_);
  const int logprobs = req.sampling.logprobs ? req.sampling.top_logprobs : -1;
  if (auto e = internal::SubmitAll(*engine_, *job, logprobs, -1, metrics_)) return Error(*e);

  if (req.stream.stream) {
    reply.stream = internal::MakeChatStream(job);
    return reply;
  }
  if (!WaitAll(*job, client_alive)) return ClientGoneReply();
  if (const Status* e = FirstEngineError(*job)) return Error(FromEngineError(*e));
  std::vector<ChatChoice> choices;
  for (ChoiceState& c : job->choices) {
    ChatChoice choice;
    choice.index = c.index;
    choice.finish_reason = FinishReasonName(c.last.finish_reason);
    choice.stop_reason = internal::StopReason(c.last, tokenizer_);
    if (job->reasoning) {
      SplitDelta a = c.splitter.Push(c.text);
      SplitDelta b = c.splitter.Finish();
      std::string reasoning = a.reasoning + b.reasoning;
      std::string content = a.content + b.content;
      if (job->include_reasoning) choice.reasoning_content = reasoning;
      if (!content.empty()) choice.content = content;
    } else {
      choice.content = c.text;
    }
    internal::ApplyToolCalls(*job, c, &choice);
    choice.has_logprobs = req.sampling.logprobs;
    if (choice.has_logprobs) choice.logprobs = internal::ChatLogprobs(tokenizer_, c.logprobs);
    choices.push_back(std::move(choice));
  }
  reply.body = SafeDump(ChatCompletionJson(job->meta, choices, internal::TotalUsage(*job)));
  return reply;
}

Reply GenerationService::Completions(const Json& body, const ClientAlive& client_alive) {
  auto parsed = ParseCompletionRequest(body, config_.limits, model_limits());
  if (auto* e = std::get_if<ApiError>(&parsed)) return Error(*e);
  CompletionRequest& req = std::get<CompletionRequest>(parsed);
  if (auto e = CheckModel(req.model)) return Error(*e);

  auto job = std::make_shared<Job>();
  job->meta = {NewResponseId("cmpl-"), std::time(nullptr), req.model};
  std::optional<int64_t> max_tokens = req.sampling.max_tokens;
  int64_t longest = 0;
  for (Prompt& prompt : req.prompts) {
    std::vector<int32_t> ids;
    std::string echo;
    if (auto* text = std::get_if<std::string>(&prompt)) {
      if (!tokenizer_) return Error(BadRequest("prompt", "this model has no tokenizer: send token ids"));
      auto encoded = tokenizer_->Encode(*text, req.add_special_tokens);
      if (!encoded.ok()) return Error(BadRequest("prompt", encoded.status().message()));
      ids = std::move(encoded).value();
      echo = *text;
    } else {
      ids = std::get<std::vector<int32_t>>(prompt);
      if (req.echo && tokenizer_) {
        auto decoded = tokenizer_->Decode(ids, /*skip_special_tokens=*/false);
        if (decoded.ok()) echo = *decoded;
      }
    }
    if (ids.empty()) return Error(BadRequest("prompt", "'prompt' must be non-empty"));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(ids.size()));
    job->prompts.push_back(std::move(ids));
    job->echo_text.push_back(std::move(echo));
  }
  if (auto e = CheckContextLength(longest, engine_->max_model_len(), &max_tokens, 16)) {
    ApiError err = *e;
    if (err.param == "messages") err.param = "prompt";
    return Error(err);
  }
  job->sampling = req.sampling;
  job->stream = req.stream;
  job->echo = req.echo;
  job->completion_logprobs = req.logprobs.value_or(-1);
  job->max_tokens = *max_tokens;
  job->tokenizer = tokenizer_;
  job->metrics = metrics_;
  Reply reply;
  if (auto e = PrepareStructured(body, *job, &reply)) return Error(*e);
  const int prompt_logprobs = req.echo && req.logprobs ? *req.logprobs : -1;
  if (auto e = internal::SubmitAll(*engine_, *job, job->completion_logprobs, prompt_logprobs, metrics_))
    return Error(*e);

  if (req.stream.stream) {
    reply.stream = internal::MakeCompletionStream(job);
    return reply;
  }
  if (!WaitAll(*job, client_alive)) return ClientGoneReply();
  if (const Status* e = FirstEngineError(*job)) return Error(FromEngineError(*e));
  std::vector<CompletionChoice> choices;
  for (ChoiceState& c : job->choices) {
    CompletionChoice choice;
    choice.index = c.index;
    choice.finish_reason = FinishReasonName(c.last.finish_reason);
    choice.stop_reason = internal::StopReason(c.last, tokenizer_);
    choice.text = (req.echo ? job->echo_text[c.prompt_index] : std::string()) + c.text;
    if (req.logprobs) {
      choice.has_logprobs = true;
      int64_t offset = 0;
      if (req.echo) {
        choice.logprobs = internal::CompletionLogprobs(tokenizer_, c.prompt_logprobs, &offset);
        // Entries without logprobs (the engine leaves the first prompt token empty) still name
        // their token.
        const auto& ids = job->prompts[c.prompt_index];
        for (size_t i = 0; i < choice.logprobs.size() && i < ids.size(); ++i) {
          if (choice.logprobs[i].token.empty()) choice.logprobs[i].token = internal::TokenText(tokenizer_, ids[i]);
        }
        offset = static_cast<int64_t>(job->echo_text[c.prompt_index].size());
      }
      std::vector<std::optional<dh::TokenLogprob>> gen(c.logprobs.begin(), c.logprobs.end());
      auto generated = internal::CompletionLogprobs(tokenizer_, gen, &offset);
      choice.logprobs.insert(choice.logprobs.end(), generated.begin(), generated.end());
    }
    choices.push_back(std::move(choice));
  }
  reply.body = SafeDump(CompletionJson(job->meta, choices, internal::TotalUsage(*job)));
  return reply;
}

Reply GenerationService::Tokenize(const Json& body, const ClientAlive&) {
  auto parsed = ParseTokenizeRequest(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return Error(*e);
  TokenizeRequest& req = std::get<TokenizeRequest>(parsed);
  if (req.model) {
    if (auto e = CheckModel(*req.model)) return Error(*e);
  }
  if (!tokenizer_) return Error(BadRequest("prompt", "this model has no tokenizer"));
  std::string text;
  bool add_special = req.add_special_tokens;
  if (req.prompt) {
    text = *req.prompt;
  } else {
    if (!renderer_) return Error(BadRequest("messages", "this model has no chat template"));
    auto rendered = renderer_->Render(req.messages, nullptr, req.add_generation_prompt, nullptr);
    if (!rendered.ok()) return Error(BadRequest("messages", rendered.status().message()));
    text = std::move(rendered).value();
    add_special = false;
  }
  auto ids = tokenizer_->Encode(text, add_special);
  if (!ids.ok()) return Error(BadRequest(req.prompt ? "prompt" : "messages", ids.status().message()));
  Reply reply;
  reply.body = SafeDump({{"count", ids->size()},
                         {"max_model_len", engine_->max_model_len()},
                         {"tokens", *ids},
                         {"token_strs", nullptr}});
  return reply;
}

Reply GenerationService::Detokenize(const Json& body, const ClientAlive&) {
  auto parsed = ParseDetokenizeRequest(body, model_limits());
  if (auto* e = std::get_if<ApiError>(&parsed)) return Error(*e);
  DetokenizeRequest& req = std::get<DetokenizeRequest>(parsed);
  if (req.model) {
    if (auto e = CheckModel(*req.model)) return Error(*e);
  }
  if (!tokenizer_) return Error(BadRequest("tokens", "this model has no tokenizer"));
  auto text = tokenizer_->Decode(req.tokens, /*skip_special_tokens=*/false);
  if (!text.ok()) return Error(BadRequest("tokens", text.status().message()));
  Reply reply;
  reply.body = SafeDump({{"prompt", *text}});
  return reply;
}

namespace {
Json ModelObject(const std::string& name, int64_t created, int max_model_len) {
  return {{"id", name},          {"object", "model"}, {"created", created},
          {"owned_by", "deepharness"}, {"root", name},      {"parent", nullptr},
          {"max_model_len", max_model_len}};
}
}  // namespace

Reply GenerationService::Model(const std::string& id, int64_t created) const {
  for (const std::string& name : config_.served_model_names) {
    if (name != id) continue;
    Reply reply;
    reply.body = SafeDump(ModelObject(name, created, engine_->max_model_len()));
    return reply;
  }
  std::string served;
  for (const std::string& name : config_.served_model_names) served += (served.empty() ? "" : ", ") + name;
  return Error(ModelNotFound(served));
}

Reply GenerationService::Models(int64_t created) const {
  Json data = Json::array();
  for (const std::string& name : config_.served_model_names)
    data.push_back(ModelObject(name, created, engine_->max_model_len()));
  Reply reply;
  reply.body = SafeDump({{"object", "list"}, {"data", std::move(data)}});
  return reply;
}

}  // namespace dh::server
