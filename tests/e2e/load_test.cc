// Load tests against the real server: the mixed-traffic run of issue 6 (64 clients; duration
// from DH_E2E_LOAD_SECONDS, default 120 s, the 2 minutes issue 6 asks for; set it lower for a quick run) with 0
// errors; a burst of 1,000 simultaneous requests answered only with 200 or 503 + Retry-After;
// greedy output identical at concurrency 1 and 8. After each, /metrics shows the KV pool at
// rest (free == total, nothing running or waiting).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

using namespace std::chrono_literals;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

Json RunBench(const ServerProcess& server, const std::string& args, std::string* raw) {
  const std::string cmd = std::string(DH_BINARY) + " bench serve --url " + server.base_url() +
                          " --json " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p && fgets(buf, sizeof(buf), p)) out += buf;
  if (p) pclose(p);
  *raw = out;
  size_t brace = out.find('{');
  return brace == std::string::npos ? Json() : Json::parse(out.substr(brace), nullptr, false);
}

TEST(LoadTest, MixedTrafficHasNoErrorsAndFreesThePool) {
  const int clients = EnvInt("DH_E2E_LOAD_CLIENTS", 64);
  const int seconds = EnvInt("DH_E2E_LOAD_SECONDS", 120);
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--max-num-seqs", "32"})) << server.log();
  std::string raw;
  Json result = RunBench(server,
                         "--concurrency " + std::to_string(clients) + " --duration " +
                             std::to_string(seconds) + " --mix short:20,medium:60,long:20",
                         &raw);
  ASSERT_TRUE(result.is_object()) << raw;
  EXPECT_EQ(result["failed"], 0) << result["errors"].dump();
  EXPECT_GT(result["completed"].get<int>(), clients) << raw;
  EXPECT_GT(result["output_throughput"].get<double>(), 0);
  std::string state;
  EXPECT_TRUE(server.WaitPoolAtRest(5s, &state)) << state;
  std::printf("mixed load: %d clients, %d s: %d requests, %.1f req/s, %.1f output tok/s, "
              "TTFT p99 %.0f ms, TPOT p99 %.1f ms\n",
              clients, seconds, result["completed"].get<int>(), result["request_throughput"].get<double>(),
              result["output_throughput"].get<double>(), result["p99_ttft_ms"].get<double>(),
              result["p99_tpot_ms"].get<double>());
  EXPECT_EQ(server.Stop(), 0) << server.log();
}

TEST(LoadTest, BurstOf1000IsAnswered200Or503) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--max-num-seqs", "16", "--max-num-queued-reqs", "64", "--http-threads", "256"}))
      << server.log();
  const std::string model = ServedModel(server);
  const Json body = {{"model", model}, {"prompt", "Now is the winter"}, {"max_tokens", 4}, {"temperature", 0}};
  const std::string payload = body.dump();
  std::mutex mu;
  std::map<int, int> statuses;
  int missing_retry_after = 0;
  std::map<std::string, int> errors;  // transport errors by kind
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 1000; ++i) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      httplib::Client client("127.0.0.1", server.port());
      client.set_connection_timeout(60);
      client.set_read_timeout(60);
      auto res = client.Post("/v1/completions", payload, "application/json");
      std::lock_guard<std::mutex> lock(mu);
      const int status = res ? res->status : 0;
      ++statuses[status];
      if (!res) ++errors[httplib::to_string(res.error())];
      if (status == 503 && !res->has_header("Retry-After")) ++missing_retry_after;
    });
  }
  const auto start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string summary;
  for (const auto& [status, n] : statuses) summary += std::to_string(status) + ":" + std::to_string(n) + " ";
  for (const auto& [kind, n] : errors) summary += kind + ":" + std::to_string(n) + " ";
  std::printf("burst of 1000: %s in %.1f s\n", summary.c_str(), elapsed);
  for (const auto& [status, n] : statuses) EXPECT_TRUE(status == 200 || status == 503) << summary;
  EXPECT_GT(statuses[200], 0) << summary;
  EXPECT_EQ(missing_retry_after, 0);
  EXPECT_LT(elapsed, 120.0);
  std::string state;
  EXPECT_TRUE(server.WaitPoolAtRest(5s, &state)) << state;
  EXPECT_EQ(server.Get("/health").status, 200);
  EXPECT_EQ(server.Stop(), 0) << server.log();
}

TEST(LoadTest, GreedyOutputIsIdenticalAtConcurrency1And8) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--max-num-seqs", "8"})) << server.log();
  std::string raw1, raw8;
  Json one = RunBench(server, "--concurrency 1 --num-prompts 16 --seed 7 --save-detailed", &raw1);
  Json eight = RunBench(server, "--concurrency 8 --num-prompts 16 --seed 7 --save-detailed", &raw8);
  ASSERT_TRUE(one.is_object() && one.contains("requests")) << raw1;
  ASSERT_TRUE(eight.is_object() && eight.contains("requests")) << raw8;
  ASSERT_EQ(one["requests"].size(), 16u);
  ASSERT_EQ(eight["requests"].size(), 16u);
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_TRUE(one["requests"][i]["success"].get<bool>());
    EXPECT_EQ(one["requests"][i]["generated_text"], eight["requests"][i]["generated_text"]) << "request " << i;
    EXPECT_EQ(one["requests"][i]["output_tokens"], eight["requests"][i]["output_tokens"]) << "request " << i;
  }
  std::string state;
  EXPECT_TRUE(server.WaitPoolAtRest(5s, &state)) << state;
  std::printf("batching: output tok/s at concurrency 1: %.1f, at 8: %.1f\n",
              one["output_throughput"].get<double>(), eight["output_throughput"].get<double>());
  EXPECT_EQ(server.Stop(), 0) << server.log();
}

}  // namespace
}  // namespace dh::e2e
