// Engine: the engine thread's loop (ingest -> schedule -> forward -> sample -> publish) and the
// thread-safe front door (Submit, Cancel, Drain, Stop, GetStats).
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "base/check.h"
#include "base/log.h"
#include "base/trace.h"
#include "engine/request_channel.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/stop_matcher.h"
#include "kvcache/block_pool.h"

namespace dh {
namespace {

// Engine-side state of one request.
struct ActiveRequest {
  Sequence seq;
  std::shared_ptr<internal::RequestChannel> channel;
  SamplingParams params;
  std::unique_ptr<SequenceSampler> sampler;
  std::unique_ptr<StreamingDecoder> decoder;  // null without a tokenizer
  std::unique_ptr<StopMatcher> stop;          // null without stop strings
  int max_num_tokens = 0;                     // prompt + allowed output
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  RequestTiming timing;
  RequestOutput delta;  // accumulated during a step, published at its end
  bool has_delta = false;
  // Speculative decoding (docs/mtp.md): drafts with the MTP layer each step; off for requests
  // whose sampling cannot be verified token by token here (constraints, logprobs).
  bool speculate = false;
  std::vector<int32_t> verified;  // tokens a verification chose this step, in order
};

// Index of the largest value; ties to the lowest index (the MTP drafter's greedy pick).
int32_t ArgmaxRow(std::span<const float> row) {
  int32_t best = 0;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

// Empties a batch but keeps its vectors' capacity (the drafter reuses one per step).
void ClearBatch(Batch& b) {
  b.token_ids.clear();
  b.positions.clear();
  b.query_start.clear();
  b.seq_lens.clear();
  b.max_blocks_per_seq = 0;
  b.block_tables.clear();
  b.slot_mapping.clear();
  b.logits_rows.clear();
}

// The prefill chunks of a step on their requests' tracks.
void TraceChunks(Tracer& t, const SchedulerOutput& out, EngineTime start, EngineTime end) {
  for (const ScheduledChunk& c : out.chunks) {
    if (c.start >= c.seq->num_prompt_tokens) continue;  // a decode step
    t.Async("prefill chunk", "request", static_cast<uint64_t>(c.seq->seq_id), start, end,
            fmt::format("{}, {}", JsonArg("start", c.start), JsonArg("tokens", c.num_tokens)));
  }
}

// A finished request on the trace: its own track (keyed by the sequence id) with the request
// span and its phases, queued -> prefill -> decode (docs/observability.md).
void TraceRequest(Tracer& t, const ActiveRequest& r, FinishReason reason) {
  const RequestTiming& tm = r.timing;
  const uint64_t id = static_cast<uint64_t>(r.seq.seq_id);
  const EngineTime scheduled = tm.first_scheduled == EngineTime{} ? tm.finished : tm.first_scheduled;
  t.Async("request " + r.channel->id, "request", id, tm.arrival, tm.finished,
          fmt::format("{}, {}, {}", JsonArg("prompt_tokens", r.seq.num_prompt_tokens),
                      JsonArg("completion_tokens", r.seq.num_generated()),
                      JsonArg("finish_reason", FinishReasonName(reason))));
  t.Async("queued", "request", id, tm.arrival, scheduled);
  if (tm.first_token != EngineTime{}) {
    t.Async("prefill", "request", id, scheduled, tm.first_token);
    t.Async("decode", "request", id, tm.first_token, tm.finished);
  }
}

}  // namespace

struct Engine::Impl {
  EngineOptions options;
  std::unique_ptr<Model> model;
  Backend& backend;
  const Tokenizer* tokenizer;

  // ---- engine thread only ----
  std::unique_ptr<KvStorage> kv;
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<Scheduler> scheduler;
  std::unordered_map<Sequence*, std::unique_ptr<ActiveRequest>> active;
  std::vector<int32_t> eos_ids;
  std::vector<float> logits;
  int64_t next_seq_id = 0;
  int64_t num_steps = 0;
  int64_t vocab_size = 0;
  int max_len = 0;
  std::vector<int32_t> suppressed;  // SuppressedIds' output, reused
  // Speculative decoding, reused across steps: the main step's hidden rows, the MTP step's
  // input rows, batch and logits, and the sequences drafting this step.
  int spec_k = 0;
  std::vector<float> hidden;
  std::vector<float> mtp_hidden;
  std::vector<float> mtp_logits;
  Batch mtp_batch;
  struct Drafter {
    ActiveRequest* r;
    int k;  // drafts to make
  };
  std::vector<Drafter> drafters;

