// Server process management, HTTP helpers and the tiny generated test model.
#include "server_fixture.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace dh::e2e {
namespace fs = std::filesystem;
namespace {

// Writes a tiny random LlamaForCausalLM (f32 safetensors) whose vocabulary matches the
// shakespeare-v3 tokenizer files copied next to it.
std::string GenerateTinyModel(const fs::path& tokenizer_dir) {
  const fs::path dir = fs::temp_directory_path() / ("dh-e2e-model-" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    if (fs::exists(tokenizer_dir / f))
      fs::copy_file(tokenizer_dir / f, dir / f, fs::copy_options::overwrite_existing);
  }
  Json tok = Json::parse(std::ifstream(tokenizer_dir / "tokenizer.json"), nullptr, false);
  int64_t vocab = 0;
  if (!tok.is_discarded()) {
    vocab = static_cast<int64_t>(tok["model"]["vocab"].size());
    for (const Json& a : tok["added_tokens"]) vocab = std::max<int64_t>(vocab, a["id"].get<int64_t>() + 1);
  }
  const int64_t hidden = 64, layers = 2, heads = 4, kv_heads = 2, inter = 128;
  const int64_t head_dim = hidden / heads;
  Json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"hidden_size", hidden},
                 {"intermediate_size", inter},
                 {"num_hidden_layers", layers},
                 {"num_attention_heads", heads},
                 {"num_key_value_heads", kv_heads},
                 {"vocab_size", vocab},
                 {"max_position_embeddings", 256},
                 {"rms_norm_eps", 1e-5},
                 {"rope_theta", 10000.0},
                 {"hidden_act", "silu"},
                 {"tie_word_embeddings", true},
                 {"bos_token_id", 0},
                 {"eos_token_id", 1},
                 {"torch_dtype", "float32"}};
  std::ofstream(dir / "config.json") << config.dump(2);

  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  tensors.push_back({"model.embed_tokens.weight", {vocab, hidden}});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    tensors.push_back({p + ".input_layernorm.weight", {hidden}});
    tensors.push_back({p + ".post_attention_layernorm.weight", {hidden}});
    tensors.push_back({p + ".self_attn.q_proj.weight", {heads * head_dim, hidden}});
    tensors.push_back({p + ".self_attn.k_proj.weight", {kv_heads * head_dim, hidden}});
    tensors.push_back({p + ".self_attn.v_proj.weight", {kv_heads * head_dim, hidden}});
    tensors.push_back({p + ".self_attn.o_proj.weight", {hidden, heads * head_dim}});
    tensors.push_back({p + ".mlp.gate_proj.weight", {inter, hidden}});
    tensors.push_back({p + ".mlp.up_proj.weight", {inter, hidden}});
    tensors.push_back({p + ".mlp.down_proj.weight", {hidden, inter}});
  }
  tensors.push_back({"model.norm.weight", {hidden}});

  Json header = Json::object();
  std::vector<float> data;
  std::mt19937 rng(1234);
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t begin = data.size() * sizeof(float);
    const bool is_norm = shape.size() == 1;
    std::normal_distribution<float> normal(0.0f, is_norm ? 0.0f : 1.0f / std::sqrt(float(shape.back())));
    for (int64_t i = 0; i < n; ++i) data.push_back(is_norm ? 1.0f : normal(rng));
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size() * sizeof(float)}}};
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  static const std::string keep = dir.string();
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(keep, ec);
  });
  return dir.string();
}

}  // namespace

const std::string& TestModelDir() {
  static const std::string dir = [] {
    const fs::path embedded = fs::path(DH_SOURCE_DIR) / "models" / "shakespeare-v3";
    if (fs::exists(embedded / "config.json") && fs::exists(embedded / "model.safetensors"))
      return embedded.string();
    return GenerateTinyModel(embedded);
  }();
  return dir;
}

RefusedPort::RefusedPort() {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port_ = ntohs(addr.sin_port);
  }
}

RefusedPort::~RefusedPort() {
  if (fd_ >= 0) close(fd_);
}

std::string HttpResult::header(const std::string& key) const {
  auto it = headers.find(key);
  return it == headers.end() ? std::string() : it->second;
}

ServerProcess::~ServerProcess() {
  if (running()) Stop(SIGKILL, std::chrono::seconds(10));
  RemoveLog();
}

void ServerProcess::RemoveLog() {
  if (log_path_.empty()) return;
  std::error_code ec;
  fs::remove(log_path_, ec);
  log_path_.clear();
}

namespace {

// The port in the server's "listening on http://HOST:PORT" line; 0 while it has not written it.
int ListeningPort(const std::string& log) {
  const std::string mark = "listening on http://";
  const size_t at = log.find(mark);
  if (at == std::string::npos) return 0;
  const size_t end = log.find_first_of(" \n", at + mark.size());
  if (end == std::string::npos) return 0;
  const size_t colon = log.rfind(':', end);
  if (colon == std::string::npos || colon < at + mark.size()) return 0;
  int port = 0;
  for (size_t i = colon + 1; i < end; ++i) {
    if (log[i] < '0' || log[i] > '9') return 0;
    port = port * 10 + (log[i] - '0');
    if (port > 65535) return 0;
  }
  return port;
}

}  // namespace

