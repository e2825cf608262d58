// Timeline tracing in the Chrome trace event format (docs/observability.md): complete spans per
// engine step, layer and op, async spans per request, written as one JSON file that Perfetto and
// chrome://tracing open. One process-wide Tracer may be installed; with none, a TraceSpan costs
// one atomic load and a branch. The tracer keeps at most `max_events` events (the first ones)
// and counts the rest as dropped, so a long run cannot grow the file without bound.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dh {

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;
  // `pid`: the rank, so the files of several ranks can be merged into one view.
  explicit Tracer(size_t max_events, int pid = 0);

  // A span [start, end) on the calling thread's track. `args` is the inside of a JSON object
  // (`"k": 1, "s": "x"`, see JsonArg) or empty.
  void Complete(std::string_view name, std::string_view cat, Clock::time_point start,
                Clock::time_point end, std::string args = {});
  // A span on a track of its own, keyed by `id` (one request's phases).
  void Async(std::string_view name, std::string_view cat, uint64_t id, Clock::time_point start,
             Clock::time_point end, std::string args = {});
  // A point in time on the calling thread's track.
  void Instant(std::string_view name, std::string_view cat, Clock::time_point at,
               std::string args = {});

  size_t num_events() const;
  uint64_t dropped() const;
  std::string ToJson() const;
  Status WriteFile(const std::string& path) const;

 private:
  struct Event {
    char phase;  // 'X' complete, 'b'/'e' async begin/end, 'i' instant
    int tid;
    uint64_t id;
    double ts_us, dur_us;
    std::string name, cat, args;
  };
  bool Reserve(size_t n);  // under mu_: room for n more events, else counts them dropped
  double Micros(Clock::time_point t) const;

  const size_t max_events_;
  const int pid_;
  const Clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  uint64_t dropped_ = 0;
};

namespace trace_internal {
extern std::atomic<Tracer*> tracer;
}  // namespace trace_internal

// Installs `tracer` (nullptr: tracing off); the caller keeps it alive until it is replaced.
void SetTracer(Tracer* tracer);
inline Tracer* ActiveTracer() {
  return trace_internal::tracer.load(std::memory_order_acquire);
}

// JSON helpers for span arguments: `"key": value` with the string escaped.
std::string JsonEscape(std::string_view s);
std::string JsonArg(std::string_view key, std::string_view value);
std::string JsonArg(std::string_view key, double value);

// The label of the innermost open TraceSpan of this thread ("" outside any): the profiler
// attributes backend ops to it (e.g. "attention.mla", "ffn.moe").
const char* CurrentTraceLabel();

// A span of the calling thread, recorded when it ends, if a tracer was installed when it began.
// `label` (static text) is its category and, unless SetName gives one, its name; it is the
// thread's CurrentTraceLabel() while the span is open.
class TraceSpan {
 public:
  explicit TraceSpan(const char* label) : tracer_(ActiveTracer()) {
    if (tracer_) [[unlikely]] Begin(label);
  }
  ~TraceSpan() {
    if (tracer_) [[unlikely]] End();
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  // Whether the span records (format names and arguments only then).
  bool active() const { return tracer_ != nullptr; }
  void SetName(std::string name) { name_ = std::move(name); }
  void SetArgs(std::string args) { args_ = std::move(args); }

 private:
  void Begin(const char* label);
  void End();

  Tracer* tracer_;
  const char* label_ = nullptr;
  const char* outer_label_ = nullptr;
  Tracer::Clock::time_point start_;
  std::string name_, args_;
};

}  // namespace dh
