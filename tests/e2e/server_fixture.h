// End-to-end fixture: runs the real `deepharness serve` binary on 127.0.0.1 with a free port and
// talks to it over HTTP. The model is models/shakespeare-v3 when its weights exist; otherwise a
// tiny random Llama model is generated (once per test binary) next to a copy of that folder's
// tokenizer files, so the tests run before the trained model lands.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace dh::e2e {

using Json = nlohmann::json;

// The model directory the e2e tests serve (generated on first use when needed).
const std::string& TestModelDir();
// A loopback TCP port bound by this process but not listening, held while the object lives: a
// connection to it is refused, and no other process can take the port meanwhile (a port found
// free and closed again could be taken by another test's server before it is used).
class RefusedPort {
 public:
  RefusedPort();
  ~RefusedPort();
  RefusedPort(const RefusedPort&) = delete;
  RefusedPort& operator=(const RefusedPort&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// One run of the binary: `deepharness <args>` through the shell (arguments hold no spaces or
// quotes), with its exit code and what it wrote to stdout and stderr; `env` (e.g. "DH_X=1")
// goes before it on the command line.
struct CliRun {
  int exit_code = -1;
  std::string out, err;
};
CliRun RunCli(const std::string& args, const std::string& env = "");

// One shell command (`/bin/sh -c command`): its exit status (-1 when it did not exit normally) and
// what it wrote to stdout, with stderr too when capture_stderr is set.
struct ShellRun {
  int status = -1;
  std::string out;
};
ShellRun Shell(const std::string& command, bool capture_stderr = false);
// Shell(command).out, the status through *status when given.
std::string RunShell(const std::string& command, int* status = nullptr,
                     bool capture_stderr = false);

struct HttpResult {
  int status = 0;  // 0: connection failed
  std::string body;
  httplib::Headers headers;
  Json json() const { return Json::parse(body, nullptr, false); }
  std::string header(const std::string& key) const;
};

class ServerProcess {
 public:
  ServerProcess() = default;
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Starts `deepharness serve --model-path <TestModelDir()> --port 0 <extra...>`, reads the port
  // it bound from its log and waits until /health there is 200. Returns false (with log()) when
  // it does not come up in `timeout`.
  bool Start(const std::vector<std::string>& extra = {},
             std::chrono::seconds timeout = std::chrono::seconds(120));
  // Sends `sig`, waits up to `timeout` and returns the exit status (-1: still running, killed).
  int Stop(int sig = 15, std::chrono::seconds timeout = std::chrono::seconds(60));
  bool running() const;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const;  // the server's stderr so far (kept until the next Start or the end)
  const std::string& api_key() const { return api_key_; }
  void set_api_key(std::string key) { api_key_ = std::move(key); }

  HttpResult Get(const std::string& path, const httplib::Headers& headers = {}) const;
  HttpResult Post(const std::string& path, const std::string& body,
                  const httplib::Headers& headers = {}) const;
  HttpResult PostJson(const std::string& path, const Json& body) const {
    return Post(path, body.dump());
  }
  // POSTs a streaming request and returns every `data:` payload in order.
  std::vector<std::string> StreamEvents(const std::string& path, const Json& body,
                                        int* status = nullptr) const;

  // Parses /metrics into name{labels} -> value (metric names without the prefix).
  std::map<std::string, double> Metrics(const std::string& prefix = "deepharness:") const;
  // Polls /metrics until the pool is at rest (free == total, nothing running or waiting).
  bool WaitPoolAtRest(std::chrono::milliseconds timeout, std::string* last = nullptr) const;

 private:
  httplib::Headers Auth(httplib::Headers headers) const;
  void RemoveLog();
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
  std::string api_key_;
};

// The first served model name.
std::string ServedModel(const ServerProcess& server);
// Looks up `name{...}` (ignoring labels) in a Metrics() map; -1 when absent.
double MetricValue(const std::map<std::string, double>& metrics, const std::string& name);

}  // namespace dh::e2e