// The server binds port 0 itself and says which port it got: a port picked here and passed in
// could be taken by another test's server in between, and /health would then answer from that one.
bool ServerProcess::Start(const std::vector<std::string>& extra, std::chrono::seconds timeout) {
  port_ = 0;
  RemoveLog();
  // A fresh file, created here before the fork: a name made of the pid and a counter could be
  // a stale log of an earlier process with the same pid (pids wrap at 32768 and nothing removed
  // the logs), and its old port was read before the child truncated the file.
  std::string name = (fs::temp_directory_path() / "dh-e2e-server-XXXXXX.log").string();
  const int fd = mkostemps(name.data(), 4, O_CLOEXEC);
  if (fd < 0) return false;
  log_path_ = name;
  std::vector<std::string> args = {DH_BINARY, "serve", "--model-path", TestModelDir(),
                                   "--port", "0", "--host", "127.0.0.1",
                                   "--kv-cache-memory", "128MiB"};
  args.insert(args.end(), extra.begin(), extra.end());
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fd);
  if (pid_ < 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!running()) return false;
    if (port_ == 0) port_ = ListeningPort(log());
    if (port_ != 0 && Get("/health").status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

bool ServerProcess::running() const {
  if (pid_ <= 0) return false;
  int status = 0;
  return waitpid(pid_, &status, WNOHANG) == 0;
}

int ServerProcess::Stop(int sig, std::chrono::seconds timeout) {
  if (pid_ <= 0) return -1;
  kill(pid_, sig);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return -1;
}

std::string ServerProcess::log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

httplib::Headers ServerProcess::Auth(httplib::Headers headers) const {
  if (!api_key_.empty() && headers.find("Authorization") == headers.end())
    headers.emplace("Authorization", "Bearer " + api_key_);
  return headers;
}

HttpResult ServerProcess::Get(const std::string& path, const httplib::Headers& headers) const {
  httplib::Client client("127.0.0.1", port_);
  client.set_connection_timeout(5);
  client.set_read_timeout(120);
  HttpResult r;
  auto res = client.Get(path.c_str(), Auth(headers));
  if (!res) return r;
  r.status = res->status;
  r.body = res->body;
  r.headers = res->headers;
  return r;
}

HttpResult ServerProcess::Post(const std::string& path, const std::string& body,
                               const httplib::Headers& headers) const {
  httplib::Client client("127.0.0.1", port_);
  client.set_connection_timeout(5);
  client.set_read_timeout(120);
  HttpResult r;
  auto res = client.Post(path.c_str(), Auth(headers), body, "application/json");
  if (!res) return r;
  r.status = res->status;
  r.body = res->body;
  r.headers = res->headers;
  return r;
}

std::vector<std::string> ServerProcess::StreamEvents(const std::string& path, const Json& body,
                                                     int* status) const {
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(120);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = Auth({});
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  std::string buffer;
  std::vector<std::string> events;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    size_t pos;
    while ((pos = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, pos);
      buffer.erase(0, pos + 2);
      if (event.rfind("data: ", 0) == 0) events.push_back(event.substr(6));
    }
    return true;
  };
  auto res = client.send(req);
  if (status) *status = res ? res->status : 0;
  if (res && res->status != 200) events.push_back(buffer);
  return events;
}

std::map<std::string, double> ServerProcess::Metrics(const std::string& prefix) const {
  std::map<std::string, double> out;
  HttpResult r = Get("/metrics");
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.rfind(prefix, 0) != 0) continue;
    size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    out[line.substr(prefix.size(), space - prefix.size())] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

double MetricValue(const std::map<std::string, double>& metrics, const std::string& name) {
  for (const auto& [key, value] : metrics) {
    if (key == name || key.rfind(name + "{", 0) == 0) return value;
  }
  return -1;
}

bool ServerProcess::WaitPoolAtRest(std::chrono::milliseconds timeout, std::string* last) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto m = Metrics();
    const double total = MetricValue(m, "kv_cache_blocks_total");
    const double free_blocks = MetricValue(m, "kv_cache_blocks_free");
    const double running = MetricValue(m, "num_requests_running");
    const double waiting = MetricValue(m, "num_requests_waiting");
    if (last) {
      *last = "total=" + std::to_string(total) + " free=" + std::to_string(free_blocks) +
              " running=" + std::to_string(running) + " waiting=" + std::to_string(waiting);
    }
    if (total > 0 && free_blocks == total && running == 0 && waiting == 0) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string ServedModel(const ServerProcess& server) {
  Json models = server.Get("/v1/models").json();
  if (models.is_discarded() || !models.contains("data") || models["data"].empty()) return "";
  return models["data"][0]["id"].get<std::string>();
}

CliRun RunCli(const std::string& args, const std::string& env) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(::getpid());
  const std::filesystem::path out = dir / ("dh_cli_out_" + tag), err = dir / ("dh_cli_err_" + tag);
  const std::string cmd =
      (env.empty() ? "" : env + " ") + std::string(DH_BINARY) + " " + args + " >" + out.string() +
      " 2>" + err.string();
  CliRun r;
  const int status = std::system(cmd.c_str());
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  std::stringstream o, e;
  o << std::ifstream(out).rdbuf();
  e << std::ifstream(err).rdbuf();
  r.out = o.str();
  r.err = e.str();
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

ShellRun Shell(const std::string& command, bool capture_stderr) {
  ShellRun r;
  FILE* p = popen((capture_stderr ? command + " 2>&1" : command).c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string RunShell(const std::string& command, int* status, bool capture_stderr) {
  ShellRun r = Shell(command, capture_stderr);
  if (status != nullptr) *status = r.status;
  return std::move(r.out);
}

}  // namespace dh::e2e
