// `deepharness serve`: the OpenAI-compatible server. Listens first (so /health answers 503 while
// the model loads), loads model + tokenizer + chat template, starts the engine, serves. SIGTERM
// or SIGINT: stop accepting, drain in-flight requests for up to --shutdown-timeout seconds, exit
// 0; a second signal aborts what is left at once.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/command.h"
#include "apps/default_model.h"
#include "apps/memory_plan.h"
#include "apps/model_options.h"
#include "apps/self_check.h"
#include "apps/serve_parallel.h"
#include "backend/registry.h"
#include "base/log.h"
#include "base/memory_info.h"
#include "engine/engine.h"
#include "model/step_broadcast.h"
#include "server/http_server.h"
#include "server/tool_calls.h"
#include "server/template_renderer.h"
#include "tokenizer/tokenizer.h"

namespace dh::app {
namespace {

struct ServeArgs {
  ModelOptions model;
  int max_seq_len = 0;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::vector<std::string> served_model_names;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  std::string kv_cache_memory;
  int num_kv_blocks = 0;
  int max_queued = 1024;
  std::string chat_template;
  std::string metrics_prefix = "deepharness:";
  std::string reasoning_parser = "auto";
  std::string tool_call_parser = "auto";
  double shutdown_timeout = 30;
  int http_threads = 0;
  size_t max_body_bytes = 8u << 20;
  bool no_prefix_caching = false;
  bool no_webui = false;
  std::vector<std::string> allowed_origins;
  std::vector<std::string> allowed_hosts;
  int max_connections = 4096;
  int read_timeout = 30;        // --read-timeout: seconds for the header block, and per body read
  int write_timeout = 60;       // --write-timeout: seconds one write may take (unread streams)
  int keep_alive_timeout = 30;  // --keep-alive-timeout: idle seconds between requests
  uint64_t kv_cache_bytes = 0;  // parsed --kv-cache-memory
  bool no_memory_check = false;
  int rank_timeout = 30;  // --rank-timeout: seconds a tensor-parallel step may take
  std::string self_check = "auto";  // --self-check (apps/self_check.h)
  bool no_self_check = false;
  bool op_metrics = false;
  SelfCheckMode self_check_mode = SelfCheckMode::kAuto;
};

// "8GiB", "512MiB", "1.5G", "1000000" -> bytes, checked against the memory this process may
// still use (MemAvailable and the cgroup limit) before anything is allocated.
Result<uint64_t> ParseKvCacheMemory(const std::string& text) {
  const std::optional<uint64_t> bytes = ParseByteSizeText(text);
  if (!bytes)
    return InvalidArgument("--kv-cache-memory: '{}': expected a positive size (e.g. 2GiB, 512MiB)",
                           text);
  const MemoryInfo mem = ReadMemoryInfo();
  if (mem.available > 0 && *bytes > mem.available) {
    return InvalidArgument("--kv-cache-memory {}: {} requested but only {} is available ({}); "
                           "the weights need room too: try --kv-cache-memory {}MiB",
                           text, FormatBytes(*bytes), FormatBytes(mem.available), mem.source,
                           mem.available / 2 >> 20);
  }
  return *bytes;
}

Status ValidateArgs(ServeArgs& a) {
  if (a.model.tp_size < 1) return InvalidArgument("--tp-size: expected >= 1, got {}", a.model.tp_size);
  if (a.rank_timeout < 1) return InvalidArgument("--rank-timeout: expected >= 1 second, got {}", a.rank_timeout);
  if (a.port < 0 || a.port > 65535) return InvalidArgument("--port: expected 0-65535, got {}", a.port);
  if (a.max_num_seqs < 1) return InvalidArgument("--max-num-seqs: expected >= 1, got {}", a.max_num_seqs);
  if (a.max_num_batched_tokens < 1)
    return InvalidArgument("--max-num-batched-tokens: expected >= 1, got {}", a.max_num_batched_tokens);
  if (a.max_seq_len < 0) return InvalidArgument("--max-seq-len: expected >= 0, got {}", a.max_seq_len);
  if (a.max_queued < 1) return InvalidArgument("--max-num-queued-reqs: expected >= 1, got {}", a.max_queued);
  if (a.max_connections < 1)
    return InvalidArgument("--max-connections: expected >= 1, got {}", a.max_connections);
  for (const auto& [flag, value] : {std::pair<const char*, int>{"--read-timeout", a.read_timeout},
                                     {"--write-timeout", a.write_timeout},
                                     {"--keep-alive-timeout", a.keep_alive_timeout}}) {
    if (value < 1 || value > 86400)
      return InvalidArgument("{}: expected 1-86400 seconds, got {}", flag, value);
  }
  if (!a.kv_cache_memory.empty()) {
    auto bytes = ParseKvCacheMemory(a.kv_cache_memory);
    if (!bytes.ok()) return bytes.status();
    a.kv_cache_bytes = *bytes;
  }
  {
    auto mode = ParseSelfCheckMode(a.self_check);
    if (!mode.ok()) return mode.status();
    a.self_check_mode = a.no_self_check ? SelfCheckMode::kOff : *mode;
  }
  if (!(a.shutdown_timeout >= 0)) return InvalidArgument("--shutdown-timeout: expected >= 0 seconds");
  if (a.metrics_prefix.empty() || a.metrics_prefix.back() != ':')
    return InvalidArgument("--metrics-prefix: expected a name ending in ':' (e.g. vllm:), got '{}'",
                           a.metrics_prefix);
  for (char c : a.metrics_prefix) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':'))
      return InvalidArgument("--metrics-prefix: only letters, digits, '_' and ':' are allowed");
  }
  if (a.reasoning_parser != "auto" && a.reasoning_parser != "none" &&
      a.reasoning_parser != "deepseek_r1") {
    return InvalidArgument("--reasoning-parser: expected auto, none or deepseek_r1, got '{}'",
                           a.reasoning_parser);
  }
  {
    bool is_auto = false;
    server::ToolParser parser;
    if (!server::ParseToolParserName(a.tool_call_parser, &is_auto, &parser))
      return InvalidArgument("--tool-call-parser: expected auto, deepseek_v3, hermes, llama3_json or "
                             "none, got '{}'", a.tool_call_parser);
  }
  const auto devices = RegisteredBackends();
  if (std::find(devices.begin(), devices.end(), a.model.device) == devices.end()) {
    auto backend = CreateBackend(a.model.device, BackendOptions{});
    if (!backend.ok()) return backend.status();
  }
  if (a.api_key.empty()) {
    if (const char* env = std::getenv("DEEPHARNESS_API_KEY")) a.api_key = env;
  }
  if (a.model.model_path.empty()) {
    a.model.model_path = DefaultModelPath();
    if (a.model.model_path.empty()) {
      return NotFound("no --model-path given and the embedded model was not found (looked in {})",
                      DefaultModelCandidates());
    }
  }
  if (a.served_model_names.empty()) {
    std::string name = std::filesystem::path(a.model.model_path).lexically_normal().filename();
    if (name.empty()) name = std::filesystem::path(a.model.model_path).parent_path().filename();
    a.served_model_names.push_back(name.empty() ? "default" : name);
  }
  return Status::Ok();
}

