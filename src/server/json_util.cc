// Bounded JSON parsing and non-throwing JSON/UTF-8 output.
#include "server/json_util.h"

#include <cstdint>

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

std::variant<Json, ApiError> ParseRequestBody(std::string_view body, int max_depth) {
  if (body.empty()) return InvalidJson("Request body is empty; expected a JSON object");
  if (body.size() >= 3 && body.substr(0, 3) == "\xEF\xBB\xBF") {
    return InvalidJson("Request body starts with a byte-order mark; send plain UTF-8 JSON");
  }
  if (JsonNestingDepth(body, max_depth) > max_depth) {
    return InvalidJson("Request body exceeds the maximum JSON nesting depth of " +
                       std::to_string(max_depth));
  }
  // nlohmann's lexer rejects invalid UTF-8 (overlong forms, surrogates, > U+10FFFF) and lone
  // surrogate escapes; NaN, trailing commas and a BOM are rejected as syntax errors.
  Json value = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false,
                           /*ignore_comments=*/false);
  if (value.is_discarded()) {
    return InvalidJson("Request body is not valid JSON (or not valid UTF-8)");
  }
  if (!value.is_object()) return InvalidJson("Request body must be a JSON object");
  return value;
}

std::string SafeDump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

// Length of the valid UTF-8 sequence at text[i], or 0 when invalid (RFC 3629 table).
size_t ValidSequenceLength(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const size_t n = text.size();
  uint8_t c = b(i);
  if (c < 0x80) return 1;
  auto cont = [&](size_t k, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return k < n && b(k) >= lo && b(k) <= hi;
  };
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c == 0xE0) return cont(i + 1, 0xA0, 0xBF) && cont(i + 2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
    return cont(i + 1) && cont(i + 2) ? 3 : 0;
  if (c == 0xED) return cont(i + 1, 0x80, 0x9F) && cont(i + 2) ? 3 : 0;
  if (c == 0xF0) return cont(i + 1, 0x90, 0xBF) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(i + 1) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  if (c == 0xF4) return cont(i + 1, 0x80, 0x8F) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  return 0;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    size_t len = ValidSequenceLength(text, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t len = ValidSequenceLength(text, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

}  // namespace dh::server
