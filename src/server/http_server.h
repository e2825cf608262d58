// OpenAIServer: the HTTP front of `deepharness serve` (cpp-httplib; see docs/server.md for the
// choice). Routes: POST /v1/chat/completions, /v1/completions, /tokenize, /detokenize; GET
// /v1/models, /v1/models/{id}, /health, /metrics; OPTIONS (CORS preflight) on every route. The server starts listening before the model is loaded
// (/health answers 503 "loading"), serves once Attach() hands it an engine, and on BeginDrain()
// refuses new work with 503 while in-flight requests finish.
//
// Security defaults (reliability.md): every route but /health needs the API key when one is
// set; on a loopback bind only loopback Host headers (and --allowed-hosts) are accepted (DNS
// rebinding); CORS only for --allowed-origins; bodies (chunked ones too) are size- and
// depth-limited; error messages never echo request content. Connections: http_connection.h.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "model/step_broadcast.h"
#include "server/chat_prompt.h"
#include "server/metrics.h"
#include "server/openai_request.h"

namespace dh::server {

class ConnectionServer;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see OpenAIServer::port())
  std::string api_key;  // empty: no authentication
  std::vector<std::string> served_model_names;  // the first one is reported in responses
  std::string metrics_prefix = "deepharness:";
  size_t max_body_bytes = 8u << 20;
  int http_threads = 0;  // 0: derived from the engine's max_num_seqs and queue size
  RequestLimits limits;
  std::string reasoning_parser;  // "" (none) or "deepseek_r1"
  std::string tool_call_parser = "auto";  // auto | deepseek_v3 | hermes | llama3_json | none
  std::chrono::seconds read_timeout{30};
  std::chrono::seconds write_timeout{60};
  std::chrono::seconds keep_alive_timeout{30};
  bool webui = true;  // GET / (chat), /dashboard, /webui/* (server/webui.h)
  // Open connections beyond this get 503 and are closed (each open connection holds a thread).
  int max_connections = 4096;
  // Browser origins allowed by CORS ("*": any); empty: no CORS headers, preflights get none.
  std::vector<std::string> allowed_origins;
  // Host header names accepted besides the loopback names of a loopback bind ("*": any).
  // Non-empty also restricts a non-loopback bind to these names.
  std::vector<std::string> allowed_hosts;
};

// What the server needs once the model is loaded. Pointers must outlive the server.
struct ServingContext {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatPromptRenderer* chat_renderer = nullptr;
  double model_load_seconds = 0;
  int64_t model_created_unix = 0;
  // The start-up self-check's result as a JSON object, shown by /health (empty: not run).
  std::string self_check_json;
  // Appended to /metrics when set (serve --op-metrics: op times, routed tokens per expert);
  // called on HTTP threads with the metric name prefix.
  std::function<std::string(const std::string& prefix)> extra_metrics;
  // Tensor parallelism (serve --tp-size N): rank 0's view of the job, for /metrics. Null: none.
  std::shared_ptr<ParallelJob> parallel_job;
};

class OpenAIServer {
 public:
  explicit OpenAIServer(ServerOptions options);
  ~OpenAIServer();
  OpenAIServer(const OpenAIServer&) = delete;
  OpenAIServer& operator=(const OpenAIServer&) = delete;

  // Binds host:port (port 0 picks a free one). Error names the address.
  Status Bind();
  int port() const { return port_; }
  // Serves until Stop(); call on its own thread after Bind().
  void Run();
  // "" or "deepseek_r1"; takes effect at Attach (the choice may depend on the chat template).
  void SetReasoningParser(std::string name) { options_.reasoning_parser = std::move(name); }
  // Switches from loading to serving.
  void Attach(ServingContext context);
  // Refuses new requests (503 server_shutting_down, /health 503) from now on.
  void BeginDrain();
  // Waits until no generation request is being answered, up to `timeout`.
  bool WaitIdle(std::chrono::milliseconds timeout);
  // Stops listening and closes connections.
  void Stop();

  enum class State { kLoading, kServing, kDraining };
  State state() const { return state_.load(); }
  ServerMetrics& metrics() { return *metrics_; }

 private:
  static void RaiseListenBacklog(int port);

  class Handlers;
  ServerOptions options_;
  std::unique_ptr<ConnectionServer> http_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<Handlers> handlers_;
  std::atomic<State> state_{State::kLoading};
  int port_ = 0;
  std::atomic<bool> stopped_{false};  // Stop() ran (the destructor's call is then a no-op)
};

}  // namespace dh::server