  // ---- shared, guarded by mu ----
  std::mutex mu;
  std::condition_variable wake;     // engine thread: new work, cancel or stop
  std::condition_variable drained;  // Drain(): unfinished reached 0, or Stop()
  std::mutex join_mu;               // Stop(): one thread joins the engine thread
  std::deque<std::unique_ptr<ActiveRequest>> inbox;
  std::unordered_map<std::string, std::weak_ptr<internal::RequestChannel>> live;
  bool cancel_pending = false;
  bool stopping = false;
  bool draining = false;
  bool started = false;
  int unfinished = 0;
  int64_t next_request_number = 0;
  std::mt19937_64 seed_source{std::random_device{}()};
  EngineStats stats;  // published by the engine thread after each step
  std::thread thread;

  // Shared with request channels so a handle outliving the engine can still "cancel" safely.
  struct Waker {
    std::mutex mu;
    Impl* impl = nullptr;
  };
  std::shared_ptr<Waker> waker = std::make_shared<Waker>();

  Impl(EngineOptions o, std::unique_ptr<Model> m, Backend& b, const Tokenizer* t)
      : options(std::move(o)), model(std::move(m)), backend(b), tokenizer(t) {}

  void Run();
  void Ingest();
  void Step();
  void ProcessChunkOutputs(const SchedulerOutput& out, const Batch& batch,
                           const std::vector<size_t>& first_row, EngineTime now);
  void SampleToken(ActiveRequest& r, std::span<float> row, EngineTime now);
  void EmitToken(ActiveRequest& r, int32_t token, std::span<const float> raw, EngineTime now);
  void SuppressedIds(const ActiveRequest& r, int generated);
  void VerifyDrafts(SchedulerOutput& out, const std::vector<size_t>& first_row);
  void Draft(const SchedulerOutput& out, const std::vector<size_t>& first_row);
  void Finish(ActiveRequest& r, FinishReason reason, EngineTime now, Status error = Status::Ok());
  void Publish();
  void PublishStats();
  void AbortAll(const Status& why);
};

Engine::Engine(EngineOptions options, std::unique_ptr<Model> model, Backend& backend,
               const Tokenizer* tokenizer)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(model), backend, tokenizer)) {
  DH_CHECK(impl_->model != nullptr, "Engine needs a model");
}

Engine::~Engine() {
  Stop();
  std::lock_guard<std::mutex> lock(impl_->waker->mu);
  impl_->waker->impl = nullptr;
}

const Model& Engine::model() const { return *impl_->model; }
const Tokenizer* Engine::tokenizer() const { return impl_->tokenizer; }
const EngineOptions& Engine::options() const { return impl_->options; }
int Engine::max_model_len() const { return impl_->max_len; }

