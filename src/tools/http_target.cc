#include "tools/http_target.h"

#include <nlohmann/json.hpp>

namespace dh {

Result<HttpTarget> ParseHttpTarget(const std::string& url, std::string_view flag,
                                   std::string_view alternatives) {
  const std::string scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0 || url.size() == scheme.size())
    return InvalidArgument("{}: '{}': expected http://HOST:PORT{}", flag, url, alternatives);
  const size_t slash = url.find('/', scheme.size());
  HttpTarget t;
  t.base = url.substr(0, slash);
  if (slash != std::string::npos) t.prefix = url.substr(slash);
  while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
  if (t.prefix.size() >= 3 && t.prefix.compare(t.prefix.size() - 3, 3, "/v1") == 0)
    t.prefix.resize(t.prefix.size() - 3);
  return t;
}

std::string ServerErrorMessage(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const nlohmann::json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return body.substr(0, 200);
}

}  // namespace dh
