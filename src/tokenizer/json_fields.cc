// Typed accessors for tokenizer.json objects (see json_fields.h).
#include "tokenizer/json_fields.h"

namespace dh::tok {
namespace {
std::string Kind(const nlohmann::json& v) { return v.type_name(); }
}  // namespace

Result<std::string> GetString(const nlohmann::json& obj, const char* key,
                              const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) {
    return InvalidArgument("{}: missing field \"{}\"", where, key);
  }
  const auto& v = obj.at(key);
  if (!v.is_string()) {
    return InvalidArgument("{}.{}: expected a string, got {}", where, key, Kind(v));
  }
  return v.get<std::string>();
}

Result<std::string> GetStringOr(const nlohmann::json& obj, const char* key, std::string fallback,
                                const std::string& where) {
  if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return fallback;
  return GetString(obj, key, where);
}

Result<bool> GetBoolOr(const nlohmann::json& obj, const char* key, bool fallback,
                       const std::string& where) {
  if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return fallback;
  const auto& v = obj.at(key);
  if (!v.is_boolean()) {
    return InvalidArgument("{}.{}: expected a boolean, got {}", where, key, Kind(v));
  }
  return v.get<bool>();
}

Result<int64_t> GetIntOr(const nlohmann::json& obj, const char* key, int64_t fallback,
                         const std::string& where) {
  if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return fallback;
  const auto& v = obj.at(key);
  if (!v.is_number_integer()) {
    return InvalidArgument("{}.{}: expected an integer, got {}", where, key, Kind(v));
  }
  return v.get<int64_t>();
}

Result<std::string> GetType(const nlohmann::json& obj, const std::string& where) {
  if (!obj.is_object()) return InvalidArgument("{}: expected an object, got {}", where, Kind(obj));
  return GetString(obj, "type", where);
}

Result<std::string> GetPattern(const nlohmann::json& obj, const char* key, bool* is_regex,
                               const std::string& where) {
  if (!obj.is_object() || !obj.contains(key) || !obj.at(key).is_object()) {
    return InvalidArgument("{}.{}: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where, key);
  }
  const auto& p = obj.at(key);
  const std::string sub = where + "." + key;
  if (p.contains("Regex")) {
    *is_regex = true;
    return GetString(p, "Regex", sub);
  }
  *is_regex = false;
  return GetString(p, "String", sub);
}

}  // namespace dh::tok