Status Engine::Start() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.started) return InvalidArgument("engine already started");
  }
  const EngineOptions& o = m.options;
  if (o.block_size <= 0 || o.max_num_seqs <= 0 || o.max_num_batched_tokens <= 0 ||
      o.max_queue_size <= 0 || o.max_model_len < 0) {
    return InvalidArgument(
        "engine options: block_size {}, max_num_seqs {}, max_num_batched_tokens {}, "
        "max_queue_size {} must be positive and max_model_len {} >= 0",
        o.block_size, o.max_num_seqs, o.max_num_batched_tokens, o.max_queue_size, o.max_model_len);
  }
  if (o.num_speculative_tokens < 0 || o.num_speculative_tokens > kMaxSpeculativeTokens) {
    return InvalidArgument("--num-speculative-tokens: expected 1..{}, got {}",
                           kMaxSpeculativeTokens, o.num_speculative_tokens);
  }
  if (o.num_speculative_tokens > 0 && !m.model->has_mtp()) {
    return InvalidArgument(
        "--speculative mtp: the model has no MTP layer loaded (num_nextn_predict_layers {})",
        m.model->config().num_nextn_predict_layers);
  }
  m.spec_k = o.num_speculative_tokens;
  const KvCacheSpec spec = m.model->kv_spec();
  int64_t num_blocks = o.num_kv_blocks;
  if (num_blocks <= 0) {
    const uint64_t per_block = spec.BytesPerToken() * static_cast<uint64_t>(o.block_size);
    if (per_block == 0)
      return InvalidArgument("KV cache: the model needs no KV; set num_kv_blocks");
    const uint64_t memory = o.kv_cache_memory > 0 ? o.kv_cache_memory : DefaultKvCacheMemory();
    num_blocks =
        static_cast<int64_t>(std::min<uint64_t>(memory / per_block, INT32_MAX / o.block_size));
    if (o.kv_cache_memory == 0) {
      // The default never takes more than max_num_seqs full-length sequences can use.
      const int64_t len = o.max_model_len > 0 ? o.max_model_len
                                              : m.model->config().max_position_embeddings;
      const int64_t useful =
          static_cast<int64_t>(o.max_num_seqs) * ((len + o.block_size - 1) / o.block_size);
      num_blocks = std::min(num_blocks, std::max<int64_t>(useful, 1));
    }
    if (num_blocks <= 0) {
      return ResourceExhausted("--kv-cache-memory {} bytes holds no block of {} bytes", memory,
                               per_block);
    }
  }
  DH_ASSIGN_OR_RETURN(
      m.kv, KvStorage::Allocate(m.backend, spec, static_cast<int>(num_blocks), o.block_size));
  m.pool = std::make_unique<BlockPool>(static_cast<int>(num_blocks), o.block_size,
                                       o.enable_prefix_caching);
  m.scheduler = std::make_unique<Scheduler>(
      SchedulerConfig{o.max_num_seqs, o.max_num_batched_tokens}, *m.pool);
  const ModelConfig& config = m.model->config();
  m.vocab_size = config.vocab_size;
  int64_t len = o.max_model_len > 0 ? o.max_model_len : config.max_position_embeddings;
  len = std::min<int64_t>(len, num_blocks * o.block_size);
  m.max_len = static_cast<int>(std::max<int64_t>(len, 1));
  m.eos_ids = o.eos_token_ids;
  if (m.eos_ids.empty()) {
    if (m.tokenizer && m.tokenizer->config().eos_token_id) {
      m.eos_ids.push_back(*m.tokenizer->config().eos_token_id);
    }
    for (int64_t id : config.eos_token_ids) m.eos_ids.push_back(static_cast<int32_t>(id));
  }
  std::erase_if(m.eos_ids, [&](int32_t id) { return id < 0 || id >= m.vocab_size; });
  DH_LOG(Info,
         "engine: {} KV blocks of {} tokens, max model len {}, max {} seqs / {} tokens per step",
         num_blocks, o.block_size, m.max_len, o.max_num_seqs, o.max_num_batched_tokens);
  {
    std::lock_guard<std::mutex> lock(m.waker->mu);
    m.waker->impl = &m;
  }
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.started = true;
    m.stats.spec_accepted_per_pos.assign(static_cast<size_t>(m.spec_k), 0);
  }
  m.PublishStats();
  m.thread = std::thread([&m] { m.Run(); });
  return Status::Ok();
}

Result<std::shared_ptr<RequestHandle>> Engine::Submit(Request request) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.started || m.stopping) return Status(StatusCode::kCancelled, "engine is not running");
    if (m.draining) return Status(StatusCode::kCancelled, "engine is draining");
  }
  const int prompt_len = static_cast<int>(request.prompt_token_ids.size());
  if (prompt_len == 0) return InvalidArgument("prompt: must contain at least one token");
  for (int32_t id : request.prompt_token_ids) {
    if (id < 0 || id >= m.vocab_size) {
      return InvalidArgument("prompt: token id {} is out of vocabulary (size {})", id,
                             m.vocab_size);
    }
  }
  DH_RETURN_IF_ERROR(request.sampling.Validate(m.vocab_size, m.tokenizer != nullptr));
  const int needed = request.sampling.max_tokens > 0 ? prompt_len + 1 : prompt_len;
  if (needed > m.max_len) {
    return OutOfRange("prompt: {} tokens{} exceed the maximum context length of {} tokens",
                      prompt_len, request.sampling.max_tokens > 0 ? " plus one output token" : "",
                      m.max_len);
  }

  auto r = std::make_unique<ActiveRequest>();
  r->params = std::move(request.sampling);
  r->seq.token_ids = std::move(request.prompt_token_ids);
  r->seq.num_prompt_tokens = prompt_len;
  r->seq.use_prefix_cache = r->params.prompt_logprobs < 0;
  r->seq.all_logits = r->params.prompt_logprobs >= 0;
  r->speculate = m.spec_k > 0 && !r->params.constraint && r->params.logprobs < 0 &&
                 r->params.prompt_logprobs < 0;
  // The drafter needs the hidden state of every position, which comes with its logits row;
  // all_logits also bounds those rows per step (SchedulerConfig::max_num_logit_rows).
  if (r->speculate) r->seq.all_logits = true;
  r->max_num_tokens = prompt_len + std::min(r->params.max_tokens, m.max_len - prompt_len);
  r->timing.arrival =
      request.arrival_time == EngineTime{} ? EngineClock::now() : request.arrival_time;
  if (m.tokenizer) {
    r->decoder = std::make_unique<StreamingDecoder>(*m.tokenizer, r->params.skip_special_tokens);
    if (!r->params.stop.empty()) {
      r->stop = std::make_unique<StopMatcher>(r->params.stop, r->params.include_stop_str_in_output);
    }
  }

  std::lock_guard<std::mutex> lock(m.mu);
  if (m.stopping || m.draining) return Status(StatusCode::kCancelled, "engine is not accepting");
  // Requests not yet running (the running count lags by at most one step, which only makes
  // this bound stricter).
  if (m.unfinished - m.stats.num_running >= m.options.max_queue_size) {
    return ResourceExhausted("request queue is full ({} waiting)", m.options.max_queue_size);
  }
  std::string id =
      request.id.empty() ? fmt::format("req-{}", m.next_request_number++) : std::move(request.id);
  if (auto it = m.live.find(id); it != m.live.end() && !it->second.expired()) {
    return InvalidArgument("request id '{}' is already in flight", id);
  }
  const uint64_t seed = r->params.seed ? *r->params.seed : m.seed_source();
  r->sampler = std::make_unique<SequenceSampler>(r->params, seed, r->seq.token_ids);
  r->channel = std::make_shared<internal::RequestChannel>(id);
  std::weak_ptr<Impl::Waker> weak = m.waker;
  r->channel->on_cancel = [weak] {
    auto waker = weak.lock();
    if (!waker) return;
    std::lock_guard<std::mutex> wl(waker->mu);
    if (!waker->impl) return;
    {
      std::lock_guard<std::mutex> l(waker->impl->mu);
      waker->impl->cancel_pending = true;
    }
    waker->impl->wake.notify_all();
  };
  auto handle = std::make_shared<RequestHandle>(r->channel);
  m.live[id] = r->channel;
  m.inbox.push_back(std::move(r));
  ++m.unfinished;
  m.wake.notify_all();
  return handle;
}

