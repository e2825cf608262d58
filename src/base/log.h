// Minimal leveled logging to stderr. The level is global and set once by the CLI.
#pragma once

#include <cstdio>

#include <fmt/format.h>

namespace dh {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kQuiet = 4 };

LogLevel GetLogLevel();
void SetLogLevel(LogLevel level);
void LogLine(LogLevel level, const std::string& line);

}  // namespace dh

#define DH_LOG(level, ...)                                                  \
  do {                                                                      \
    if (::dh::LogLevel::k##level >= ::dh::GetLogLevel())                    \
      ::dh::LogLine(::dh::LogLevel::k##level, fmt::format(__VA_ARGS__));    \
  } while (0)
