// Parsing an HTTP request body into JSON, with OpenAI-style errors: must be a JSON object, at most
// `max_depth` deep (checked by a pre-scan before parsing), valid UTF-8 (nlohmann's lexer).
#pragma once

#include <string_view>
#include <variant>

#include "server/api_error.h"
#include "server/json_util.h"

namespace dh::server {

std::variant<Json, ApiError> ParseRequestBody(std::string_view body, int max_depth = kMaxJsonDepth);

}  // namespace dh::server
