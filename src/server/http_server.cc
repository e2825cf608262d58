// OpenAIServer: httplib wiring — routes, authentication, Host check, limits, health states,
// metrics and SSE through chunked responses.
#include "server/http_server.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <thread>

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "base/log.h"
#include "server/generation.h"
#include "server/request_body.h"
#include "server/webui.h"
#include "server/http_connection.h"

namespace dh::server {

namespace {

using namespace std::chrono_literals;

bool IsLoopbackHost(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host == "[::1]";
}

// Host header value without the port ("[::1]:8000" -> "[::1]", "localhost:80" -> "localhost").
std::string HostName(const std::string& header) {
  if (!header.empty() && header[0] == '[') {
    size_t close = header.find(']');
    return close == std::string::npos ? header : header.substr(0, close + 1);
  }
  size_t colon = header.find(':');
  return colon == std::string::npos ? header : header.substr(0, colon);
}

// Constant-time comparison (the key length is not secret).
bool SameKey(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  if (error.status == 503) res.set_header("Retry-After", "1");
  res.set_content(ErrorBody(error), "application/json");
}

const std::vector<std::string>& PostRoutes() {
  static const std::vector<std::string> routes = {"/v1/chat/completions", "/v1/completions",
                                                  "/tokenize", "/detokenize"};
  return routes;
}
const std::vector<std::string>& GetRoutes() {
  static const std::vector<std::string> routes = {"/v1/models", "/health", "/health/live",
                                                  "/metrics"};
  return routes;
}

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

bool EqualsIgnoreCase(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

bool ContainsIgnoreCase(const std::vector<std::string>& v, const std::string& s) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& x) { return EqualsIgnoreCase(x, s); });
}

// "Transfer-Encoding: gzip, chunked" -> true.
bool IsChunked(const httplib::Request& req) {
  std::string te = req.get_header_value("Transfer-Encoding");
  for (char& c : te) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return te.find("chunked") != std::string::npos;
}

// Wire bytes a chunked body may take: the body cap plus room for the chunk framing.
size_t ChunkedWireLimit(size_t max_body) { return max_body + max_body / 8 + 4096; }

}  // namespace

// Holds what exists once the model is attached, and the in-flight request count for draining.
class OpenAIServer::Handlers {
 public:
  ServingContext context;
  std::unique_ptr<GenerationService> generation;
  std::atomic<int> in_flight{0};
  std::mutex idle_mu;
  std::condition_variable idle_cv;

  void Enter() { in_flight.fetch_add(1); }
  void Leave() {
    if (in_flight.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(idle_mu);
      idle_cv.notify_all();
    }
  }
};

OpenAIServer::OpenAIServer(ServerOptions options)
    : options_(std::move(options)),
      http_(nullptr),
      handlers_(std::make_unique<Handlers>()) {
  if (options_.served_model_names.empty()) options_.served_model_names.push_back("default");
}

OpenAIServer::~OpenAIServer() { Stop(); }

