// JSON at the edge: a bounded parser for request bodies (nesting-depth pre-scan so no recursive
// walk can overflow, UTF-8 checked by nlohmann's lexer) and a writer that cannot throw on
// invalid UTF-8 (bytes that do not form UTF-8 become U+FFFD).
#pragma once

#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace dh::server {

using Json = nlohmann::json;

inline constexpr int kMaxJsonDepth = 64;

// Returns the maximum nesting depth of arrays/objects in `text` (strings skipped), stopping early
// once `limit` is exceeded (the returned value is then limit + 1).
int JsonNestingDepth(std::string_view text, int limit);

// Parses a request body: must be a JSON object, at most `max_depth` deep, valid UTF-8.
std::variant<Json, ApiError> ParseRequestBody(std::string_view body, int max_depth = kMaxJsonDepth);

// Serializes compactly; invalid UTF-8 in strings is replaced with U+FFFD instead of throwing.
std::string SafeDump(const Json& value);

// Replaces invalid UTF-8 sequences (overlong, surrogates, > U+10FFFF, truncated) with U+FFFD.
std::string SanitizeUtf8(std::string_view text);
bool IsValidUtf8(std::string_view text);

}  // namespace dh::server