bool Engine::Cancel(const std::string& request_id) {
  std::shared_ptr<internal::RequestChannel> channel;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->live.find(request_id);
    if (it == impl_->live.end()) return false;
    channel = it->second.lock();
  }
  if (!channel) return false;
  channel->RequestCancel();
  return true;
}

bool Engine::Drain(std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  m.draining = true;
  // A Stop() from another thread (a second SIGTERM) ends the wait: what is left gets aborted.
  m.drained.wait_for(lock, timeout, [&] { return m.unfinished == 0 || m.stopping; });
  return m.unfinished == 0;
}

void Engine::Stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping = true;
    m.draining = true;
  }
  m.wake.notify_all();
  m.drained.notify_all();
  // Several threads may call Stop (serve's signal watcher and its main thread): one joins, the
  // others wait for that join instead of joining the same thread twice.
  std::lock_guard<std::mutex> join_lock(m.join_mu);
  if (m.thread.joinable()) m.thread.join();
}

EngineStats Engine::GetStats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  EngineStats s = impl_->stats;
  s.started = impl_->started && !impl_->stopping;
  s.draining = impl_->draining;
  s.num_waiting += static_cast<int>(impl_->inbox.size());
  return s;
}

// ---------------------------------------------------------------------------------------------
// Engine thread.

void Engine::Impl::Run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      const bool idle = active.empty() && inbox.empty() && !cancel_pending;
      if (idle && !stopping) {
        wake.wait_for(lock, std::chrono::milliseconds(200),
                      [&] { return stopping || cancel_pending || !inbox.empty(); });
      }
      if (stopping) break;
    }
    Ingest();
    if (!active.empty()) Step();
    PublishStats();
  }
  Ingest();
  AbortAll(Status(StatusCode::kCancelled, "engine stopped"));
  PublishStats();
}

void Engine::Impl::Ingest() {
  std::deque<std::unique_ptr<ActiveRequest>> fresh;
  bool check_cancels;
  {
    std::lock_guard<std::mutex> lock(mu);
    fresh.swap(inbox);
    check_cancels = cancel_pending;
    cancel_pending = false;
  }
  for (auto& r : fresh) {
    r->seq.seq_id = next_seq_id++;
    Sequence* seq = &r->seq;
    active.emplace(seq, std::move(r));
    scheduler->AddWaiting(seq);
    check_cancels = true;  // a request may have been cancelled while in the inbox
  }
  if (!check_cancels) return;
  const EngineTime now = EngineClock::now();
  std::vector<ActiveRequest*> cancelled;
  for (auto& [seq, r] : active) {
    if (r->channel->cancel_requested.load()) cancelled.push_back(r.get());
  }
  for (ActiveRequest* r : cancelled) Finish(*r, FinishReason::kAbort, now);
  Publish();
}

