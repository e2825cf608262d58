// PCRE2 regex (UTF + Unicode properties, JIT when available) used by Split/Replace stages.
// Matching never recurses on the C stack: JIT runs on its own heap stack, and the interpreter
// fallback is heap-limited.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dh::tok {

class Regex {
 public:
  // `pattern` is UTF-8; errors name the pattern and the PCRE2 message.
  static Result<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  // A literal string matched as-is.
  static Result<std::unique_ptr<Regex>> Literal(std::string_view text);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends [begin, end) byte ranges of all non-overlapping matches, left to right. `subject`
  // must be valid UTF-8. Empty matches are reported (callers drop empty pieces).
  Status FindAll(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const;

 private:
  Regex() = default;
  struct Code;
  std::unique_ptr<Code> code_;
  std::string pattern_;
  bool jit_ = false;
};

}  // namespace dh::tok
