// ConnectionServer / ElasticTaskQueue: see http_connection.h.
#include "server/http_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "server/api_error.h"

namespace dh::server {

namespace {

using Clock = std::chrono::steady_clock;

thread_local Connection* current_connection = nullptr;

// Waits until `fd` has `events` or `deadline` passes; false on timeout (then *timed_out is set),
// on the stop fd and on errors. POLLHUP/POLLERR count as ready (the next read/write reports
// them).
bool WaitFd(int fd, short events, int stop_fd, Clock::time_point deadline,
            bool* timed_out = nullptr) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      if (timed_out) *timed_out = true;
      return false;
    }
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int wait_ms = static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
    const int n = ::poll(fds, stop_fd >= 0 ? 2 : 1, wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) continue;  // re-check the deadline
    if (stop_fd >= 0 && (fds[1].revents & POLLIN)) return false;
    if (fds[0].revents) return true;
  }
}

std::string SockAddrIp(const sockaddr_storage& addr, int* port) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    *port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    *port = ntohs(a->sin6_port);
  }
  return text;
}

// After an error answer (413, 408) to a client that may still be sending: stop sending, then
// read and drop what arrives for a moment, so the client sees the answer instead of a reset.
void LingerClose(int sock, int stop_fd) {
  ::shutdown(sock, SHUT_WR);
  const auto until = Clock::now() + std::chrono::seconds(1);
  char sink[16384];
  size_t dropped = 0;
  while (dropped < (16u << 20) && WaitFd(sock, POLLIN, stop_fd, until)) {
    const ssize_t n = ::recv(sock, sink, sizeof(sink), 0);
    if (n <= 0) break;
    dropped += static_cast<size_t>(n);
  }
}

}  // namespace

// httplib's parser and writer go through this; reads are buffered per connection (pipelined
// bytes survive between requests).
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(Connection& conn, const ConnectionLimits& limits)
      : conn_(conn), limits_(limits) {}

  bool is_readable() const override {
    if (conn_.buffer_pos_ < conn_.buffer_.size()) return true;
    return WaitFd(conn_.fd_, POLLIN, conn_.stop_fd_, ReadDeadline());
  }
  // Whether the connection can still take a response: not stopped, the peer not gone. It does
  // not wait for buffer space (write() does, within the write timeout): SSE jobs call it between
  // engine polls, and a full buffer must not block them there.
  bool is_writable() const override {
    if (conn_.stop_fd_ >= 0) {
      pollfd p{conn_.stop_fd_, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) return false;
    }
    return !conn_.ClientGone();
  }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (conn_.buffer_pos_ >= conn_.buffer_.size()) {
      conn_.buffer_.clear();
      conn_.buffer_pos_ = 0;
      bool timed_out = false;
      if (!WaitFd(conn_.fd_, POLLIN, conn_.stop_fd_, ReadDeadline(), &timed_out)) {
        conn_.read_failed_ = true;
        if (timed_out && !conn_.headers_done_) conn_.header_timed_out_ = true;
        return -1;
      }
      char chunk[16384];
      ssize_t n;
      do {
        n = ::recv(conn_.fd_, chunk, sizeof(chunk), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) {
        conn_.read_failed_ = true;
        return n;
      }
      conn_.buffer_.assign(chunk, static_cast<size_t>(n));
    }
    size_t n = std::min(size, conn_.buffer_.size() - conn_.buffer_pos_);
    if (conn_.body_limit_) {
      if (n > conn_.body_left_) {
        conn_.body_too_large_ = true;
        return -1;
      }
      conn_.body_left_ -= n;
    }
    std::memcpy(ptr, conn_.buffer_.data() + conn_.buffer_pos_, n);
    conn_.buffer_pos_ += n;
    return static_cast<ssize_t>(n);
  }

  // All of `size` within one write timeout, or -1. Non-blocking sends: a blocking send() waits
  // for the whole buffer under SO_SNDTIMEO, and every partial send restarted the wait, so a
  // client that stopped reading held its thread (and its stream's engine requests) for several
  // write timeouts.
  ssize_t write(const char* ptr, size_t size) override {
    const auto deadline = Clock::now() + limits_.write_timeout;
    size_t sent = 0;
    while (sent < size) {
      if (!WaitFd(conn_.fd_, POLLOUT, conn_.stop_fd_, deadline)) return -1;
      const ssize_t n = ::send(conn_.fd_, ptr + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        return -1;
      }
      sent += static_cast<size_t>(n);
    }
    conn_.written_ += size;
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getpeername(conn_.fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      ip = SockAddrIp(addr, &port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getsockname(conn_.fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      ip = SockAddrIp(addr, &port);
  }
  ::socket_t socket() const override { return conn_.fd_; }

 private:
  // Until the request's headers are in, every read shares one deadline (a client trickling
  // header bytes cannot hold the connection longer than --read-timeout); then per read.
  Clock::time_point ReadDeadline() const {
    const auto per_read = Clock::now() + limits_.read_timeout;
    return conn_.headers_done_ ? per_read : std::min(per_read, conn_.header_deadline_);
  }

  Connection& conn_;
  const ConnectionLimits& limits_;
};

void Connection::BeginRequest(std::chrono::milliseconds header_budget) {
  headers_done_ = false;
  header_deadline_ = Clock::now() + header_budget;
  body_limit_ = false;
  body_left_ = 0;
  body_too_large_ = false;
  header_timed_out_ = false;
  read_failed_ = false;
  written_ = 0;
}

bool Connection::ClientGone() const {
  pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char byte;
    const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

Connection* CurrentConnection() { return current_connection; }

// ---- ElasticTaskQueue ----

ElasticTaskQueue::ElasticTaskQueue(int core, int max_threads)
    : core_(std::max(1, core)), max_threads_(std::max(core_, max_threads)) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < core_; ++i) {
    ++live_;
    std::thread([this] { Worker(true); }).detach();
  }
}

ElasticTaskQueue::~ElasticTaskQueue() { shutdown(); }

void ElasticTaskQueue::enqueue(std::function<void()> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if (shutdown_) return;
  jobs_.push_back(std::move(fn));
  // Every queued job needs a free thread now: a connection may hold its thread for as long as
  // the client keeps it open.
  if (static_cast<int>(jobs_.size()) > idle_ && live_ < max_threads_) {
    try {
      std::thread([this] { Worker(false); }).detach();
      ++live_;
    } catch (const std::system_error&) {
      // Out of threads: the job waits for a free one.
    }
  }
  lock.unlock();
  cv_.notify_one();
}

void ElasticTaskQueue::Worker(bool core) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    ++idle_;
    bool has_job;
    if (core) {
      cv_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
      has_job = !jobs_.empty();
    } else {
      has_job = cv_.wait_for(lock, std::chrono::seconds(10),
                             [&] { return !jobs_.empty() || shutdown_; }) &&
                !jobs_.empty();
    }
    --idle_;
    if (!has_job) break;
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fn();
    fn = nullptr;
    lock.lock();
  }
  --live_;
  cv_.notify_all();
}

