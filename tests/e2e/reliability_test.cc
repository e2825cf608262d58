// Regression tests for the server defects of issue 20 (found by a trial run): idle keep-alive
// connections holding shutdown, a second server on a used port, chunked bodies past the size
// limit, non-streaming requests outliving their client, /v1/models/{id}, optional 'model', CORS
// and --allowed-hosts, sequential response ids, an oversized --kv-cache-memory, idle
// connections starving new ones, and slow clients (trickled headers, streams never read).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A raw client socket (so a test controls keep-alive, chunking and disconnects).
class RawConn {
 public:
  // `rcvbuf` > 0: a small receive buffer (set before connecting, so the window stays small).
  explicit RawConn(int port, int rcvbuf = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() { Close(); }
  bool ok() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Ends both directions without releasing the descriptor, so a thread blocked in Send on it
  // returns (Close would race with that thread's use of fd_).
  void Shutdown() {
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
  }
  bool Send(const std::string& data) {
    size_t sent = 0;
    while (sent < data.size()) {
      ssize_t n = send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until `marker` has been seen or `timeout` passes.
  std::string ReadUntil(const std::string& marker, std::chrono::milliseconds timeout) {
    std::string got;
    const auto deadline = Clock::now() + timeout;
    while (got.find(marker) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
  // Reads until the server closes the connection (true) or `timeout` passes (false).
  bool ReadToEof(std::string* got, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      char buf[16384];
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
      got->append(buf, static_cast<size_t>(n));
    }
  }
  int fd() const { return fd_; }
  // One keep-alive GET; returns the response head + body read so far.
  std::string Get(const std::string& path, const std::string& extra_headers = "") {
    if (!Send("GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers + "\r\n"))
      return "";
    return ReadUntil("}", 10s);
  }

 private:
  int fd_ = -1;
};

// Runs the binary with `args`, returns its exit code and output (stdout + stderr).
int RunBinary(const std::string& args, std::string* output, const std::string& env = "") {
  const std::string cmd = env + " " + std::string(DH_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf;
  output->clear();
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output->append(buf.data(), n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class ReliabilityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    ASSERT_TRUE(server_->Start({"--max-body-bytes", "1048576", "--http-threads", "4",
                                "--allowed-origins", "http://app.example", "--allowed-hosts",
                                "proxy.example"}))
        << server_->log();
    model_ = ServedModel(*server_);
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
  }
  static ServerProcess* server_;
  static std::string model_;
};
ServerProcess* ReliabilityTest::server_ = nullptr;
std::string ReliabilityTest::model_;

// Defect 3: a chunked body is capped by --max-body-bytes (413), not read and tokenized whole.
TEST_F(ReliabilityTest, ChunkedBodyOverLimitIs413) {
  RawConn c(server_->port());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c.Send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     "application/json\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string piece(64 << 10, 'a');
  char size_line[32];
  std::snprintf(size_line, sizeof(size_line), "%zx\r\n", piece.size());
  std::string chunk = std::string(size_line) + piece + "\r\n";
  // Up to 40 MiB; the server stops reading after ~1 MiB, so sending soon fails or blocks.
  std::thread sender([&c, chunk] {
    for (int i = 0; i < 640; ++i)
      if (!c.Send(chunk)) return;
  });
  std::string reply = c.ReadUntil("\r\n\r\n", 20s);
  c.Shutdown();  // unblocks the sender
  sender.join();
  c.Close();
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply.substr(0, 200);
  EXPECT_EQ(server_->Get("/health").status, 200);
  // Small chunked bodies still work.
  RawConn ok(server_->port());
  const std::string body = "{\"model\":\"" + model_ + "\",\"prompt\":\"hi\",\"max_tokens\":2}";
  char len[32];
  std::snprintf(len, sizeof(len), "%zx\r\n", body.size());
  ASSERT_TRUE(ok.Send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                      "application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                      std::string(len) + body + "\r\n0\r\n\r\n"));
  std::string small = ok.ReadUntil("}}", 30s);
  EXPECT_EQ(small.rfind("HTTP/1.1 200", 0), 0u) << small.substr(0, 300);
}

// Defect 4: a non-streaming request is cancelled when its client disconnects and the sequences
// are freed (the target is within 1 s; the bound here allows for a loaded CI machine).
TEST_F(ReliabilityTest, NonStreamingCancelledOnDisconnect) {
  const int max_len = server_->Get("/v1/models").json()["data"][0]["max_model_len"];
  const double before = MetricValue(server_->Metrics(), "generation_tokens_total");
  ASSERT_GE(before, 0);
  const int max_tokens = max_len - 8;
  Json body = {{"model", model_},   {"prompt", {"a", "b", "c", "d", "e", "f", "g", "h"}},
               {"n", 8},            {"max_tokens", max_tokens},
               {"ignore_eos", true}, {"temperature", 1.0}};
  const std::string text = body.dump();
  RawConn c(server_->port());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c.Send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     "application/json\r\nContent-Length: " + std::to_string(text.size()) +
                     "\r\n\r\n" + text));
  // Wait until generation has started.
  const auto start_deadline = Clock::now() + 30s;
  while (Clock::now() < start_deadline &&
         MetricValue(server_->Metrics(), "num_requests_running") < 1)
    std::this_thread::sleep_for(10ms);
  ASSERT_GE(MetricValue(server_->Metrics(), "num_requests_running"), 1);
  const auto closed_at = Clock::now();
  c.Close();
  std::string state;
  ASSERT_TRUE(server_->WaitPoolAtRest(10s, &state)) << state;
  const double freed_s = std::chrono::duration<double>(Clock::now() - closed_at).count();
  std::printf("[ info ] sequences freed %.3f s after the client disconnected\n", freed_s);
  const double generated = MetricValue(server_->Metrics(), "generation_tokens_total") - before;
  // 64 sequences ran to far less than max_tokens each.
  EXPECT_LT(generated, 64.0 * max_tokens * 0.5) << "the request ran on after the disconnect";
}

// Defect 5: GET /v1/models/{id}; 'model' is optional.
TEST_F(ReliabilityTest, ModelsRetrieveAndOptionalModel) {
  HttpResult r = server_->Get("/v1/models/" + model_);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["id"], model_);
  EXPECT_EQ(r.json()["object"], "model");
  r = server_->Get("/v1/models/no-such-model");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.json()["error"]["code"], "model_not_found");

  r = server_->PostJson("/v1/chat/completions",
                        {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["model"], model_);
  r = server_->PostJson("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["model"], model_);
}

// Defect 5: CORS for --allowed-origins (preflight without credentials) and --allowed-hosts.
TEST_F(ReliabilityTest, CorsAndAllowedHosts) {
  httplib::Client client("127.0.0.1", server_->port());
  httplib::Headers pre = {{"Origin", "http://app.example"},
                          {"Access-Control-Request-Method", "POST"},
                          {"Access-Control-Request-Headers", "authorization, content-type"}};
  auto res = client.Options("/v1/chat/completions", pre);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 204);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_NE(res->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");

  auto other = client.Options("/v1/chat/completions", {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));

  auto get = client.Get("/v1/models", {{"Origin", "http://app.example"}});
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 200);
  EXPECT_EQ(get->get_header_value("Access-Control-Allow-Origin"), "http://app.example");

  // Host names: loopback names and --allowed-hosts pass, others are 403.
  HttpResult r = server_->Get("/v1/models", {{"Host", "proxy.example"}});
  EXPECT_EQ(r.status, 200) << r.body;
  r = server_->Get("/v1/models", {{"Host", "proxy.example:8443"}});
  EXPECT_EQ(r.status, 200) << r.body;
  r = server_->Get("/v1/models", {{"Host", "attacker.example"}});
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_EQ(r.json()["error"]["code"], "host_not_allowed");
}

// Defect 6: response ids are random, not a counter.
TEST_F(ReliabilityTest, ResponseIdsAreRandom) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    HttpResult r = server_->PostJson("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 1}});
    ASSERT_EQ(r.status, 200) << r.body;
    ids.push_back(r.json()["id"]);
  }
  for (size_t i = 1; i < ids.size(); ++i) {
    ASSERT_EQ(ids[i].size(), ids[0].size());
    // Two ids with the same first 8 random hex digits would be a 2^-32 accident.
    EXPECT_NE(ids[i].substr(5, 8), ids[0].substr(5, 8)) << ids[0] << " vs " << ids[i];
  }
}

// Defect 8: a pool's worth of idle keep-alive connections (here 48 against 4 ready threads)
// cannot starve new connections or /health.
TEST_F(ReliabilityTest, IdleKeepAliveConnectionsDoNotStarveNewOnes) {
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 48; ++i) {
    auto c = std::make_unique<RawConn>(server_->port());
    ASSERT_TRUE(c->ok());
    ASSERT_NE(c->Get("/health").find("\"ok\""), std::string::npos);
    idle.push_back(std::move(c));
  }
  const auto t0 = Clock::now();
  HttpResult h = server_->Get("/health");
  const double health_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(h.status, 200);
  EXPECT_LT(health_s, 5.0);  // was a 10 s client timeout before the fix
  HttpResult r = server_->PostJson("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}});
  EXPECT_EQ(r.status, 200) << r.body;
  // The idle connections are still usable.
  EXPECT_NE(idle.front()->Get("/health").find("\"ok\""), std::string::npos);
}

// Slow clients, with short --read-timeout/--write-timeout/--keep-alive-timeout so each case takes
// seconds.
class SlowClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    ASSERT_TRUE(server_->Start({"--read-timeout", "2", "--write-timeout", "2",
                                "--keep-alive-timeout", "3", "--max-num-seqs", "16"}))
        << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
  }
  // Sends `first`, then one byte every 250 ms until the server answers and closes (or 15 s);
  // returns what was received, and in `*closed_s` when the close came (-1: never).
  static std::string Trickle(const std::string& first, double* closed_s) {
    RawConn c(server_->port());
    EXPECT_TRUE(c.ok());
    const auto t0 = Clock::now();
    EXPECT_TRUE(c.Send(first));
    std::string got;
    *closed_s = -1;
    while (Clock::now() - t0 < 15s) {
      pollfd p{c.fd(), POLLIN, 0};
      if (poll(&p, 1, 250) > 0) {
        char buf[4096];
        const ssize_t n = recv(c.fd(), buf, sizeof(buf), 0);
        if (n <= 0) {
          *closed_s = std::chrono::duration<double>(Clock::now() - t0).count();
          break;
        }
        got.append(buf, static_cast<size_t>(n));
      } else {
        c.Send("X");  // fails once the server has closed; the recv above then sees it
      }
    }
    return got;
  }
  static ServerProcess* server_;
};
ServerProcess* SlowClientTest::server_ = nullptr;

// A client trickling header bytes gets 408 and is disconnected at the header deadline (2 s
// here). Before: a complete request line followed by trickled header bytes got a 400 at the
// deadline and the connection stayed open, so the next trickled bytes started a new request
// with a fresh deadline (the abuse script saw 0 of 50 such clients closed within 40 s).
TEST_F(SlowClientTest, TrickledHeadersGet408AndClose) {
  for (const std::string first : {"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n", "GET /hea"}) {
    const char* what = first.size() > 8 ? "headers" : "a request line";
    double closed_s = 0;
    const std::string got = Trickle(first, &closed_s);
    EXPECT_EQ(got.rfind("HTTP/1.1 408 ", 0), 0u) << first << "\n" << got;
    EXPECT_NE(got.find("\"code\":\"request_timeout\""), std::string::npos) << got;
    EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
    std::printf("[ info ] trickled %s: 408 and closed after %.2f s (deadline 2 s)\n", what,
                closed_s);
    EXPECT_GE(closed_s, 1.9) << got;
    EXPECT_LT(closed_s, 8.0) << "not closed soon after the header deadline\n" << got;
  }
  EXPECT_EQ(server_->Get("/health").status, 200);
}

// An idle keep-alive connection is closed after --keep-alive-timeout (3 s here).
TEST_F(SlowClientTest, KeepAliveTimeoutFlag) {
  RawConn c(server_->port());
  ASSERT_TRUE(c.ok());
  ASSERT_NE(c.Get("/health").find("\"ok\""), std::string::npos);
  const auto t0 = Clock::now();
  std::string rest;
  EXPECT_TRUE(c.ReadToEof(&rest, 15s));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GT(s, 2.0);
  EXPECT_LT(s, 10.0);
}

// A stream whose client never reads: its writes block once the socket buffers are full (the
// server's send buffer is fixed at 256 KiB), and after --write-timeout (2 s here) the server
// gives up, cancels the stream's engine requests (counted as aborted) and closes. Meanwhile
// other requests are answered: nothing the engine or other connections wait for is held by the
// blocked writer. Before: the send buffer autotuned up to 4 MiB and a blocked write waited for
// up to three write timeouts (60 s each), so the stream below either fit in the buffers or
// finished as soon as the client read.
TEST_F(SlowClientTest, UnreadStreamIsDroppedAndDoesNotBlockOthers) {
  const std::string model = ServedModel(*server_);
  const auto aborted = [&] {
    return MetricValue(server_->Metrics(), "request_success_total{model_name=\"" + model +
                                               "\",engine=\"0\",finished_reason=\"abort\"}");
  };
  const double aborted_before = aborted();
  RawConn unread(server_->port(), 4096);
  ASSERT_TRUE(unread.ok());
  // 16 choices x 200 tokens with 5 logprobs each: about 1.5 MB of events.
  const std::string body = Json{{"prompt", {"a", "b", "c", "d"}}, {"n", 4}, {"max_tokens", 200},
                                {"ignore_eos", true}, {"logprobs", 5}, {"stream", true}}.dump();
  ASSERT_TRUE(unread.Send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                          "application/json\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\n\r\n" + body));
  const auto t0 = Clock::now();
  // Served while the unread stream is open (it is queued behind that stream's 16 sequences at
  // most, a second or two of generation here).
  HttpResult r = server_->PostJson("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 4}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(server_->Get("/health").status, 200);
  // Read nothing until the server has given up on the stream (its requests counted as
  // aborted; the buffers fill within the first third of the output, then 2 s), then take what
  // the buffers held. Waiting on the count, not a fixed time, keeps slow (sanitizer) builds from
  // reading early, which would let the stream finish.
  while (aborted() <= aborted_before && Clock::now() - t0 < 60s) std::this_thread::sleep_for(200ms);
  std::printf("[ info ] unread stream given up %.1f s after it was sent\n",
              std::chrono::duration<double>(Clock::now() - t0).count());
  std::string got;
  EXPECT_TRUE(unread.ReadToEof(&got, 10s)) << "the server did not close the unread stream";
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got.substr(0, 200);
  EXPECT_EQ(got.find("[DONE]"), std::string::npos) << "the stream was not cut";
  std::printf("[ info ] unread stream: %zu bytes buffered before the server dropped it\n",
              got.size());
  std::string state;
  EXPECT_TRUE(server_->WaitPoolAtRest(10s, &state)) << state;
  EXPECT_GE(aborted() - aborted_before, 1) << "the stream's engine requests were not cancelled";
}

// Defect 2: a second server on a port in use fails at once with a clear error, exit 2.
TEST_F(ReliabilityTest, SecondBindOnUsedPortFails) {
  std::string out;
  const int code = RunBinary("serve --model-path " + TestModelDir() + " --host 127.0.0.1 --port " +
                                 std::to_string(server_->port()),
                             &out);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("already in use"), std::string::npos) << out;
  EXPECT_EQ(server_->Get("/health").status, 200);
}

// Defect 7: a KV pool larger than the memory available is one line, exit 2, before allocating.
TEST(ReliabilityCli, KvCacheMemoryTooLarge) {
  std::string out;
  int code = RunBinary("serve --model-path " + TestModelDir() + " --port 0 --kv-cache-memory 900GiB",
                       &out, "DEEPHARNESS_MEM_AVAILABLE=8GiB");
  EXPECT_EQ(code, 2) << out;
  EXPECT_EQ(out.rfind("error: --kv-cache-memory 900GiB: ", 0), 0u) << out;
  EXPECT_NE(out.find("8.0 GiB is available"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  code = RunBinary("serve --model-path " + TestModelDir() + " --port 0 --kv-cache-memory lots", &out);
  EXPECT_EQ(code, 2) << out;
  code = RunBinary("serve --model-path " + TestModelDir() + " --port 0 --read-timeout 0", &out);
  EXPECT_EQ(code, 2) << out;
  EXPECT_EQ(out, "error: --read-timeout: expected 1-86400 seconds, got 0\n");
}

// Memory planner: `info --plan` prints the plan without loading; serve refuses a plan that does
// not fit (simulated MemAvailable, and a simulated cgroup limit) before loading, exit 2.
TEST(ReliabilityCli, MemoryPlanner) {
  std::string out;
  int code = RunBinary("info --plan --model-path " + TestModelDir(), &out,
                       "DEEPHARNESS_MEM_AVAILABLE=64GiB");
  ASSERT_EQ(code, 0) << out;
  for (const char* line : {"weights", "kv pool", "activations", "total", "available", "fits"})
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;

  code = RunBinary("serve --model-path " + TestModelDir() + " --port 0", &out,
                   "DEEPHARNESS_MEM_AVAILABLE=16MiB");
  EXPECT_EQ(code, 2) << out;
  EXPECT_EQ(out.rfind("error: ", 0), 0u) << out;
  EXPECT_NE(out.find("needs "), std::string::npos) << out;
  EXPECT_NE(out.find("16.0 MiB available (MemAvailable)"), std::string::npos) << out;
  EXPECT_NE(out.find("try "), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_EQ(out.find("listening"), std::string::npos) << "refused after binding: " << out;

  // A cgroup limit below MemAvailable decides.
  const std::string dir = ::testing::TempDir() + "/dh-cgroup-" + std::to_string(getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir + " && echo 20971520 > " + dir +
                         "/memory.max && echo 4194304 > " + dir + "/memory.current").c_str()),
            0);
  code = RunBinary("serve --model-path " + TestModelDir() + " --port 0", &out,
                   "DEEPHARNESS_MEM_AVAILABLE=64GiB DEEPHARNESS_CGROUP_DIR=" + dir);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("16.0 MiB available (the cgroup memory limit)"), std::string::npos) << out;
  std::system(("rm -rf " + dir).c_str());
}

// Defect 1: idle keep-alive connections do not hold shutdown beyond --shutdown-timeout.
TEST(ReliabilityShutdown, IdleKeepAliveDoesNotDelayShutdown) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--shutdown-timeout", "2"})) << server.log();
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 4; ++i) {
    auto c = std::make_unique<RawConn>(server.port());
    ASSERT_TRUE(c->ok());
    ASSERT_NE(c->Get("/v1/models").find("\"list\""), std::string::npos);
    idle.push_back(std::move(c));
  }
  const auto t0 = Clock::now();
  const int code = server.Stop(SIGTERM, std::chrono::seconds(60));
  const double stop_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(code, 0) << server.log();
  std::printf("[ info ] stopped %.2f s after SIGTERM with 4 idle keep-alive connections\n", stop_s);
  // Was ~30 s (the keep-alive timeout); 2 s of drain plus slack for a loaded machine.
  EXPECT_LT(stop_s, 10.0) << server.log();
}

}  // namespace
}  // namespace dh::e2e
