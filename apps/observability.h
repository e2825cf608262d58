// The observability flags of the model commands (docs/observability.md): --trace-out and
// --trace-max-events (Chrome trace JSON), --dump-tensors / --dump-filter / --dump-steps (taps as
// .npy), --plugin (op plugins). LoadFromOptions wraps the backend and starts an Observability
// session from them; the session writes its files when the LoadedModel goes away.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/plugin_backend.h"
#include "backend/tracing_backend.h"
#include "base/status.h"
#include "base/trace.h"
#include "model/routing_counter.h"
#include "model/tensor_dump.h"

namespace dh::app {

struct ObservabilityOptions {
  std::string trace_out;
  int64_t trace_max_events = 1'000'000;
  std::string dump_dir, dump_filter = "*", dump_steps;
  std::vector<std::string> plugins;
  bool profile = false;  // `profile`: op totals without a trace file
  bool tracing() const { return !trace_out.empty() || profile; }
};

enum ObservabilityFlags : unsigned { kTraceFlags = 1, kDumpFlags = 2, kPluginFlags = 4 };
void AddObservabilityOptions(CLI::App* sub, ObservabilityOptions* o, unsigned flags);

// One command's tracer and tensor dumper, installed process-wide while it lives. Files go to
// rank 0's paths; another rank's trace gets ".rank<r>" before ".json", and only rank 0 dumps.
class Observability {
 public:
  // Checks the options, opens what it will write (so a bad path fails before the model loads)
  // and installs the tracer and the tap sink.
  static Result<std::unique_ptr<Observability>> Start(const ObservabilityOptions& o, int rank,
                                                      bool quiet);
  // Uninstalls, writes the trace and finishes the dump, with one summary line each on stderr
  // (and one per plugin op: its calls).
  ~Observability();
  Observability(const Observability&) = delete;
  Observability& operator=(const Observability&) = delete;

  // Writes the files now (the destructor's work); the first error.
  Status Finish();
  void set_tracing_backend(TracingBackend* b) { tracing_backend_ = b; }
  // serve --op-metrics (with ObservabilityOptions::profile): restarts the op totals and, for a
  // MoE model, counts routed tokens per (layer, expert) from now on.
  Status EnableOpMetrics(int64_t num_layers, int64_t num_experts);
  // The Prometheus text of those counters, names under `prefix`.
  std::string OpMetricsText(const std::string& prefix) const;
  TracingBackend* tracing_backend() const { return tracing_backend_; }
  // Its per-op usage is printed when the session finishes.
  void set_plugin_backend(const PluginBackend* b) { plugin_backend_ = b; }
  Tracer* tracer() const { return tracer_.get(); }

 private:
  Observability() = default;

  std::string trace_path_;
  bool quiet_ = false;
  bool finished_ = false;
  std::unique_ptr<Tracer> tracer_;
  std::unique_ptr<TensorDumper> dumper_;
  std::unique_ptr<RoutingCounter> routing_;
  TracingBackend* tracing_backend_ = nullptr;
  const PluginBackend* plugin_backend_ = nullptr;
};

}  // namespace dh::app
