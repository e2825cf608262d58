// A model served by a child `deepharness serve` process on a private 127.0.0.1 port: how offline
// tools (compare) run a local target with tensor parallelism, which needs its own mpirun job
// (serve starts it, apps/serve_parallel.h). The child's log goes to a temporary file, named in
// the error when the child fails to come up.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "apps/model_options.h"
#include "base/status.h"

namespace dh::app {

class ChildServer {
 public:
  ~ChildServer();
  // Starts `serve` with the model flags of `options` (model path, device, dtype, quant, threads,
  // tp size) on a port the child picks, and waits up to `ready_timeout_s` for it to log ready.
  static Result<std::unique_ptr<ChildServer>> Start(const ModelOptions& options,
                                                    const std::string& served_name,
                                                    int max_num_seqs, int ready_timeout_s);
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // SIGTERM to the child (it drains and stops its ranks), then waits; SIGKILL after 30 s.
  void Stop();

 private:
  ChildServer() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
};

}  // namespace dh::app