void ElasticTaskQueue::shutdown() {
  std::unique_lock<std::mutex> lock(mu_);
  shutdown_ = true;
  cv_.notify_all();
  cv_.wait(lock, [&] { return live_ == 0; });
}

int ElasticTaskQueue::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

// ---- ConnectionServer ----

ConnectionServer::ConnectionServer(ConnectionLimits limits) : limits_(limits) {
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

ConnectionServer::~ConnectionServer() {
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void ConnectionServer::StopConnections() {
  stopping_.store(true);
  const uint64_t one = 1;
  if (stop_fd_ >= 0) {
    [[maybe_unused]] ssize_t n = ::write(stop_fd_, &one, sizeof(one));
  }
}

bool ConnectionServer::process_and_close_socket(int sock) {
  struct Closer {
    int fd;
    std::atomic<int>& open;
    ~Closer() {
      ::shutdown(fd, SHUT_RDWR);
      ::close(fd);
      open.fetch_sub(1);
    }
  } closer{sock, open_};
  if (open_.fetch_add(1) >= limits_.max_connections) {
    static const std::string kBody =
        "{\"error\":{\"message\":\"Too many open connections\",\"type\":\"server_error\","
        "\"param\":null,\"code\":\"too_many_connections\"}}";
    static const std::string kBusy =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
        std::to_string(kBody.size()) + "\r\n\r\n" + kBody;
    [[maybe_unused]] ssize_t n = ::send(sock, kBusy.data(), kBusy.size(), MSG_NOSIGNAL);
    return false;
  }

  if (limits_.send_buffer_bytes > 0) {
    const int bytes = limits_.send_buffer_bytes;
    setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  }
  Connection conn(sock, stop_fd_);
  ConnectionStream stream(conn, limits_);
  current_connection = &conn;
  bool ok = true;
  for (int served = 0; served < limits_.max_requests_per_connection; ++served) {
    if (stopping_.load()) break;
    if (conn.buffer_pos_ >= conn.buffer_.size()) {
      // Idle between requests: sleep in poll, woken by data, a close or StopConnections.
      if (!WaitFd(sock, POLLIN, stop_fd_, Clock::now() + limits_.keep_alive_timeout)) break;
      if (conn.ClientGone()) break;
    }
    conn.BeginRequest(limits_.read_timeout);
    const bool last = served + 1 == limits_.max_requests_per_connection || stopping_.load();
    bool closed = false;
    busy_.fetch_add(1);
    ok = process_request(stream, last, closed, nullptr);
    busy_.fetch_sub(1);
    if (conn.header_timed_out()) {
      // The header deadline is per connection, not renewable: answering 400 and waiting for
      // the next request let a trickling client start over with a fresh deadline. httplib
      // answered (through the error handler: 408) when the request line was complete; when it
      // was not, nothing was sent yet.
      if (conn.written_ == 0) {
        static const std::string kBody = ErrorBody(RequestTimeout(
            std::chrono::duration_cast<std::chrono::seconds>(limits_.read_timeout).count()));
        static const std::string kTimeout =
            "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            "Connection: close\r\nContent-Length: " +
            std::to_string(kBody.size()) + "\r\n\r\n" + kBody;
        [[maybe_unused]] ssize_t n =
            ::send(sock, kTimeout.data(), kTimeout.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      LingerClose(sock, stop_fd_);
      break;
    }
    if (conn.body_too_large()) {
      LingerClose(sock, stop_fd_);
      break;
    }
    // A failed read leaves the request stream at an unknown position: no keep-alive after it.
    if (!ok || closed || conn.read_failed_) break;
  }
  current_connection = nullptr;
  return ok;
}

}  // namespace dh::server