Status OpenAIServer::Bind() {
  ConnectionLimits limits;
  limits.read_timeout = options_.read_timeout;
  limits.write_timeout = options_.write_timeout;
  limits.keep_alive_timeout = options_.keep_alive_timeout;
  limits.max_connections = std::max(1, options_.max_connections);
  http_ = std::make_unique<ConnectionServer>(limits);
  httplib::Server& http = *http_;
  // --http-threads are kept ready; a connection beyond them gets a thread of its own, so idle
  // keep-alive connections cannot starve new ones (http_connection.h).
  int threads = options_.http_threads;
  if (threads <= 0) threads = 64;
  const int max_threads = limits.max_connections + 64;
  http.new_task_queue = [threads, max_threads] { return new ElasticTaskQueue(threads, max_threads); };
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which let a second server bind the
  // same port and silently take part of the traffic.
  http.set_socket_options([](::socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.set_payload_max_length(options_.max_body_bytes);
  http.set_read_timeout(options_.read_timeout.count(), 0);
  http.set_write_timeout(options_.write_timeout.count(), 0);
  http.set_keep_alive_timeout(options_.keep_alive_timeout.count());
  http.set_tcp_nodelay(true);

  const bool loopback_bind = IsLoopbackHost(options_.host);
  const bool any_host = Contains(options_.allowed_hosts, "*");
  // Runs before routing and before the body is read: CORS, Host check, auth, size check.
  http.set_pre_routing_handler([this, loopback_bind, any_host](const httplib::Request& req,
                                                               httplib::Response& res) {
    if (Connection* conn = CurrentConnection()) conn->MarkHeadersDone();
    const std::string origin = req.get_header_value("Origin");
    const bool cors = !origin.empty() && (Contains(options_.allowed_origins, "*") ||
                                          Contains(options_.allowed_origins, origin));
    if (cors) {
      res.set_header("Access-Control-Allow-Origin",
                     Contains(options_.allowed_origins, "*") ? "*" : origin);
      res.set_header("Vary", "Origin");
    }
    if (!any_host && (loopback_bind || !options_.allowed_hosts.empty())) {
      std::string host = HostName(req.get_header_value("Host"));
      const bool allowed = (loopback_bind && IsLoopbackHost(host)) ||
                           ContainsIgnoreCase(options_.allowed_hosts, host);
      if (!allowed) {
        ApiError e;
        e.status = 403;
        e.type = "permission_error";
        e.message = loopback_bind ? "Host header not allowed for a loopback-bound server "
                                    "(see --allowed-hosts)"
                                  : "Host header not allowed (see --allowed-hosts)";
        e.code = "host_not_allowed";
        SendError(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // CORS preflight: browsers send it without credentials; answered here for every route.
    if (req.method == "OPTIONS") {
      res.status = 204;
      res.set_header("Allow", "GET, POST, OPTIONS");
      if (cors) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers",
                       asked.empty() ? "Authorization, Content-Type" : asked);
        res.set_header("Access-Control-Max-Age", "600");
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool is_public = req.path == "/health" || req.path == "/health/live" ||
                           (options_.webui && IsWebUiPath(req.path));
    if (!options_.api_key.empty() && !is_public) {
      std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      if (auth.compare(0, prefix.size(), prefix) != 0 ||
          !SameKey(auth.substr(prefix.size()), options_.api_key)) {
        SendError(res, Unauthorized());
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (req.has_header("Content-Length")) {
      const std::string value = req.get_header_value("Content-Length");
      char* end = nullptr;
      unsigned long long length = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0') {
        SendError(res, InvalidJson("Invalid Content-Length header"));
        res.set_header("Connection", "close");
        return httplib::Server::HandlerResponse::Handled;
      }
      // Moderately oversized bodies are read and discarded by httplib (413 from the error
      // handler, connection kept); absurd declared sizes are refused before reading any of it.
      if (length / 16 > options_.max_body_bytes) {
        SendError(res, PayloadTooLarge(options_.max_body_bytes));
        res.set_header("Connection", "close");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // httplib does not apply its payload limit to chunked bodies: cap the bytes read instead
    // (the error handler turns the cut into a 413 and the connection is closed).
    if (IsChunked(req)) {
      if (Connection* conn = CurrentConnection()) conn->LimitBody(ChunkedWireLimit(options_.max_body_bytes));
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Errors raised by httplib itself (unknown route, body too large, bad request line) get
  // OpenAI bodies too; a known route with the wrong method is 405.
  const size_t max_body = options_.max_body_bytes;
  const int64_t read_timeout_s = options_.read_timeout.count();
  http.set_error_handler([max_body, read_timeout_s](const httplib::Request& req,
                                                    httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    Connection* conn = CurrentConnection();
    if (conn && conn->header_timed_out()) {
      // httplib's 400 for headers cut short by the header deadline (slow client).
      e = RequestTimeout(read_timeout_s);
      res.set_header("Connection", "close");
    } else if (res.status == 404) {
      const bool known = Contains(PostRoutes(), req.path) || Contains(GetRoutes(), req.path);
      e = known ? MethodNotAllowed() : NotFoundRoute();
    } else if (res.status == 413) {
      e = PayloadTooLarge(max_body);
    } else if (conn && conn->body_too_large()) {
      e = PayloadTooLarge(max_body);
      res.set_header("Connection", "close");
    } else {
      e.status = res.status;
      e.message = "Bad request";
      e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
    }
    SendError(res, e);
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    SendError(res, InternalError("Internal error while processing the request"));
  });

  auto health = [this](const httplib::Request&, httplib::Response& res) {
    switch (state_.load()) {
      case State::kServing: {
        const std::string& check = handlers_->context.self_check_json;
        res.set_content(check.empty() ? std::string("{\"status\":\"ok\"}")
                                      : "{\"status\":\"ok\",\"self_check\":" + check + "}",
                        "application/json");
        return;
      }
      case State::kLoading:
        SendError(res, NotReady());
        return;
      case State::kDraining:
        SendError(res, ShuttingDown());
        return;
    }
  };
  http.Get("/health", health);
  if (options_.webui) RegisterWebUi(http);
  http.Get("/health/live", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"alive\"}", "application/json");
  });

  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    if (state_.load() == State::kLoading || !metrics_) return SendError(res, NotReady());
    const EngineStats stats = handlers_->context.engine->GetStats();
    EngineSnapshot s;
    s.num_requests_running = stats.num_running;
    s.num_requests_waiting = stats.num_waiting;
    s.kv_blocks_total = stats.kv_blocks_total;
    s.kv_blocks_free = stats.kv_blocks_free;
    s.kv_blocks_used = stats.kv_blocks_used;
    s.kv_blocks_cached = stats.kv_blocks_cached;
    s.kv_fragmentation = stats.kv_fragmentation;
    s.kv_block_size = stats.kv_block_size;
    s.kv_capacity_tokens = stats.kv_capacity_tokens;
    s.kv_bytes_per_token = stats.kv_bytes_per_token;
    s.kv_cache_dtype = stats.kv_cache_dtype;
    s.prefix_cache_queries = static_cast<uint64_t>(stats.prefix_cache_queries);
    s.prefix_cache_hits = static_cast<uint64_t>(stats.prefix_cache_hits);
    s.num_preemptions = static_cast<uint64_t>(stats.num_preemptions);
    s.prompt_tokens = static_cast<uint64_t>(stats.prompt_tokens);
    s.generation_tokens = static_cast<uint64_t>(stats.generation_tokens);
    s.num_speculative_tokens = stats.num_speculative_tokens;
    s.spec_num_drafts = static_cast<uint64_t>(stats.spec_num_drafts);
    s.spec_draft_tokens = static_cast<uint64_t>(stats.spec_draft_tokens);
    s.spec_accepted_tokens = static_cast<uint64_t>(stats.spec_accepted_tokens);
    s.spec_accepted_per_pos.assign(stats.spec_accepted_per_pos.begin(),
                                   stats.spec_accepted_per_pos.end());
    s.model_load_seconds = handlers_->context.model_load_seconds;
    s.resident_memory_bytes = ResidentMemoryBytes();
    ParallelSnapshot parallel;
    if (const auto& job = handlers_->context.parallel_job) {
      for (const RankIdentity& r : job->ranks()) parallel.rank_weight_bytes.push_back(r.weight_bytes);
      parallel.rank_resident_bytes = job->rank_memory();
    }
    std::string body =
        metrics_->Render(s, handlers_->context.parallel_job ? &parallel : nullptr);
    if (handlers_->context.extra_metrics) body += handlers_->context.extra_metrics(metrics_->prefix());
    res.set_content(body, "text/plain; version=0.0.4; charset=utf-8");
  });

  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    if (state_.load() == State::kLoading) return SendError(res, NotReady());
    Reply reply = handlers_->generation->Models(handlers_->context.model_created_unix);
    res.set_content(reply.body, "application/json");
  });
  http.Get(R"(/v1/models/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (state_.load() == State::kLoading) return SendError(res, NotReady());
    Reply reply = handlers_->generation->Model(req.matches[1].str(),
                                               handlers_->context.model_created_unix);
    res.status = reply.status;
    res.set_content(reply.body, "application/json");
  });

  using Method = Reply (GenerationService::*)(const Json&, const ClientAlive&);
  auto post = [this](const char* path, Method method) {
    http_->Post(path, [this, method](const httplib::Request& req, httplib::Response& res) {
      switch (state_.load()) {
        case State::kLoading:
          return SendError(res, NotReady());
        case State::kDraining:
          if (metrics_) metrics_->RecordRejected("draining");
          return SendError(res, ShuttingDown());
        case State::kServing:
          break;
      }
      auto body = ParseRequestBody(req.body);
      if (auto* e = std::get_if<ApiError>(&body)) return SendError(res, *e);
      handlers_->Enter();
      // Non-streaming answers poll the connection so a client that hangs up cancels its work.
      Connection* conn = CurrentConnection();
      ClientAlive alive;
      if (conn) alive = [conn] { return !conn->ClientGone(); };
      Reply reply = (handlers_->generation.get()->*method)(std::get<Json>(body), alive);
      if (!reply.warning.empty()) res.set_header("Warning", "299 deepharness \"" + reply.warning + "\"");
      if (!reply.stream) {
        handlers_->Leave();
        res.status = reply.status;
        if (reply.retry_after) res.set_header("Retry-After", "1");
        res.set_content(reply.body, "application/json");
        return;
      }
      // SSE: the provider runs on this connection's thread after the handler returns.
      std::shared_ptr<StreamJob> job(std::move(reply.stream));
      Handlers* handlers = handlers_.get();
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      res.set_chunked_content_provider(
          "text/event-stream",
          [job](size_t, httplib::DataSink& sink) {
            EventSink events;
            events.write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
            events.alive = [&sink] { return sink.is_writable(); };
            job->Run(events);
            sink.done();
            return true;
          },
          [handlers, job](bool) { handlers->Leave(); });
    });
  };
  post("/v1/chat/completions", &GenerationService::ChatCompletions);
  post("/v1/completions", &GenerationService::Completions);
  post("/tokenize", &GenerationService::Tokenize);
  post("/detokenize", &GenerationService::Detokenize);

  if (options_.port == 0) {
    port_ = http.bind_to_any_port(options_.host);
    if (port_ <= 0) return IoError("cannot listen on {} (no free port)", options_.host);
    RaiseListenBacklog(port_);
    return Status::Ok();
  }
  errno = 0;
  if (!http.bind_to_port(options_.host, options_.port)) {
    if (errno == EADDRINUSE) {
      return IoError("--port {}: cannot listen on {}:{}: the address is already in use (is "
                     "another server running there?)", options_.port, options_.host, options_.port);
    }
    return IoError("--host/--port: cannot listen on {}:{}: {}", options_.host, options_.port,
                   errno != 0 ? std::strerror(errno) : "address not available");
  }
  port_ = options_.port;
  RaiseListenBacklog(port_);
  return Status::Ok();
}

// Debian's cpp-httplib 0.11 is a compiled library that listens with a backlog of 5: a burst of
// clients overflows the accept queue and sees resets instead of 200/503. Linux lets listen()
// raise the backlog of a socket that is already listening, so find ours and do that.
void OpenAIServer::RaiseListenBacklog(int port) {
  for (int fd = 0; fd < 4096; ++fd) {
    int accepting = 0;
    socklen_t len = sizeof(accepting);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting) continue;
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0) continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (bound == port && ::listen(fd, SOMAXCONN) != 0) {
      DH_LOG(Warning, "could not raise the listen backlog of port {}", port);
    }
  }
}

void OpenAIServer::Run() {
  if (http_) http_->listen_after_bind();
}

void OpenAIServer::Attach(ServingContext context) {
  handlers_->context = context;
  GenerationConfig config;
  config.served_model_names = options_.served_model_names;
  config.limits = options_.limits;
  config.reasoning = options_.reasoning_parser == "deepseek_r1";
  config.tool_call_parser = options_.tool_call_parser;
  metrics_ = std::make_unique<ServerMetrics>(options_.metrics_prefix,
                                             options_.served_model_names.front(),
                                             context.engine->max_model_len());
  handlers_->generation = std::make_unique<GenerationService>(
      context.engine, context.tokenizer, context.chat_renderer, config, metrics_.get());
  if (context.parallel_job) {
    context.parallel_job->SetStepObserver([metrics = metrics_.get()](const StepComm& step) {
      metrics->RecordStepCollectives(step.seconds, step.bytes, step.calls);
    });
  }
  state_.store(State::kServing);
}

void OpenAIServer::BeginDrain() { state_.store(State::kDraining); }

bool OpenAIServer::WaitIdle(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  {
    std::unique_lock<std::mutex> lock(handlers_->idle_mu);
    if (!handlers_->idle_cv.wait_until(lock, deadline,
                                       [this] { return handlers_->in_flight.load() == 0; })) {
      return false;
    }
  }
  // The handlers are done, but httplib writes a response after its handler returns: a process
  // that exits now (a failed tensor-parallel rank) would cut the last answers off.
  while (http_ && http_->busy_requests() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void OpenAIServer::Stop() {
  // Once only: a second call (the destructor's) used to spin in the wait below for 1000 sleeps
  // of 1 ms, several seconds on a loaded machine, delaying the process exit after SIGTERM.
  if (!http_ || stopped_.exchange(true)) return;
  // Run() may not have entered its accept loop yet (a start-up failure right after Bind):
  // stop() before that would be lost and Run() would never return.
  for (int i = 0; i < 1000 && !http_->is_running() && port_ > 0; ++i)
    std::this_thread::sleep_for(1ms);
  http_->StopConnections();  // idle keep-alive connections end now, not at their timeout
  http_->stop();
}

}  // namespace dh::server
