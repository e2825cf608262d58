// Engine end to end over a fake model: batching invariance, chunked prefill, preemption and
// recompute, prefix hits, cancellation, stop strings, EOS handling, logprobs and admission errors.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "unit/engine/fake_model.h"

namespace dh {
namespace {

using testing::FakeMode;
using testing::FakeModel;
using testing::FakeTokenizer;
using testing::NullBackend;
using testing::Prompt;
using testing::SubmitRequest;
using testing::WaitEngineIdle;
using namespace std::chrono_literals;

constexpr int kVocab = 64;

struct Harness {
  explicit Harness(EngineOptions options, FakeMode mode = FakeMode::kContextHash,
                   bool with_tokenizer = true) {
    auto m = std::make_unique<FakeModel>(kVocab, mode);
    model = m.get();
    if (options.num_kv_blocks == 0) options.num_kv_blocks = 64;
    engine = std::make_unique<Engine>(options, std::move(m), backend,
                                      with_tokenizer ? &tokenizer : nullptr);
    Status st = engine->Start();
    EXPECT_TRUE(st.ok()) << st.message();
  }
  std::shared_ptr<RequestHandle> Submit(std::vector<int32_t> prompt, SamplingParams p,
                                        std::string id = "") {
    return SubmitRequest(*engine, std::move(prompt), std::move(p), std::move(id));
  }
  EngineStats WaitIdle() { return WaitEngineIdle(*engine); }

