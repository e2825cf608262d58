// GenerationService: the chat/completions handlers between validated requests and the engine.
// It renders and tokenizes prompts, checks the context, submits one engine request per
// (prompt, choice), and turns engine outputs into OpenAI bodies or SSE streams. It knows nothing
// of HTTP: streams write through an EventSink, so tests can drive it without sockets.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/structured_output.h"
#include "server/tool_calls.h"

namespace dh::server {

// Where a stream writes: `write` returns false when the client is gone; `alive` polls the
// connection between events (so a silent disconnect is noticed while waiting for tokens).
struct EventSink {
  std::function<bool(const std::string&)> write;
  std::function<bool()> alive;
};

namespace internal {
struct Job;
}  // namespace internal

class StreamJob {
 public:
  virtual ~StreamJob() = default;
  // Writes every event through `sink`, ending with `data: [DONE]`; on a disconnect cancels the
  // engine requests and returns early.
  virtual void Run(EventSink& sink) = 0;
};

using ClientAlive = std::function<bool()>;

struct Reply {
  int status = 200;
  std::string body;                   // JSON (when stream is null)
  std::unique_ptr<StreamJob> stream;  // SSE (status 200)
  bool retry_after = false;           // add Retry-After (503 overload/draining)
  std::string warning;                // a Warning header (e.g. schema keywords not enforced)
};

struct GenerationConfig {
  std::vector<std::string> served_model_names;
  RequestLimits limits;
  bool reasoning = false;  // split <think> output into reasoning_content
  std::string tool_call_parser = "auto";  // see tool_calls.h; auto: from the vocabulary
};

class GenerationService {
 public:
  GenerationService(Engine* engine, const Tokenizer* tokenizer,
                    const ChatPromptRenderer* renderer, GenerationConfig config,
                    ServerMetrics* metrics);

  // `client_alive` (optional) is polled while a non-streaming answer is generated; when it
  // returns false the request is cancelled and its sequences freed.
  Reply ChatCompletions(const Json& body, const ClientAlive& client_alive = {});
  Reply Completions(const Json& body, const ClientAlive& client_alive = {});
  Reply Tokenize(const Json& body, const ClientAlive& client_alive = {});
  Reply Detokenize(const Json& body, const ClientAlive& client_alive = {});
  Reply Models(int64_t created) const;
  // GET /v1/models/{id}: one model object, or 404 model_not_found.
  Reply Model(const std::string& id, int64_t created) const;

  ModelLimits model_limits() const;

 private:
  // Empty `model` becomes the first served name; an unknown one is 404 model_not_found.
  std::optional<ApiError> CheckModel(std::string& model) const;
  Reply ClientGoneReply() const;
  // Structured-output fields -> job.grammar (and reply->warning under strict: false).
  std::optional<ApiError> PrepareStructured(const Json& body, internal::Job& job, Reply* reply);
  Reply Error(const ApiError& error) const;

  Engine* engine_;
  const Tokenizer* tokenizer_;
  const ChatPromptRenderer* renderer_;
  GenerationConfig config_;
  ServerMetrics* metrics_;
  std::optional<int32_t> think_end_id_;
  std::unique_ptr<StructuredOutput> structured_;
  ToolParser tool_parser_ = ToolParser::kNone;
};

// A fresh response id with the given prefix ("chatcmpl-", "cmpl-").
std::string NewResponseId(const char* prefix);

}  // namespace dh::server
