// The connection layer under OpenAIServer. cpp-httplib 0.11 parses and routes requests, but its
// own per-connection loop (a) busy-polls idle keep-alive connections and cannot be woken when
// the server stops (one idle client held shutdown for the whole keep-alive timeout), and (b)
// runs on a fixed thread pool, so a pool's worth of idle keep-alive connections starved new
// connections and /health. This layer replaces both (docs/server.md, "Connections"):
//
// * ConnectionServer overrides httplib::Server::process_and_close_socket (virtual) with its own
//   keep-alive loop: idle waits are a poll() on the socket and a stop eventfd, so Stop() ends
//   every idle connection at once; reads have a per-request header deadline (slow headers: a
//   client that misses it gets 408 and the connection is closed, so trickling cannot buy a new
//   deadline) and a body cap that also covers chunked bodies; one write must complete within
//   the write timeout (a client that stops reading is dropped, which cancels its stream).
// * ElasticTaskQueue keeps `core` threads and adds one thread per connection beyond that (up to
//   `max_threads`), so idle keep-alive connections never block a new connection; threads beyond
//   the core exit after a short idle period.
// * Connections beyond `max_connections` get a 503 and are closed.
//
// The connection being served is reachable from its handler thread through
// CurrentConnection(): the pre-routing hook sets the body cap, the error handler learns that a
// body was cut (413), and non-streaming handlers poll ClientGone() to cancel generation.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

namespace dh::server {

struct ConnectionLimits {
  std::chrono::milliseconds read_timeout{30000};   // one body read, and the whole header block
  std::chrono::milliseconds write_timeout{60000};  // one write, however many send() calls
  std::chrono::milliseconds keep_alive_timeout{5000};  // idle time between requests
  int max_requests_per_connection = 1000;
  int max_connections = 4096;  // open at once; more get 503 + close
  // SO_SNDBUF of every connection (the kernel doubles it for its bookkeeping). Fixed instead of
  // autotuned (up to net.ipv4.tcp_wmem's 4 MiB): what a client that stops reading can make the
  // server hold is this, and its stream then blocks and is dropped after the write timeout.
  int send_buffer_bytes = 256 << 10;
};

// State of one accepted connection, owned by the thread that serves it.
class Connection {
 public:
  Connection(int fd, int stop_fd) : fd_(fd), stop_fd_(stop_fd) {}
  int fd() const { return fd_; }

  // Caps what may still be read for the current request's body (chunked bodies included).
  void LimitBody(size_t max_bytes) {
    body_limit_ = true;
    body_left_ = max_bytes;
    headers_done_ = true;
  }
  bool body_too_large() const { return body_too_large_; }
  // The headers are in: reads from now on each get the full read timeout.
  void MarkHeadersDone() { headers_done_ = true; }
  // True when the peer has closed (or reset) its side; data waiting to be read is not a close.
  bool ClientGone() const;
  // The current request's header block did not arrive within the read timeout (answered 408,
  // then the connection is closed).
  bool header_timed_out() const { return header_timed_out_; }

 private:
  friend class ConnectionServer;
  friend class ConnectionStream;
  void BeginRequest(std::chrono::milliseconds header_budget);

  int fd_;
  int stop_fd_;
  std::string buffer_;  // read ahead, not yet consumed
  size_t buffer_pos_ = 0;
  bool headers_done_ = false;
  std::chrono::steady_clock::time_point header_deadline_{};
  bool body_limit_ = false;
  size_t body_left_ = 0;
  bool body_too_large_ = false;
  bool header_timed_out_ = false;
  bool read_failed_ = false;  // a read of this request failed: the stream position is lost
  size_t written_ = 0;        // bytes sent for the current request
};

// The Connection being served on this thread (nullptr outside a handler).
Connection* CurrentConnection();

class ElasticTaskQueue : public httplib::TaskQueue {
 public:
  ElasticTaskQueue(int core, int max_threads);
  ~ElasticTaskQueue() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;
  int threads() const;

 private:
  void Worker(bool core);
  const int core_;
  const int max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  int live_ = 0;
  bool shutdown_ = false;
};

class ConnectionServer : public httplib::Server {
 public:
  explicit ConnectionServer(ConnectionLimits limits);
  ~ConnectionServer() override;
  // Wakes every idle connection and makes open ones finish after their current request.
  // Call before httplib::Server::stop().
  void StopConnections();
  int open_connections() const { return open_.load(); }
  // Requests being read, handled or answered now. A handler returns before httplib writes its
  // response, so this reaches 0 only once the answers are on the wire.
  int busy_requests() const { return busy_.load(); }

 private:
  bool process_and_close_socket(int sock) override;
  ConnectionLimits limits_;
  int stop_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_{0};
  std::atomic<int> busy_{0};
};

}  // namespace dh::server