  NullBackend backend;
  FakeTokenizer tokenizer{kVocab};
  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine;
};

SamplingParams Sampled(uint64_t seed, int max_tokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

std::vector<std::vector<int32_t>> RunAll(EngineOptions options, int num_requests, bool together,
                                         int max_tokens = 20) {
  std::vector<std::vector<int32_t>> outputs(num_requests);
  auto run = [&](Harness& h, int i) {
    auto p = i % 2 == 0 ? Sampled(1000 + i, max_tokens) : SamplingParams();
    if (i % 2 == 1) {
      p.temperature = 0;
      p.max_tokens = max_tokens;
      p.ignore_eos = true;
    }
    return h.Submit(Prompt(5 + 9 * i, i), p);
  };
  if (together) {
    Harness h(options);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int i = 0; i < num_requests; ++i) handles.push_back(run(h, i));
    for (int i = 0; i < num_requests; ++i) outputs[i] = handles[i]->WaitFinished().token_ids;
    EngineStats s = h.WaitIdle();
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
  } else {
    for (int i = 0; i < num_requests; ++i) {
      Harness h(options);
      outputs[i] = run(h, i)->WaitFinished().token_ids;
    }
  }
  return outputs;
}

TEST(EngineTest, OutputsDoNotDependOnBatchComposition) {
  EngineOptions o;
  o.max_num_batched_tokens = 40;  // forces chunked prefill next to decodes
  const auto alone = RunAll(o, 8, false);
  const auto together = RunAll(o, 8, true);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(alone[i].size(), 20u);
    EXPECT_EQ(alone[i], together[i]) << "request " << i;
  }
}

TEST(EngineTest, ChunkedPrefillStaysWithinTheBudgetAndMatchesOneShot) {
  EngineOptions small;
  small.max_num_batched_tokens = 16;
  Harness chunked(small);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 8;
  p.ignore_eos = true;
  const auto a = chunked.Submit(Prompt(100, 3), p)->WaitFinished();
  for (int n : chunked.model->step_tokens()) EXPECT_LE(n, 16);
  EXPECT_GE(chunked.model->step_tokens().size(), 7u + 7u);

  EngineOptions big;
  big.max_num_batched_tokens = 512;
  Harness whole(big);
  const auto b = whole.Submit(Prompt(100, 3), p)->WaitFinished();
  EXPECT_EQ(whole.model->step_tokens()[0], 100);
  EXPECT_EQ(a.token_ids, b.token_ids);
  EXPECT_EQ(a.finish_reason, FinishReason::kLength);
}

TEST(EngineTest, PreemptionRecomputesAndKeepsOutputs) {
  EngineOptions tight;
  tight.num_kv_blocks = 10;  // 160 slots for 6 requests that grow to 5 + 9i + 40 tokens
  tight.max_num_batched_tokens = 64;
  tight.enable_prefix_caching = false;
  const auto together = [&] {
    Harness h(tight);
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (int i = 0; i < 6; ++i) hs.push_back(h.Submit(Prompt(5 + 9 * i, i), Sampled(i, 40)));
    std::vector<std::vector<int32_t>> out;
    for (auto& x : hs) out.push_back(x->WaitFinished().token_ids);
    EngineStats s = h.WaitIdle();
    EXPECT_GT(s.num_preemptions, 0);
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
    return out;
  }();
  for (int i = 0; i < 6; ++i) {
    EngineOptions roomy;
    roomy.num_kv_blocks = 64;
    Harness h(roomy);
    EXPECT_EQ(h.Submit(Prompt(5 + 9 * i, i), Sampled(i, 40))->WaitFinished().token_ids, together[i])
        << "request " << i;
  }
}

TEST(EngineTest, PrefixCacheHitsAreReportedAndReused) {
  Harness h(EngineOptions{});
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 4;
  p.ignore_eos = true;
  auto shared = Prompt(50, 1);
  auto first = h.Submit(shared, p)->WaitFinished();
  EXPECT_EQ(first.usage.cached_tokens, 0);
  auto second_prompt = shared;
  second_prompt.push_back(5);
  auto second = h.Submit(second_prompt, p)->WaitFinished();
  EXPECT_EQ(second.usage.cached_tokens, 48);  // three whole blocks of 16
  EXPECT_EQ(second.usage.prompt_tokens, 51);
  // The same prompt again: everything but the last (partial) block comes from the cache, and
  // the output is what the uncached run produced.
  auto third = h.Submit(shared, p)->WaitFinished();
  EXPECT_EQ(third.usage.cached_tokens, 48);
  EXPECT_EQ(third.token_ids, first.token_ids);
  EngineStats s = h.WaitIdle();
  EXPECT_EQ(s.prefix_cache_queries, 50 + 51 + 50);
  EXPECT_EQ(s.prefix_cache_hits, 96);
  EXPECT_GT(s.kv_blocks_cached, 0);
}

TEST(EngineTest, CancelFreesBlocksPromptly) {
  EngineOptions o;
  Harness h(o);
  h.model->set_step_delay(2ms);
  auto long_request = Sampled(1, 100000);
  long_request.max_tokens = 3000;
  auto handle = h.Submit(Prompt(40, 2), long_request, "victim");
  ASSERT_TRUE(handle->Next(2s).has_value());
  EXPECT_TRUE(h.engine->Cancel("victim"));
  const auto t0 = std::chrono::steady_clock::now();
  RequestOutput rest = handle->WaitFinished();
  // The finished event is published after the blocks were released.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(rest.finish_reason, FinishReason::kAbort);
  EngineStats s = h.WaitIdle();
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
  EXPECT_EQ(s.requests_finished_abort, 1);
  EXPECT_FALSE(h.engine->Cancel("victim"));

  // Dropping a handle (a client that went away) cancels too.
  auto dropped = h.Submit(Prompt(40, 3), long_request);
  ASSERT_TRUE(dropped->Next(2s).has_value());
  dropped.reset();
  s = h.WaitIdle();
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
  EXPECT_EQ(s.requests_finished_abort, 2);
}

TEST(EngineTest, StopStringSpanningTokensIsCutFromTheText) {
  Harness h(EngineOptions{}, FakeMode::kSuccessor);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 20;
  p.stop = {"fgh"};
  // Prompt "a": the model continues b c d e f g h ...
  auto out = h.Submit({0}, p)->WaitFinished();
  EXPECT_EQ(out.text, "bcde");
  EXPECT_EQ(out.finish_reason, FinishReason::kStop);
  ASSERT_TRUE(out.stop_string.has_value());
  EXPECT_EQ(*out.stop_string, "fgh");
  EXPECT_EQ(out.token_ids.size(), 7u);  // b..h were generated; only the text is cut

  p.include_stop_str_in_output = true;
  EXPECT_EQ(h.Submit({0}, p)->WaitFinished().text, "bcdefgh");

  // A held-back possible prefix ("d" of "de") is released when generation ends by length.
  SamplingParams q;
  q.temperature = 0;
  q.max_tokens = 3;
  q.stop = {"de"};
  auto len_out = h.Submit({0}, q)->WaitFinished();
  EXPECT_EQ(len_out.text, "bcd");
  EXPECT_EQ(len_out.finish_reason, FinishReason::kLength);

  // Streaming: no event ever shows text beyond what the final output keeps.
  p.include_stop_str_in_output = false;
  auto handle = h.Submit({0}, p);
  std::string streamed;
  while (auto ev = handle->Next(2s)) streamed += ev->text;
  EXPECT_EQ(streamed, "bcde");
}

TEST(EngineTest, EosStopsUnlessIgnoredAndMinTokensSuppressesIt) {
  Harness h(EngineOptions{}, FakeMode::kSuccessor);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 10;
  // Prompt "9" (61): next is the space (62), then EOS (63).
  auto out = h.Submit({61}, p)->WaitFinished();
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{62, FakeTokenizer::kEos}));
  EXPECT_EQ(out.finish_reason, FinishReason::kStop);
  EXPECT_EQ(out.stop_token_id, FakeTokenizer::kEos);
  EXPECT_EQ(out.text, " ");  // the special token is skipped in text

  p.ignore_eos = true;
  out = h.Submit({61}, p)->WaitFinished();
  EXPECT_EQ(out.token_ids.size(), 10u);
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);

  p.ignore_eos = false;
  p.min_tokens = 3;  // EOS banned for the first 3 tokens
  out = h.Submit({61}, p)->WaitFinished();
  EXPECT_GE(out.token_ids.size(), 3u);
  EXPECT_NE(out.token_ids[1], FakeTokenizer::kEos);

  p.min_tokens = 0;
  p.stop_token_ids = {2};  // "c"
  out = h.Submit({0}, p)->WaitFinished();
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(out.stop_token_id, 2);
  EXPECT_EQ(out.text, "bc");
}