void Engine::Impl::Step() {
  TraceSpan span("engine.step");
  SchedulerOutput out = scheduler->Schedule();
  const EngineTime now = EngineClock::now();
  if (out.empty()) {
    if (scheduler->running().empty() && !scheduler->waiting().empty()) {
      // Cannot happen while max_len <= pool capacity; never spin on a request that cannot fit.
      Finish(*active.at(scheduler->waiting().front()), FinishReason::kAbort, now,
             ResourceExhausted("request does not fit in the KV cache"));
      Publish();
    }
    return;
  }
  Batch batch;
  std::vector<size_t> first_row;  // per chunk: index of its first row in batch.logits_rows
  for (const ScheduledChunk& c : out.chunks) {
    ActiveRequest& r = *active.at(c.seq);
    if (r.timing.first_scheduled == EngineTime{}) {
      r.timing.first_scheduled = now;
      std::lock_guard<std::mutex> lock(mu);
      stats.prompt_tokens += r.seq.num_prompt_tokens;
    }
    const bool all_logits =
        r.speculate || (r.seq.all_logits && c.start < r.seq.num_prompt_tokens - 1);
    first_row.push_back(batch.logits_rows.size());
    const size_t blocks_used =
        static_cast<size_t>((c.start + c.num_tokens + options.block_size - 1) / options.block_size);
    batch.AddSequence(std::span<const int32_t>(r.seq.token_ids).subspan(c.start, c.num_tokens),
                      c.start, std::span<const int32_t>(c.seq->blocks.block_ids).first(blocks_used),
                      options.block_size, all_logits);
    if (!all_logits && !c.samples) batch.logits_rows.pop_back();  // this chunk needs no logits
  }
  if (span.active()) {
    span.SetArgs(fmt::format("{}, {}", JsonArg("sequences", batch.num_seqs()),
                             JsonArg("tokens", batch.num_tokens())));
  }
  logits.clear();
  Status st = model->Forward(batch, *kv, &logits);
  const size_t rows = batch.logits_rows.size();
  if (st.ok() && logits.size() != rows * static_cast<size_t>(vocab_size)) {
    st = Internal("model returned {} logits for {} rows of {}", logits.size(), rows, vocab_size);
  }
  if (!st.ok()) {
    DH_LOG(Error, "engine: forward step failed: {}", st.message());
    for (const ScheduledChunk& c : out.chunks) {
      Finish(*active.at(c.seq), FinishReason::kAbort, now, st);
    }
    Publish();
    return;
  }
  ++num_steps;
  if (Tracer* t = ActiveTracer()) TraceChunks(*t, out, now, EngineClock::now());
  if (spec_k > 0) {
    const std::span<const float> h = model->last_hidden();
    hidden.assign(h.begin(), h.end());
    VerifyDrafts(out, first_row);  // shrinks verified chunks to the tokens they keep
  }
  scheduler->CompleteStep(out);
  ProcessChunkOutputs(out, batch, first_row, EngineClock::now());
  if (spec_k > 0) Draft(out, first_row);
  Publish();
}

void Engine::Impl::ProcessChunkOutputs(const SchedulerOutput& out, const Batch& batch,
                                       const std::vector<size_t>& first_row, EngineTime now) {
  const size_t vocab = static_cast<size_t>(vocab_size);
  auto row_span = [&](size_t row) { return std::span<float>(logits).subspan(row * vocab, vocab); };
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    const ScheduledChunk& c = out.chunks[i];
    ActiveRequest& r = *active.at(c.seq);
    const size_t end_row = i + 1 < out.chunks.size() ? first_row[i + 1] : batch.logits_rows.size();
    const size_t num_rows = end_row - first_row[i];
    if (r.params.prompt_logprobs >= 0 && (num_rows > 1 || (num_rows == 1 && !c.samples))) {
      // Every position has a row: row j predicts prompt token start + j + 1.
      const int num_prompt = r.seq.num_prompt_tokens;
      if (r.prompt_logprobs.empty()) r.prompt_logprobs.resize(num_prompt);
      for (size_t j = 0; j < num_rows; ++j) {
        const int target = c.start + static_cast<int>(j) + 1;
        if (target >= num_prompt) break;
        r.prompt_logprobs[target] = ComputeLogprob(
            row_span(first_row[i] + j), r.seq.token_ids[target], r.params.prompt_logprobs);
      }
    }
    if (!c.samples) continue;
    if (r.params.prompt_logprobs >= 0 && !r.prompt_logprobs_sent) {
      r.prompt_logprobs.resize(r.seq.num_prompt_tokens);
      r.delta.prompt_logprobs = std::move(r.prompt_logprobs);
      r.prompt_logprobs.clear();
      r.prompt_logprobs_sent = true;
      r.seq.all_logits = false;
      r.has_delta = true;
    }
    if (r.seq.num_tokens() >= r.max_num_tokens) {
      Finish(r, FinishReason::kLength, now);  // max_tokens == 0: prompt only
      continue;
    }
    if (!r.verified.empty()) {
      // Verified drafts (VerifyDrafts): the accepted ones are re-added one by one, so that stop
      // conditions and output see exactly the tokens decoding one at a time would produce.
      r.seq.token_ids.resize(static_cast<size_t>(c.start) + 1);
      for (int32_t token : r.verified) {
        EmitToken(r, token, {}, now);
        if (r.delta.finished) break;
      }
      r.verified.clear();
      continue;
    }
    SampleToken(r, row_span(end_row - 1), now);
  }
}

