// JSON at the edge: the nesting-depth pre-scan (so no recursive walk can overflow) and a writer
// that cannot throw on invalid UTF-8 (bytes that do not form UTF-8 become U+FFFD). Request bodies
// are parsed by request_body.h on top of this.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/utf8.h"
#include "io/json_util.h"

namespace dh::server {

using Json = nlohmann::json;

using ::dh::kMaxJsonDepth;  // io/json_util.h: one limit for files and requests

// Returns the maximum nesting depth of arrays/objects in `text` (strings skipped), stopping early
// once `limit` is exceeded (the returned value is then limit + 1).
int JsonNestingDepth(std::string_view text, int limit);

// Serializes compactly; invalid UTF-8 in strings is replaced with U+FFFD instead of throwing.
std::string SafeDump(const Json& value);

// Replaces invalid UTF-8 sequences (overlong, surrogates, > U+10FFFF, truncated) with U+FFFD.
std::string SanitizeUtf8(std::string_view text);
using ::dh::IsValidUtf8;  // base/utf8.h

}  // namespace dh::server
