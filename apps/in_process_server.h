// A model loaded in this process and served on a private 127.0.0.1 port by our own OpenAI server,
// so offline tools (compare) measure a local model through the very client code they use for a
// remote deployment.
#pragma once

#include <memory>
#include <string>

#include "apps/model_options.h"
#include "base/status.h"

namespace dh::app {

class InProcessServer {
 public:
  ~InProcessServer();
  // Loads the model of `options`, starts an engine (at most `max_num_seqs` sequences at once,
  // which also bounds the KV pool it sizes) and serves it on 127.0.0.1:<free port> under
  // `served_name`.
  static Result<std::unique_ptr<InProcessServer>> Start(const ModelOptions& options,
                                                         const std::string& served_name,
                                                         int max_num_seqs, int http_threads);
  std::string url() const;
  void Stop();

 private:
  InProcessServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dh::app
