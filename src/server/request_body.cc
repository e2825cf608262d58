// Request body parsing (request_body.h).
#include "server/request_body.h"

#include <string>

namespace dh::server {

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

}  // namespace dh::server