void Engine::Impl::SuppressedIds(const ActiveRequest& r, int generated) {
  const SamplingParams& p = r.params;
  suppressed.clear();
  if (generated >= p.min_tokens) return;
  if (!p.ignore_eos && !p.constraint) suppressed = eos_ids;
  suppressed.insert(suppressed.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
}

// For each sequence whose chunk is [t_e, d_1 .. d_k] (the last real token and its drafts): row j
// of the logits is the target for position e + j + 1. Row by row, the sampler (with the
// penalties of the tokens chosen so far) picks a token given draft d_{j+1}; the first token that
// differs from its draft, or the bonus token from row k, ends the run. The chunk then keeps
// e .. e + accepted (their KV is right) and the KV slots past it are given back.
void Engine::Impl::VerifyDrafts(SchedulerOutput& out, const std::vector<size_t>& first_row) {
  const size_t vocab = static_cast<size_t>(vocab_size);
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    ScheduledChunk& c = out.chunks[i];
    Sequence& seq = *c.seq;
    const int k = seq.num_draft_tokens;
    if (k == 0) continue;
    DH_CHECK(c.samples && c.num_tokens == k + 1, "sequence {}: {} drafts in a chunk of {}",
             seq.seq_id, k, c.num_tokens);
    ActiveRequest& r = *active.at(c.seq);
    const int generated = seq.num_generated();
    const size_t e = static_cast<size_t>(c.start);
    int accepted = 0;
    r.verified.clear();
    for (int j = 0; j <= k; ++j) {
      std::span<float> row = std::span<float>(logits).subspan((first_row[i] + j) * vocab, vocab);
      SuppressedIds(r, generated + j);
      const int32_t draft = j < k ? seq.token_ids[e + 1 + static_cast<size_t>(j)] : -1;
      const int32_t token = draft >= 0 ? r.sampler->SampleWithDraft(row, suppressed, draft)
                                       : r.sampler->Sample(row, suppressed);
      r.sampler->Accept(token);
      r.verified.push_back(token);
      if (token != draft) break;
      ++accepted;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.spec_num_drafts;
      stats.spec_draft_tokens += k;
      stats.spec_accepted_tokens += accepted;
      for (int j = 0; j < accepted; ++j) ++stats.spec_accepted_per_pos[static_cast<size_t>(j)];
    }
    // Keep t_e and the accepted drafts: CompleteStep caches blocks with the verified tokens.
    seq.token_ids.resize(e + 1 + static_cast<size_t>(accepted));
    seq.num_draft_tokens = 0;
    c.num_tokens = accepted + 1;
    scheduler->pool().Truncate(seq.blocks, c.start + c.num_tokens);  // roll back the rejected
  }
}