TEST(EngineTest, LogprobsAndPromptLogprobs) {
  EngineOptions o;
  o.max_num_batched_tokens = 8;  // prompt logprobs across chunks
  Harness h(o, FakeMode::kSuccessor);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 3;
  p.logprobs = 2;
  p.prompt_logprobs = 1;
  auto prompt = Prompt(20, 4);
  auto out = h.Submit(prompt, p)->WaitFinished();
  ASSERT_EQ(out.logprobs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out.logprobs[i].token_id, out.token_ids[i]);
    EXPECT_EQ(out.logprobs[i].rank, 1);  // greedy
    ASSERT_EQ(out.logprobs[i].top.size(), 2u);
    EXPECT_EQ(out.logprobs[i].top[0].token_id, out.token_ids[i]);
    EXPECT_FLOAT_EQ(out.logprobs[i].top[0].logprob, out.logprobs[i].logprob);
    EXPECT_LT(out.logprobs[i].logprob, 0.0f);
  }
  ASSERT_EQ(out.prompt_logprobs.size(), 20u);
  EXPECT_FALSE(out.prompt_logprobs[0].has_value());
  for (size_t i = 1; i < 20; ++i) {
    ASSERT_TRUE(out.prompt_logprobs[i].has_value()) << i;
    EXPECT_EQ(out.prompt_logprobs[i]->token_id, prompt[i]);
    EXPECT_EQ(out.prompt_logprobs[i]->top.size(), 1u);
  }
  // Echo-only scoring: max_tokens 0 returns prompt logprobs and no tokens.
  p.max_tokens = 0;
  out = h.Submit(prompt, p)->WaitFinished();
  EXPECT_TRUE(out.token_ids.empty());
  EXPECT_EQ(out.prompt_logprobs.size(), 20u);
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
}

TEST(EngineTest, StreamingEventsCarryTimingAndUsage) {
  Harness h(EngineOptions{});
  auto handle = h.Submit(Prompt(10, 1), Sampled(3, 5));
  int events = 0;
  std::vector<int32_t> ids;
  RequestOutput last;
  while (auto ev = handle->Next(2s)) {
    ++events;
    ids.insert(ids.end(), ev->token_ids.begin(), ev->token_ids.end());
    EXPECT_EQ(ev->token_times.size(), ev->token_ids.size());
    last = std::move(*ev);
  }
  EXPECT_GE(events, 1);
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.usage.prompt_tokens, 10);
  EXPECT_EQ(last.usage.completion_tokens, 5);
  const RequestTiming& t = last.timing;
  EXPECT_LE(t.arrival, t.first_scheduled);
  EXPECT_LE(t.first_scheduled, t.first_token);
  EXPECT_LE(t.first_token, t.last_token);
  EXPECT_LE(t.last_token, t.finished);
  EXPECT_TRUE(handle->finished());
  EXPECT_FALSE(handle->Next(1ms).has_value());
  EngineStats s = h.WaitIdle();
  EXPECT_EQ(s.generation_tokens, 5);
  EXPECT_EQ(s.prompt_tokens, 10);
  EXPECT_EQ(s.requests_finished_length, 1);
}

