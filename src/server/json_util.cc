// Bounded JSON parsing and non-throwing JSON/UTF-8 output.
#include "server/json_util.h"

#include <cstdint>

#include "base/utf8.h"

namespace dh::server {

int JsonNestingDepth(std::string_view text, int limit) {
  int depth = 0;
  int max_depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++depth;
      if (depth > max_depth) max_depth = depth;
      if (max_depth > limit) return limit + 1;
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return max_depth;
}

std::string SafeDump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string SanitizeUtf8(std::string_view text) { return Utf8ReplaceEachBadByte(text); }

}  // namespace dh::server
