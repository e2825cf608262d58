// ChildServer: fork + exec of this binary's `serve --port 0`, its "ready on" log line read for
// the port, SIGTERM to stop.
#include "apps/child_server.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include "apps/command.h"
#include "apps/spawn.h"

namespace dh::app {
namespace {

// The port in the child's "ready on http://127.0.0.1:PORT" log line; 0 while there is none.
int ReadyPort(const std::string& log_path) {
  std::ifstream in(log_path);
  const std::string mark = "ready on http://127.0.0.1:";
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find(mark);
    if (at == std::string::npos) continue;
    int port = 0;
    for (size_t i = at + mark.size(); i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i)
      port = port * 10 + (line[i] - '0');
    if (port > 0 && port < 65536) return port;
  }
  return 0;
}

// The last non-empty line of the child's log, for an error message.
std::string LastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

}  // namespace

Result<std::unique_ptr<ChildServer>> ChildServer::Start(const ModelOptions& o,
                                                        const std::string& served_name,
                                                        int max_num_seqs, int ready_timeout_s) {
  std::unique_ptr<ChildServer> s(new ChildServer());
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return Internal("cannot read /proc/self/exe to start a serve process");
  std::vector<std::string> args = {std::string(exe, static_cast<size_t>(n)), "serve",
                                   "--model-path", o.model_path, "--device", o.device,
                                   "--tp-size", std::to_string(o.tp_size),
                                   "--host", "127.0.0.1", "--port", "0",
                                   "--served-model-name", served_name,
                                   "--max-num-seqs", std::to_string(max_num_seqs)};
  if (!o.dtype.empty()) args.insert(args.end(), {"--dtype", o.dtype});
  if (!o.quant.empty()) args.insert(args.end(), {"--quant", o.quant});
  if (o.threads > 0) args.insert(args.end(), {"--threads", std::to_string(o.threads)});
  if (o.no_compile_cache) args.push_back("--no-compile-cache");
  char log_template[] = "/tmp/deepharness-child-serve-XXXXXX";
  const int log_fd = ::mkstemp(log_template);
  if (log_fd < 0) return IoError("cannot create a log file for the serve process");
  s->log_path_ = log_template;
  Result<pid_t> started = SpawnProcess(args, log_fd);
  ::close(log_fd);
  if (!started.ok()) return started.status();
  const pid_t pid = *started;
  s->pid_ = pid;

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(ready_timeout_s);
  while (true) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      s->pid_ = -1;
      const std::string why = LastLine(s->log_path_);
      return IoError("the serve process exited ({}) before it was ready{}{} (log: {})",
                         WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                                           : "signal " + std::to_string(WTERMSIG(status)),
                         why.empty() ? "" : ": ", why, s->log_path_);
    }
    if ((s->port_ = ReadyPort(s->log_path_)) > 0) break;
    if (std::chrono::steady_clock::now() > deadline)
      return IoError("the serve process was not ready after {} s (log: {})", ready_timeout_s,
                         s->log_path_);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return s;
}

void ChildServer::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 300; ++i) {  // 30 s for a drain
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  if (!log_path_.empty()) ::unlink(log_path_.c_str());
  log_path_.clear();
}

ChildServer::~ChildServer() { Stop(); }

}  // namespace dh::app