// Signals are handled by one thread with sigwait (no async-signal-safety concerns).
class SignalWaiter {
 public:
  SignalWaiter() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // inherited by every thread started later
    signal(SIGPIPE, SIG_IGN);
  }
  // Blocks until the next SIGTERM/SIGINT; says which and the pid that sent it (0: unknown).
  siginfo_t Wait() {
    siginfo_t info{};
    while (sigwaitinfo(&set_, &info) < 0) {
    }
    return info;
  }

 private:
  sigset_t set_;
};

// What the signal thread shares with RunServe. The thread is detached and can still be inside
// notify_all (or wait for a later signal) when RunServe returns, so it holds its own reference.
struct ServeSignals {
  SignalWaiter waiter;
  std::atomic<bool> loaded{false};  // false again once serving has stopped
  std::atomic<int> count{0};
  std::mutex mu;
  std::condition_variable cv;
  bool rank_failed = false;  // guarded by mu
};

int RunServe(ServeArgs& a) {
  // Blocks SIGTERM/SIGINT first; the follower ranks never wait: they stop when rank 0 stops.
  auto sig = std::make_shared<ServeSignals>();
  if (Status st = ValidateArgs(a); !st.ok()) return ReportError(st);
  std::vector<RankIdentity> rank_ids;
  std::shared_ptr<comm::Communicator> rank_comm;
  if (a.model.tp_size > 1) {
    // Tensor parallelism: start the ranks (serve_parallel.cc); ranks other than 0 follow.
    auto role = StartServeRanks(a.model, &rank_ids, &rank_comm);
    if (!role.ok()) return ReportError(role.status());
    if (*role != ServeRole::kLeader) {
      return *role == ServeRole::kFollower ? FollowLeader(a.model, a.self_check_mode) : kExitOk;
    }
  }
  if (!a.no_memory_check) {
    // Refuse what cannot fit before binding or loading anything (apps/memory_plan.h).
    PlanInputs in;
    in.model = a.model;
    in.max_seq_len = a.max_seq_len;
    in.max_num_seqs = a.max_num_seqs;
    in.max_num_batched_tokens = a.max_num_batched_tokens;
    in.kv_cache_memory = a.kv_cache_bytes;
    in.num_kv_blocks = a.num_kv_blocks;
    auto plan = PlanMemory(in);
    if (!plan.ok()) return ReportError(plan.status());
    if (Status st = CheckPlanFits(in, *plan); !st.ok()) return ReportError(st);
  }

  server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.served_model_names = a.served_model_names;
  so.metrics_prefix = a.metrics_prefix;
  so.max_body_bytes = a.max_body_bytes;
  so.webui = !a.no_webui;
  so.tool_call_parser = a.tool_call_parser;
  so.allowed_origins = a.allowed_origins;
  so.allowed_hosts = a.allowed_hosts;
  so.max_connections = a.max_connections;
  so.read_timeout = std::chrono::seconds(a.read_timeout);
  so.write_timeout = std::chrono::seconds(a.write_timeout);
  so.keep_alive_timeout = std::chrono::seconds(a.keep_alive_timeout);
  so.http_threads = a.http_threads > 0 ? a.http_threads : std::max(64, 2 * a.max_num_seqs + 16);
  server::OpenAIServer http(so);
  if (Status st = http.Bind(); !st.ok()) return ReportError(st);  // exit 2: e.g. port in use
  std::thread http_thread([&http] { http.Run(); });
  auto fail = [&](const Status& st) {
    http.Stop();
    http_thread.join();
    return ReportError(st);
  };
  std::fprintf(stderr, "deepharness serve: listening on http://%s:%d (loading %s)\n",
               a.host.c_str(), http.port(), a.model.model_path.c_str());

  // A signal while loading ends the process at once.
  // Tensor parallelism: a rank that died or hangs fails the job (model/step_broadcast.h); the
  // main thread then answers what is in flight with 503 and ends the process with status 1.
  auto parallel_job = std::make_shared<ParallelJob>([sig](const Status&) {
    {
      std::lock_guard<std::mutex> lock(sig->mu);
      sig->rank_failed = true;
    }
    sig->cv.notify_all();
  });
  const bool parallel = a.model.tp_size > 1;
  parallel_job->SetRanks(rank_ids);
  std::thread signal_thread([sig, parallel, parallel_job] {
    while (true) {
      const siginfo_t info = sig->waiter.Wait();
      if (parallel && info.si_signo == SIGTERM && info.si_pid != 0 && info.si_pid == ::getppid()) {
        // mpirun (or its daemon) ends the job because a rank failed: fail fast, before the
        // SIGKILL that follows. A dead rank on this host is named; otherwise it is on another
        // host, or an operator stopped mpirun itself (which ends the job the same way).
        const char* why = parallel_job->LocalRankExited()
                              ? "a rank failed"
                              : "a rank failed, or mpirun itself was told to stop";
        if (!sig->loaded.load()) {
          std::fprintf(stderr, "error: mpirun is ending the job during start-up: %s (%s)\n", why,
                       parallel_job->DescribeRanks().c_str());
          std::fflush(stderr);
          std::_Exit(1);
        }
        parallel_job->Fail(Status(StatusCode::kCancelled,
                                  fmt::format("mpirun is ending the job: {} ({})", why,
                                              parallel_job->DescribeRanks())));
        continue;
      }
      if (!sig->loaded.load()) {
        ReportLeaderExit(kExitOk);
        std::_Exit(0);
      }
      {
        std::lock_guard<std::mutex> lock(sig->mu);
        sig->count.fetch_add(1);
      }
      sig->cv.notify_all();
      if (sig->count.load() >= 2) return;
    }
  });
  signal_thread.detach();

  CheckingBackend* checker = nullptr;
  BackendWrapper wrap;
  if (a.self_check_mode != SelfCheckMode::kOff) {
    wrap = [&checker](std::unique_ptr<Backend> inner) -> std::unique_ptr<Backend> {
      auto c = std::make_unique<CheckingBackend>(std::move(inner));
      checker = c.get();
      return c;
    };
  }
  if (a.op_metrics) a.model.observe.profile = true;  // a TracingBackend keeps op totals
  // Tensor parallelism: until the step leader takes over, a rank that exits or hangs ends the
  // job from here (serve_parallel.h); the communicator is the one LoadFromOptions joins.
  std::optional<StartupWatch> watch;
  if (rank_comm) watch.emplace(parallel_job, *rank_comm, std::chrono::seconds(a.rank_timeout));
  auto model = LoadFromOptions(a.model, wrap);
  if (!model.ok()) return fail(model.status());
  if (model->parallel.comm) {
    watch->SetPhase("waiting for every rank to load");
    if (Status st = model->parallel.comm->Barrier(); !st.ok()) return fail(st);
    watch->SetPhase("the self-check");
    watch->Bound();
  }
  std::string self_check_json;
  if (checker) {
    // Before any request: a few tokens through the chosen and the reference backend; with
    // --tp-size every rank checks its own slice at the same time (apps/self_check.h).
    std::vector<SelfCheckReport> ranks;
    const uint64_t weight_bytes = model->model->info().weight_bytes;
    const SelfCheckReport r =
        model->parallel.comm
            ? RunSelfCheckOnRanks(*model->model, *checker, a.self_check_mode, weight_bytes,
                                  *model->parallel.comm, &ranks)
            : RunSelfCheck(*model->model, *checker, a.self_check_mode, weight_bytes);
    if (r.out_of_step) {
      // This rank left the check's collective sequence: the others wait in a collective.
      std::fprintf(stderr, "error: %s\n", r.message.c_str());
      std::fflush(stderr);
      std::_Exit(kExitFailure);
    }
    if (r.state == "failed") {
      return fail(Unsupported("{}; the {} backend computes wrong results on this machine: serve "
                              "with --device reference, or --no-self-check to start anyway",
                              r.message, checker->inner().name()));
    }
    checker->ReleaseHeldRows();  // the reference has read the stored layout for the last time
    nlohmann::json j = {{"state", r.state}};
    const std::string on_ranks =
        ranks.size() > 1 ? fmt::format(" on each of {} ranks", ranks.size()) : "";
    if (r.state == "passed") {
      j["scope"] = r.scope;
      j["ops_checked"] = r.ops_checked;
      j["steps"] = r.steps;
      j["seconds"] = std::round(r.seconds * 1000) / 1000;
      if (ranks.size() > 1) {
        nlohmann::json per_rank = nlohmann::json::array();
        for (size_t i = 0; i < ranks.size(); ++i) {
          per_rank.push_back({{"rank", i},
                              {"scope", ranks[i].scope},
                              {"ops_checked", ranks[i].ops_checked},
                              {"seconds", std::round(ranks[i].seconds * 1000) / 1000}});
        }
        j["ranks"] = per_rank;
      }
      std::fprintf(stderr, "deepharness serve: self-check passed (%s%s, %lld ops over %d steps "
                   "agree with the reference backend, %.2f s)\n", r.scope.c_str(),
                   on_ranks.c_str(), static_cast<long long>(r.ops_checked), r.steps, r.seconds);
    } else {
      j["reason"] = r.message;
      std::fprintf(stderr, "deepharness serve: self-check skipped (%s)\n", r.message.c_str());
    }
    self_check_json = j.dump();
  }
  if (model->parallel.comm) {
    // Rank 0 leads: each engine step goes to the follower ranks first; whatever ends this
    // function (an error below, or the drain) destroys the model, which stops them.
    watch->SetPhase("starting the step leader");
    model->model = MakeStepLeader(std::move(model->model), *model->parallel.comm,
                                  std::chrono::seconds(a.rank_timeout), parallel_job);
    watch.reset();  // the step leader's deadlines apply from here
  }
  auto tokenizer = Tokenizer::Load(a.model.model_path);
  if (!tokenizer.ok()) return fail(tokenizer.status().WithContext(a.model.model_path));
  auto renderer = server::LoadChatRenderer(a.model.model_path, a.chat_template);
  if (!renderer.ok()) return fail(renderer.status());
  std::string reasoning = a.reasoning_parser;
  if (reasoning == "auto") reasoning = (*renderer)->OpensThinkBlock() ? "deepseek_r1" : "none";
  if (reasoning == "deepseek_r1" && !(*tokenizer)->TokenToId("</think>")) {
    DH_LOG(Warning, "--reasoning-parser deepseek_r1: '</think>' is not a single token in this "
                    "vocabulary; splitting on the text instead");
  }

  EngineOptions eo;
  eo.max_num_seqs = a.max_num_seqs;
  eo.max_num_batched_tokens = a.max_num_batched_tokens;
  eo.max_model_len = a.max_seq_len;
  eo.max_queue_size = a.max_queued;
  eo.num_kv_blocks = a.num_kv_blocks;
  eo.enable_prefix_caching = !a.no_prefix_caching;
  eo.kv_cache_memory = a.kv_cache_bytes;
  eo.num_speculative_tokens = SpeculativeTokens(a.model);
  const int64_t num_layers = model->model->config().num_hidden_layers;
  const int64_t num_experts = model->model->config().n_routed_experts;
  Engine engine(eo, std::move(model->model), *model->backend, tokenizer->get());
  if (Status st = engine.Start(); !st.ok()) return fail(st);

  // The reasoning parser is decided only now; the server reads it at Attach.
  server::ServingContext ctx;
  ctx.engine = &engine;
  ctx.tokenizer = tokenizer->get();
  ctx.chat_renderer = renderer->get();
  ctx.model_load_seconds = model->load_seconds;
  ctx.model_created_unix = std::time(nullptr);
  ctx.self_check_json = self_check_json;
  if (a.op_metrics) {
    // From here on: the self-check's ops and tokens are not counted.
    Observability* obs = model->observability.get();
    if (Status st = obs->EnableOpMetrics(num_layers, num_experts); !st.ok()) {
      return fail(st);
    }
    ctx.extra_metrics = [obs](const std::string& prefix) { return obs->OpMetricsText(prefix); };
  }
  if (model->parallel.comm) ctx.parallel_job = parallel_job;
  http.SetReasoningParser(reasoning == "deepseek_r1" ? "deepseek_r1" : "");
  http.Attach(ctx);
  sig->loaded.store(true);
  std::fprintf(stderr,
               "deepharness serve: ready on http://%s:%d (model %s, max_model_len %d, "
               "reasoning parser %s)\n",
               a.host.c_str(), http.port(), a.served_model_names.front().c_str(),
               engine.max_model_len(), reasoning.c_str());

  {
    std::unique_lock<std::mutex> lock(sig->mu);
    sig->cv.wait(lock, [&] { return sig->count.load() >= 1 || sig->rank_failed; });
  }
  if (auto failure = parallel_job->failure()) {
    // The requests in flight and those queued fail at their next step (the leader's Forward
    // returns the failure at once) and are answered 503; then the process ends: MPI cannot be
    // finalized with a rank gone.
    std::fprintf(stderr, "error: %s\n", failure->message().c_str());
    http.BeginDrain();
    engine.Drain(std::chrono::seconds(3));
    http.WaitIdle(std::chrono::seconds(3));
    std::fprintf(stderr, "deepharness serve: stopped after a tensor-parallel rank failed\n");
    std::fflush(stderr);
    std::_Exit(kExitFailure);
  }
  std::fprintf(stderr, "deepharness serve: draining (up to %.0f s)\n", a.shutdown_timeout);
  http.BeginDrain();
  // A second signal while draining cuts the drain short.
  std::thread stopper([&] {
    std::unique_lock<std::mutex> lock(sig->mu);
    sig->cv.wait(lock, [&] { return sig->count.load() >= 2 || !sig->loaded.load(); });
    if (sig->count.load() >= 2) engine.Stop();
  });
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(a.shutdown_timeout * 1000));
  engine.Drain(timeout);
  engine.Stop();  // aborts what is left; streams then write their last events
  http.WaitIdle(std::chrono::seconds(5));
  http.Stop();
  http_thread.join();
  {
    std::lock_guard<std::mutex> lock(sig->mu);
    sig->loaded.store(false);
  }
  sig->cv.notify_all();
  stopper.join();
  std::fprintf(stderr, "deepharness serve: stopped\n");
  return kExitOk;
}