// The MTP layer over the positions each speculating sequence's chunk kept (row i: token t_{i+1}
// with the main model's h_i; this fills the layer's cache there), then for a sequence that
// sampled: draft 1 = argmax of its last row's MTP logits, and draft j = argmax of the MTP at the
// next position with draft j - 1 and the previous MTP step's hidden row (chained, docs/mtp.md).
void Engine::Impl::Draft(const SchedulerOutput& out, const std::vector<size_t>& first_row) {
  const size_t H = static_cast<size_t>(model->config().hidden_size);
  const int bs = options.block_size;
  ClearBatch(mtp_batch);
  mtp_hidden.clear();
  drafters.clear();
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    const ScheduledChunk& c = out.chunks[i];
    ActiveRequest& r = *active.at(c.seq);
    if (!r.speculate || r.delta.finished) continue;
    Sequence& seq = r.seq;
    const int kept = c.num_tokens;
    if (seq.num_tokens() < c.start + kept + 1) continue;  // no next token to pair with
    int k = 0;
    if (c.samples) {
      // The verification computes positions e .. e + k (e: the last token's); reserve them now,
      // since the chained drafts write the MTP layer's cache at e .. e + k - 2.
      k = std::min(spec_k, r.max_num_tokens - seq.num_tokens() - 1);
      while (k > 0 &&
             !scheduler->pool().Reserve(seq.blocks,
                                        std::max(0, seq.num_tokens() + k - seq.blocks.num_slots))) {
        --k;
      }
    }
    const size_t blocks_used = static_cast<size_t>((c.start + kept + bs - 1) / bs);
    const auto table = std::span<const int32_t>(seq.blocks.block_ids).first(blocks_used);
    mtp_batch.AddSequence(std::span<const int32_t>(seq.token_ids).subspan(c.start + 1, kept),
                          c.start, table, bs, /*all_logits=*/false);
    if (k > 0) {
      drafters.push_back({&r, k});
    } else {
      mtp_batch.logits_rows.pop_back();
    }
    const auto h = std::span<const float>(hidden).subspan(first_row[i] * H, kept * H);
    mtp_hidden.insert(mtp_hidden.end(), h.begin(), h.end());
  }
  if (mtp_batch.num_tokens() == 0) return;
  const size_t vocab = static_cast<size_t>(vocab_size);
  int depth = 1;
  while (true) {
    if (Status st = model->ForwardMtp(mtp_batch, *kv, mtp_hidden, &mtp_logits); !st.ok()) {
      // Drafts only save time: decoding goes on without them.
      DH_LOG(Error, "engine: MTP draft step failed: {}", st.message());
      return;
    }
    // Rows of mtp_logits (and of last_hidden) are the drafters with k >= depth, in order.
    size_t row = 0;
    for (const Drafter& d : drafters) {
      if (d.k < depth) continue;
      const auto logits_row = std::span<const float>(mtp_logits).subspan(row * vocab, vocab);
      d.r->seq.token_ids.push_back(ArgmaxRow(logits_row));
      ++d.r->seq.num_draft_tokens;
      ++row;
    }
    ++depth;
    // The next depth: one token per drafter that wants more, at the position after the last.
    const std::span<const float> mtp_h = model->last_hidden();
    ClearBatch(mtp_batch);
    mtp_hidden.clear();
    row = 0;
    for (const Drafter& d : drafters) {
      if (d.k < depth - 1) continue;
      const size_t prev_row = row++;
      if (d.k < depth) continue;
      Sequence& seq = d.r->seq;
      const int pos = seq.num_tokens() - 2;  // the previous draft is t_{pos + 1}
      const size_t blocks_used = static_cast<size_t>((pos + 1 + bs - 1) / bs);
      mtp_batch.AddSequence(std::span<const int32_t>(seq.token_ids).subspan(pos + 1, 1), pos,
                            std::span<const int32_t>(seq.blocks.block_ids).first(blocks_used), bs,
                            /*all_logits=*/false);
      const auto h = mtp_h.subspan(prev_row * H, H);
      mtp_hidden.insert(mtp_hidden.end(), h.begin(), h.end());
    }
    if (mtp_batch.num_tokens() == 0) return;
  }
}

void Engine::Impl::SampleToken(ActiveRequest& r, std::span<float> row, EngineTime now) {
  const SamplingParams& p = r.params;
  std::vector<float> raw;
  if (p.logprobs >= 0) raw.assign(row.begin(), row.end());
  if (p.constraint && !p.constraint->Mask(row, p.ignore_eos ? std::span<const int32_t>() : eos_ids)) {
    Finish(r, FinishReason::kStop, now);  // the constraint is complete and EOS is ignored
    return;
  }
  SuppressedIds(r, r.seq.num_generated());
  const int32_t token = r.sampler->Sample(row, suppressed);
  r.sampler->Accept(token);
  if (p.constraint) p.constraint->Accept(token);
  EmitToken(r, token, raw, now);
}

// Appends a chosen token (the sampler and the constraint have accepted it already) and applies
// the stop conditions. `raw`: the row's logits before sampling, when logprobs are asked for.
void Engine::Impl::EmitToken(ActiveRequest& r, int32_t token, std::span<const float> raw,
                             EngineTime now) {
  const SamplingParams& p = r.params;
  const bool may_stop = r.seq.num_generated() >= p.min_tokens;
  r.seq.token_ids.push_back(token);
  if (r.timing.first_token == EngineTime{}) r.timing.first_token = now;
  r.timing.last_token = now;
  {
    std::lock_guard<std::mutex> lock(mu);
    ++stats.generation_tokens;
  }
  r.delta.token_ids.push_back(token);
  r.delta.token_times.push_back(now);
  if (p.logprobs >= 0) r.delta.logprobs.push_back(ComputeLogprob(raw, token, p.logprobs));
  r.has_delta = true;

  std::optional<size_t> stop_string;
  if (r.decoder) {
    auto piece = r.decoder->Push(token);
    std::string text = piece.ok() ? std::move(piece).value() : std::string();
    if (r.stop && may_stop) {
      StopMatcher::Step s = r.stop->Push(text);
      r.delta.text += s.text;
      stop_string = s.stop_index;
    } else {
      r.delta.text += text;
    }
  }
  if (stop_string) {
    r.delta.stop_string = r.stop->stops()[*stop_string];
    Finish(r, FinishReason::kStop, now);
    return;
  }
  if (may_stop) {
    const bool is_eos =
        !p.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
    const bool is_stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
                            p.stop_token_ids.end();
    if (is_eos || is_stop_id) {
      r.delta.stop_token_id = token;
      Finish(r, FinishReason::kStop, now);
      return;
    }
  }
  if (r.seq.num_tokens() >= r.max_num_tokens) Finish(r, FinishReason::kLength, now);
}

