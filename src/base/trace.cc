// Tracer and TraceSpan (trace.h).
#include "base/trace.h"

#include <fmt/format.h>

#include <cstdio>

namespace dh {
namespace trace_internal {
std::atomic<Tracer*> tracer{nullptr};
}  // namespace trace_internal

namespace {

thread_local const char* current_label = "";

// Small per-thread ids (1, 2, ...) in order of first use: readable track names.
int ThreadId() {
  static std::atomic<int> next{1};
  thread_local const int id = next.fetch_add(1);
  return id;
}

}  // namespace

void SetTracer(Tracer* tracer) { trace_internal::tracer.store(tracer, std::memory_order_release); }

const char* CurrentTraceLabel() { return current_label; }

std::string JsonEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += fmt::format("\\u{:04x}", u);
    } else {
      out += c;
    }
  }
  return out;
}

std::string JsonArg(std::string_view key, std::string_view value) {
  return fmt::format("\"{}\": \"{}\"", JsonEscape(key), JsonEscape(value));
}

std::string JsonArg(std::string_view key, double value) {
  return fmt::format("\"{}\": {}", JsonEscape(key), value);
}

Tracer::Tracer(size_t max_events, int pid)
    : max_events_(max_events), pid_(pid), origin_(Clock::now()) {}

double Tracer::Micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

bool Tracer::Reserve(size_t n) {
  if (events_.size() + n > max_events_) {
    dropped_ += n;
    return false;
  }
  return true;
}

void Tracer::Complete(std::string_view name, std::string_view cat, Clock::time_point start,
                      Clock::time_point end, std::string args) {
  const int tid = ThreadId();
  std::lock_guard<std::mutex> lock(mu_);
  if (!Reserve(1)) return;
  events_.push_back({'X', tid, 0, Micros(start), Micros(end) - Micros(start), std::string(name),
                     std::string(cat), std::move(args)});
}

void Tracer::Async(std::string_view name, std::string_view cat, uint64_t id,
                   Clock::time_point start, Clock::time_point end, std::string args) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!Reserve(2)) return;
  events_.push_back(
      {'b', 0, id, Micros(start), 0, std::string(name), std::string(cat), std::move(args)});
  events_.push_back({'e', 0, id, Micros(end), 0, std::string(name), std::string(cat), {}});
}

void Tracer::Instant(std::string_view name, std::string_view cat, Clock::time_point at,
                     std::string args) {
  const int tid = ThreadId();
  std::lock_guard<std::mutex> lock(mu_);
  if (!Reserve(1)) return;
  events_.push_back(
      {'i', tid, 0, Micros(at), 0, std::string(name), std::string(cat), std::move(args)});
}

size_t Tracer::num_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

uint64_t Tracer::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

std::string Tracer::ToJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "{\"traceEvents\": [\n";
  out += fmt::format(
      "{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {}, \"tid\": 0, "
      "\"args\": {{\"name\": \"deepharness rank {}\"}}}}",
      pid_, pid_);
  for (const Event& e : events_) {
    out += fmt::format(",\n{{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"{}\", \"pid\": {}, ",
                       JsonEscape(e.name), JsonEscape(e.cat), e.phase, pid_);
    if (e.phase == 'b' || e.phase == 'e') {
      out += fmt::format("\"tid\": 0, \"id\": \"0x{:x}\", ", e.id);
    } else {
      out += fmt::format("\"tid\": {}, ", e.tid);
    }
    out += fmt::format("\"ts\": {:.3f}", e.ts_us);
    if (e.phase == 'X') out += fmt::format(", \"dur\": {:.3f}", e.dur_us);
    if (e.phase == 'i') out += ", \"s\": \"t\"";
    if (!e.args.empty()) out += ", \"args\": {" + e.args + "}";
    out += "}";
  }
  out += fmt::format(
      "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {{\"events\": {}, "
      "\"dropped_events\": {}, \"max_events\": {}}}}}\n",
      events_.size(), dropped_, max_events_);
  return out;
}

Status Tracer::WriteFile(const std::string& path) const {
  const std::string json = ToJson();
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return IoError("--trace-out: cannot write {}", path);
  const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if (std::fclose(f) != 0 || !ok) return IoError("--trace-out: cannot write {}", path);
  return Status::Ok();
}

void TraceSpan::Begin(const char* label) {
  label_ = label;
  outer_label_ = current_label;
  current_label = label;
  start_ = Tracer::Clock::now();
}

void TraceSpan::End() {
  const auto end = Tracer::Clock::now();
  current_label = outer_label_;
  tracer_->Complete(name_.empty() ? std::string_view(label_) : std::string_view(name_), label_,
                    start_, end, std::move(args_));
}

}  // namespace dh
