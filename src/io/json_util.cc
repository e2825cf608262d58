// Strict JSON parsing: nlohmann's parser with a callback that tracks the keys of every open
// object (duplicates refused, as the safetensors spec asks) and the nesting depth.
#include "io/json_util.h"

#include <optional>
#include <set>
#include <vector>

namespace dh {
namespace {

// Thrown from the parse callback to stop parsing; caught in ParseJsonStrict.
struct JsonRejected {
  std::string message;
};

}  // namespace

Result<nlohmann::json> ParseJsonStrict(std::string_view text, std::string_view source,
                                       int max_depth) {
  using nlohmann::json;
  // One entry per open container: the keys seen so far for an object, nullopt for an array.
  std::vector<std::optional<std::set<std::string>>> open;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (static_cast<int>(open.size()) >= max_depth) {
          throw JsonRejected{fmt::format("JSON nested deeper than {} levels", max_depth)};
        }
        if (event == json::parse_event_t::object_start) {
          open.emplace_back(std::set<std::string>());
        } else {
          open.emplace_back(std::nullopt);
        }
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open.empty() && open.back().has_value()) {
          const std::string& key = parsed.get_ref<const std::string&>();
          if (!open.back()->insert(key).second) {
            throw JsonRejected{fmt::format("duplicate key '{}' in a JSON object", key)};
          }
        }
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const JsonRejected& e) {
    return InvalidArgument("{}: {}", source, e.message);
  } catch (const json::exception& e) {
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix; keep line, column and reason.
    std::string_view what = e.what();
    if (size_t p = what.find("] "); what.starts_with("[json.exception") && p != what.npos) {
      what.remove_prefix(p + 2);
    }
    return InvalidArgument("{}: invalid JSON: {}", source, what);
  }
}

std::string JsonSnippet(const nlohmann::json& value) {
  std::string s = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string_view JsonKind(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "a list";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "an integer";
    case nlohmann::json::value_t::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

}  // namespace dh
