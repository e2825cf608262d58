// Logging sink: one line per call, prefixed with the level, written atomically to stderr.
#include "base/log.h"

#include <atomic>
#include <mutex>

namespace dh {
namespace {
std::atomic<LogLevel> g_level{LogLevel::kInfo};
std::mutex g_mutex;
}  // namespace

LogLevel GetLogLevel() { return g_level.load(std::memory_order_relaxed); }
void SetLogLevel(LogLevel level) { g_level.store(level, std::memory_order_relaxed); }

void LogLine(LogLevel level, const std::string& line) {
  static const char* kNames[] = {"debug", "info", "warning", "error", ""};
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "[%s] %s\n", kNames[static_cast<int>(level)], line.c_str());
}

}  // namespace dh