std::function<int()> SetupServe(CLI::App* sub) {
  auto a = std::make_shared<ServeArgs>();
  AddModelOptions(sub, &a->model, /*require_model=*/false);
  AddObservabilityOptions(sub, &a->model.observe, kTraceFlags | kPluginFlags);
  AddKvCacheOptions(sub, &a->model);
  AddSpeculativeOptions(sub, &a->model);
  sub->footer("Without --model-path the embedded model (models/" + std::string(kDefaultModelName) +
              " next to the binary) is served.");
  sub->add_option("--max-seq-len,--max-model-len", a->max_seq_len,
                  "Longest sequence, prompt + output (default: the model's "
                  "max_position_embeddings, capped by the KV pool)");
  sub->add_option("--rank-timeout", a->rank_timeout,
                  "With --tp-size: seconds one engine step (or, during the start-up "
                  "self-check, one collective) may take before rank 0 decides a rank died or "
                  "hangs and exits with status 1 (default 30)");
  sub->add_option("--host", a->host, "Address to listen on (default 127.0.0.1)");
  sub->add_option("--port", a->port, "Port to listen on (default 8000; 0 picks a free one)");
  sub->add_option("--api-key", a->api_key,
                  "Require 'Authorization: Bearer KEY' on every route but /health (default: env "
                  "DEEPHARNESS_API_KEY; none when unset)");
  sub->add_option("--served-model-name", a->served_model_names,
                  "Model name(s) clients send in 'model' (default: the model directory's name)");
  sub->add_option("--max-num-seqs", a->max_num_seqs, "Sequences batched per step (default 64)");
  sub->add_option("--max-num-batched-tokens", a->max_num_batched_tokens,
                  "Token budget per engine step, decodes + prefill chunks (default 2048)");
  sub->add_option("--kv-cache-memory", a->kv_cache_memory,
                  "KV-cache pool size, e.g. 2GiB or 512MiB (default: half of the free memory)");
  sub->add_option("--num-kv-blocks", a->num_kv_blocks,
                  "KV-cache pool size in 16-token blocks (overrides --kv-cache-memory; for tests)");
  sub->add_option("--max-num-queued-reqs", a->max_queued,
                  "Waiting requests beyond which new ones get 503 + Retry-After (default 1024)");
  sub->add_option("--chat-template", a->chat_template,
                  "Jinja chat template: a file, or the template text (default: "
                  "tokenizer_config.json's)");
  sub->add_option("--metrics-prefix", a->metrics_prefix,
                  "Prefix of the /metrics names (default deepharness:; vllm: for vLLM dashboards)");
  sub->add_option("--reasoning-parser", a->reasoning_parser,
                  "Split <think> output into reasoning_content: auto (default: on when the chat "
                  "template opens a <think> block), deepseek_r1, none");
  sub->add_option("--tool-call-parser", a->tool_call_parser,
                  "Parse tool calls out of the model's output: auto (default: the syntax the "
                  "chat template writes, else the vocabulary's call markers), deepseek_v3, "
                  "hermes, llama3_json, none");
  sub->add_option("--shutdown-timeout", a->shutdown_timeout,
                  "Seconds to let in-flight requests finish after SIGTERM (default 30; 0 aborts "
                  "them at once)");
  sub->add_option("--http-threads", a->http_threads,
                  "HTTP worker threads kept ready (default: max(64, 2 * max-num-seqs + 16)); "
                  "connections beyond them get a thread each, up to --max-connections");
  sub->add_option("--max-body-bytes", a->max_body_bytes,
                  "Largest request body; larger ones get 413 (default 8 MiB)");
  sub->add_flag("--no-enable-prefix-caching", a->no_prefix_caching,
                "Turn off prefix caching (on by default)");
  sub->add_flag("--no-webui", a->no_webui,
                "Do not serve the web UI (chat page at /, dashboard at /dashboard)");
  sub->add_option("--allowed-origins", a->allowed_origins,
                  "Browser origins allowed by CORS, e.g. http://localhost:3000, or * (default: "
                  "none, no CORS headers)");
  sub->add_option("--allowed-hosts", a->allowed_hosts,
                  "Host header names accepted besides localhost/127.0.0.1/[::1] on a loopback "
                  "bind (behind a proxy), or * for any (default: none)");
  sub->add_flag("--no-memory-check", a->no_memory_check,
                "Start even when the memory plan (`info --plan`) says the model does not fit");
  sub->add_option("--self-check", a->self_check,
                  "Before serving, run a few tokens with every op compared against the reference "
                  "backend; refuse to start (exit 2) naming the op that differs: auto (default: "
                  "all layers when the weights are <= 256 MiB, else the first 2), full, first, off")
      ->expected(0, 1);
  sub->add_flag("--no-self-check", a->no_self_check, "Skip the start-up self-check");
  sub->add_flag("--op-metrics", a->op_metrics,
                "Time every backend op and count routed tokens per MoE expert, exported in "
                "/metrics as op_seconds_total{op}, op_calls_total{op} and "
                "moe_routed_tokens_total{layer,expert} (docs/observability.md)");
  sub->add_option("--max-connections", a->max_connections,
                  "Open connections at most; more get 503 and are closed (default 4096)");
  sub->add_option("--read-timeout", a->read_timeout,
                  "Seconds a request's whole header block may take (a client that misses it gets "
                  "408 and is disconnected), and each read of its body (default 30)");
  sub->add_option("--write-timeout", a->write_timeout,
                  "Seconds one write to a client may take; a client that stops reading (e.g. an "
                  "unread stream) is disconnected and its generation cancelled (default 60)");
  sub->add_option("--keep-alive-timeout", a->keep_alive_timeout,
                  "Seconds an idle keep-alive connection stays open between requests "
                  "(default 30)");
  return [a]() -> int {
    const int code = RunServe(*a);
    ReportLeaderExit(code);  // rank 0 under serve's own mpirun (serve_parallel.h)
    return code;
  };
}

DH_REGISTER_COMMAND(serve_command, "serve",
                    "Serve a model over an OpenAI-compatible HTTP API (chat, completions, "
                    "streaming, /metrics)",
                    SetupServe);

}  // namespace
}  // namespace dh::app
