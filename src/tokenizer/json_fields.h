// Small typed accessors for tokenizer.json objects; errors name the JSON path and what was
// expected, so a malformed file yields one line that points at the broken part.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace dh::tok {

Result<std::string> GetString(const nlohmann::json& obj, const char* key, const std::string& where);
// Missing or null -> `fallback`.
Result<std::string> GetStringOr(const nlohmann::json& obj, const char* key, std::string fallback,
                                const std::string& where);
Result<bool> GetBoolOr(const nlohmann::json& obj, const char* key, bool fallback,
                       const std::string& where);
Result<int64_t> GetIntOr(const nlohmann::json& obj, const char* key, int64_t fallback,
                         const std::string& where);
// The "type" field of a component object.
Result<std::string> GetType(const nlohmann::json& obj, const std::string& where);
// {"String": "..."} or {"Regex": "..."}: returns the text and sets *is_regex.
Result<std::string> GetPattern(const nlohmann::json& obj, const char* key, bool* is_regex,
                               const std::string& where);

}  // namespace dh::tok