void Engine::Impl::Finish(ActiveRequest& r, FinishReason reason, EngineTime now, Status error) {
  if (r.decoder && reason != FinishReason::kStop) {
    // Release everything held back: incomplete UTF-8 and a possible stop-string prefix.
    std::string tail = r.decoder->Flush();
    if (r.stop) {
      StopMatcher::Step s = r.stop->Push(tail);
      r.delta.text += s.text;
      if (!s.stop_index) r.delta.text += r.stop->Flush();
    } else {
      r.delta.text += tail;
    }
  }
  r.timing.finished = now;
  if (Tracer* t = ActiveTracer()) TraceRequest(*t, r, reason);
  r.delta.finished = true;
  r.delta.finish_reason = reason;
  r.delta.error = std::move(error);
  r.has_delta = true;
  scheduler->Remove(&r.seq);
  {
    std::lock_guard<std::mutex> lock(mu);
    switch (reason) {
      case FinishReason::kStop:
        ++stats.requests_finished_stop;
        break;
      case FinishReason::kLength:
        ++stats.requests_finished_length;
        break;
      default:
        ++stats.requests_finished_abort;
        break;
    }
  }
}

// Pushes every pending delta to its channel and forgets finished requests. Stats go first, so a
// reader who saw an event never reads older stats afterwards.
void Engine::Impl::Publish() {
  PublishStats();
  int finished = 0;
  for (auto it = active.begin(); it != active.end();) {
    ActiveRequest& r = *it->second;
    if (r.has_delta) {
      r.delta.request_id = r.channel->id;
      r.delta.usage = {r.seq.num_prompt_tokens, r.seq.num_generated(),
                       std::max(0, r.seq.num_cached_tokens)};
      r.delta.timing = r.timing;
      const bool done = r.delta.finished;
      if (done) {  // before the event, so a reader who saw it can no longer find the id
        std::lock_guard<std::mutex> lock(mu);
        live.erase(r.channel->id);
      }
      r.channel->Push(std::move(r.delta));
      r.delta = RequestOutput();
      r.has_delta = false;
      if (done) {
        it = active.erase(it);
        ++finished;
        continue;
      }
    }
    ++it;
  }
  if (finished > 0) {
    std::lock_guard<std::mutex> lock(mu);
    unfinished -= finished;
    if (unfinished == 0) drained.notify_all();
  }
}

void Engine::Impl::PublishStats() {
  const BlockPoolStats ps = pool->stats();
  std::lock_guard<std::mutex> lock(mu);
  stats.num_running = static_cast<int>(scheduler->running().size());
  stats.num_waiting = static_cast<int>(scheduler->waiting().size());
  stats.kv_blocks_total = ps.total;
  stats.kv_blocks_free = ps.free;
  stats.kv_blocks_used = ps.used;
  stats.kv_blocks_cached = ps.cached;
  stats.kv_block_size = pool->block_size();
  stats.kv_capacity_tokens = static_cast<int64_t>(ps.total) * pool->block_size();
  stats.kv_bytes_per_token = kv->spec().BytesPerToken();
  stats.kv_cache_dtype = std::string(KvCacheDtypeName(kv->spec().dtype));
  stats.kv_usage = ps.total > 0 ? static_cast<double>(ps.used) / ps.total : 0.0;
  stats.kv_fragmentation = ps.fragmentation;
  stats.prefix_cache_queries = ps.prefix_queries;
  stats.prefix_cache_hits = ps.prefix_hits;
  stats.num_preemptions = scheduler->num_preemptions();
  stats.max_model_len = max_len;
  stats.num_steps = num_steps;
  stats.num_speculative_tokens = spec_k;
  stats.last_step = EngineClock::now();
}

void Engine::Impl::AbortAll(const Status& why) {
  const EngineTime now = EngineClock::now();
  std::vector<ActiveRequest*> all;
  for (auto& [seq, r] : active) all.push_back(r.get());
  for (ActiveRequest* r : all) Finish(*r, FinishReason::kAbort, now, why);
  Publish();
}

}  // namespace dh
