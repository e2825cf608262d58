// Observability flags and session (observability.h).
#include "apps/observability.h"

#include <cstdio>
#include <map>

#include "base/log.h"
#include "model/tap.h"

namespace dh::app {

void AddObservabilityOptions(CLI::App* sub, ObservabilityOptions* o, unsigned flags) {
  if (flags & kTraceFlags) {
    sub->add_option("--trace-out", o->trace_out,
                    "Write a timeline of engine steps, layers, ops and requests to FILE.json "
                    "(Chrome trace format: Perfetto, chrome://tracing; docs/observability.md)");
    sub->add_option("--trace-max-events", o->trace_max_events,
                    "With --trace-out: keep the first N events, count the rest as dropped "
                    "(default 1000000)");
  }
  if (flags & kDumpFlags) {
    sub->add_option("--dump-tensors", o->dump_dir,
                    "Write named intermediate tensors (taps, Hugging Face module names) as "
                    "DIR/s<step>.<tap>.npy plus DIR/manifest.tsv; compare two dumps with "
                    "`deepharness diff-dumps`");
    sub->add_option("--dump-filter", o->dump_filter,
                    "With --dump-tensors: taps to write, glob patterns separated by commas "
                    "(default *), e.g. 'model.layers.0.*,logits'");
    sub->add_option("--dump-steps", o->dump_steps,
                    "With --dump-tensors: forward steps A-B or A to dump, from 0 (default: all)");
  }
  if (flags & kPluginFlags) {
    sub->add_option("--plugin", o->plugins,
                    "Load an op plugin (a shared library built against "
                    "include/deepharness/plugin.h); repeatable")
        ->take_all();
  }
}

Result<std::unique_ptr<Observability>> Observability::Start(const ObservabilityOptions& o, int rank,
                                                            bool quiet) {
  std::unique_ptr<Observability> s(new Observability());
  s->quiet_ = quiet;
  if (o.trace_max_events < 0) {
    return InvalidArgument("--trace-max-events: expected >= 0, got {}", o.trace_max_events);
  }
  if (o.dump_dir.empty() && (o.dump_filter != "*" || !o.dump_steps.empty())) {
    return InvalidArgument("--dump-filter and --dump-steps need --dump-tensors DIR");
  }
  if (!o.trace_out.empty()) {
    s->trace_path_ = o.trace_out;
    if (rank != 0) {
      const size_t dot = s->trace_path_.rfind(".json");
      const std::string tag = ".rank" + std::to_string(rank);
      if (dot != std::string::npos && dot + 5 == s->trace_path_.size()) {
        s->trace_path_.insert(dot, tag);
      } else {
        s->trace_path_ += tag;
      }
    }
    // Fail now, not after the run, when the file cannot be written.
    std::FILE* f = std::fopen(s->trace_path_.c_str(), "w");
    if (!f) return InvalidArgument("--trace-out: cannot write {}", s->trace_path_);
    std::fclose(f);
  }
  if (o.tracing()) {
    // `profile` keeps op totals only: spans still label ops, but no event is kept.
    const size_t max = o.trace_out.empty() ? 0 : static_cast<size_t>(o.trace_max_events);
    s->tracer_ = std::make_unique<Tracer>(max, rank);
    SetTracer(s->tracer_.get());
  }
  if (!o.dump_dir.empty()) {
    DumpOptions d;
    d.dir = o.dump_dir;
    d.filter = o.dump_filter;
    if (!o.dump_steps.empty()) DH_RETURN_IF_ERROR(ParseDumpSteps(o.dump_steps, &d));
    if (rank == 0) {
      DH_ASSIGN_OR_RETURN(s->dumper_, TensorDumper::Create(d));
      SetTapSink(s->dumper_.get());
    }
  }
  return s;
}

Status Observability::EnableOpMetrics(int64_t num_layers, int64_t num_experts) {
  if (!tracing_backend_) return Internal("--op-metrics without a tracing backend");
  tracing_backend_->ResetTotals();
  if (num_experts <= 0) return Status::Ok();
  if (dumper_) return InvalidArgument("--op-metrics and --dump-tensors cannot be combined");
  routing_ = std::make_unique<RoutingCounter>(num_layers, num_experts);
  SetTapSink(routing_.get());
  return Status::Ok();
}

std::string Observability::OpMetricsText(const std::string& prefix) const {
  std::string out;
  std::map<std::string, OpTotals> by_op;
  for (const OpTotalsRow& r : tracing_backend_->Totals()) by_op[r.op].Add(r.totals);
  out += fmt::format(
      "# HELP {0}op_seconds_total Time inside backend ops, by op class.\n"
      "# TYPE {0}op_seconds_total counter\n",
      prefix);
  for (const auto& [op, t] : by_op) {
    out += fmt::format("{}op_seconds_total{{op=\"{}\"}} {:.6f}\n", prefix, op, t.seconds);
  }
  out += fmt::format(
      "# HELP {0}op_calls_total Backend op calls, by op class.\n"
      "# TYPE {0}op_calls_total counter\n",
      prefix);
  for (const auto& [op, t] : by_op) {
    out += fmt::format("{}op_calls_total{{op=\"{}\"}} {}\n", prefix, op, t.calls);
  }
  if (routing_) {
    out += fmt::format(
        "# HELP {0}moe_routed_tokens_total Tokens the router sent to each routed "
        "expert, per MoE layer.\n# TYPE {0}moe_routed_tokens_total counter\n",
        prefix);
    for (int64_t l = 0; l < routing_->num_layers(); ++l) {
      if (!routing_->LayerSeen(l)) continue;
      for (int64_t e = 0; e < routing_->num_experts(); ++e) {
        out += fmt::format("{}moe_routed_tokens_total{{layer=\"{}\",expert=\"{}\"}} {}\n", prefix,
                           l, e, routing_->Count(l, e));
      }
    }
  }
  return out;
}

Status Observability::Finish() {
  if (finished_) return Status::Ok();
  finished_ = true;
  Status first;
  if (plugin_backend_ && !quiet_) {
    for (const std::string& line : plugin_backend_->Usage()) {
      std::fprintf(stderr, "plugin: %s\n", line.c_str());
    }
  }
  if (routing_) SetTapSink(nullptr);
  if (dumper_) {
    SetTapSink(nullptr);
    Status st = dumper_->Finish();
    if (!st.ok()) {
      first = st;
    } else if (!quiet_) {
      std::fprintf(stderr, "dump: %lld tensors, %.1f MiB written\n",
                   static_cast<long long>(dumper_->files_written()),
                   dumper_->bytes_written() / 1048576.0);
    }
  }
  if (tracer_) {
    SetTracer(nullptr);
    if (!trace_path_.empty()) {
      Status st = tracer_->WriteFile(trace_path_);
      if (!st.ok() && first.ok()) first = st;
      if (st.ok() && !quiet_) {
        std::fprintf(stderr, "trace: %zu events written to %s (%llu dropped)\n",
                     tracer_->num_events(), trace_path_.c_str(),
                     static_cast<unsigned long long>(tracer_->dropped()));
      }
    }
  }
  return first;
}

Observability::~Observability() {
  Status st = Finish();
  if (!st.ok()) DH_LOG(Error, "{}", st.message());
}

}  // namespace dh::app
