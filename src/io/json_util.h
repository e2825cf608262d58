// Strict JSON for the files we load: parse errors become Status (no exceptions escape), duplicate
// keys and deep nesting are refused, and values are rendered briefly for error messages.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dh {

inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; `source` (a file name) prefixes every error. Refuses duplicate keys in any
// object and nesting deeper than max_depth.
Result<nlohmann::json> ParseJsonStrict(std::string_view text, std::string_view source,
                                       int max_depth = kMaxJsonDepth);

// A short rendering of a value for "got ..." in error messages (at most ~60 characters).
std::string JsonSnippet(const nlohmann::json& value);

// "an integer", "a string", ... for "expected X, got <kind>" messages.
std::string_view JsonKind(const nlohmann::json& value);

}  // namespace dh