TEST(EngineTest, AdmissionErrors) {
  EngineOptions o;
  o.num_kv_blocks = 4;  // 64 slots: max model len 64
  o.max_queue_size = 2;
  Harness h(o, FakeMode::kContextHash, /*with_tokenizer=*/false);
  h.model->set_step_delay(2ms);  // "dup" must still be running when its id is reused
  EXPECT_EQ(h.engine->GetStats().max_model_len, 64);
  Request r;
  EXPECT_EQ(h.engine->Submit(r).status().code(), StatusCode::kInvalidArgument);  // empty
  r.prompt_token_ids = {1, kVocab};
  EXPECT_EQ(h.engine->Submit(r).status().code(), StatusCode::kInvalidArgument);  // bad id
  r.prompt_token_ids = Prompt(64, 0);
  EXPECT_EQ(h.engine->Submit(r).status().code(), StatusCode::kOutOfRange);  // no room to generate
  r.prompt_token_ids = {1};
  r.sampling.stop = {"x"};  // no tokenizer
  EXPECT_EQ(h.engine->Submit(r).status().code(), StatusCode::kInvalidArgument);
  r.sampling = SamplingParams();
  r.id = "dup";
  r.sampling.max_tokens = 1000;
  r.sampling.ignore_eos = true;
  auto first = h.engine->Submit(r);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(h.engine->Submit(r).status().code(), StatusCode::kInvalidArgument);  // same id
  // Generation is capped by the context: 63 new tokens at most.
  RequestOutput out = (*first)->WaitFinished();
  EXPECT_EQ(out.token_ids.size(), 63u);
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  EXPECT_TRUE(out.text.empty());
}

TEST(EngineTest, QueueBoundAndDrainAndStop) {
  EngineOptions o;
  o.max_queue_size = 3;
  o.max_num_seqs = 1;
  Harness h(o);
  h.model->set_step_delay(2ms);
  auto p = Sampled(1, 2000);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  bool rejected = false;
  for (int i = 0; i < 10 && !rejected; ++i) {
    Request r;
    r.prompt_token_ids = Prompt(8, i);
    r.sampling = p;
    auto res = h.engine->Submit(r);
    if (res.ok()) {
      hs.push_back(*res);
    } else {
      EXPECT_EQ(res.status().code(), StatusCode::kResourceExhausted);
      rejected = true;
    }
  }
  EXPECT_TRUE(rejected);
  EXPECT_FALSE(h.engine->Drain(10ms));  // long requests still running
  Request late;
  late.prompt_token_ids = {1};
  EXPECT_EQ(h.engine->Submit(late).status().code(), StatusCode::kCancelled);
  EXPECT_TRUE(h.engine->GetStats().draining);
  h.engine->Stop();
  for (auto& x : hs) EXPECT_EQ(x->WaitFinished().finish_reason, FinishReason::kAbort);
  EXPECT_EQ(h.engine->GetStats().kv_blocks_free, h.engine->GetStats().kv_blocks_total);
}

TEST(EngineTest, DrainWaitsForShortRequests) {
  Harness h(EngineOptions{});
  auto a = h.Submit(Prompt(8, 1), Sampled(1, 5));
  auto b = h.Submit(Prompt(8, 2), Sampled(2, 5));
  EXPECT_TRUE(h.engine->Drain(5s));
  EXPECT_EQ(a->WaitFinished().token_ids.size(), 5u);
  EXPECT_EQ(b->WaitFinished().token_ids.size(), 5u);
}

// serve's shutdown: the main thread waits in Drain while a second SIGTERM makes another thread
// call Stop, and the main thread then calls Stop too. Drain must return promptly and both Stops
// must return (one joins the engine thread, the other waits for that join).
TEST(EngineTest, StopFromAnotherThreadEndsDrainAndStopIsIdempotent) {
  EngineOptions o;
  o.max_num_seqs = 1;
  Harness h(o);
  h.model->set_step_delay(2ms);
  auto a = h.Submit(Prompt(8, 1), Sampled(1, 100000));
  const auto start = std::chrono::steady_clock::now();
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    h.engine->Stop();
  });
  h.engine->Drain(60s);  // its result depends on whether the abort already landed
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  h.engine->Stop();
  stopper.join();
  EXPECT_EQ(a->WaitFinished().finish_reason, FinishReason::kAbort);
  h.engine->Stop();  // a third call after the join is a no-op
}

// Two threads calling Stop at the same moment (before the fix both joined the engine thread:
// undefined behaviour that crashed or hung the process).
TEST(EngineTest, ConcurrentStopsJoinTheEngineThreadOnce) {
  for (int round = 0; round < 20; ++round) {
    Harness h(EngineOptions{});
    h.model->set_step_delay(1ms);  // still running when the stops arrive
    auto a = h.Submit(Prompt(8, round), Sampled(round, 100000));
    std::atomic<int> ready{0};
    auto stop = [&] {
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();
      h.engine->Stop();
    };
    std::thread t1(stop), t2(stop);
    t1.join();
    t2.join();
    EXPECT_EQ(a->WaitFinished().finish_reason, FinishReason::kAbort);
  }
}

}  // namespace
}  // namespace dh
