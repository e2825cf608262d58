// DH_CHECK: always-on invariant checks for our own code. A failure is a bug, never bad input.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace dh::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* cond,
                                     const std::string& msg) {
  std::fprintf(stderr, "%s:%d: DH_CHECK failed: %s %s\n", file, line, cond, msg.c_str());
  std::abort();
}
}  // namespace dh::internal

#define DH_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::dh::internal::CheckFailed(__FILE__, __LINE__, #cond, fmt::format("" __VA_ARGS__)); \
  } while (0)
