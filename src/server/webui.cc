// Static routes of the embedded web UI (see webui.h).
#include "server/webui.h"

#include <cstdint>
#include <string_view>

#include <fmt/format.h>
#include <httplib.h>

#include "server/webui_assets.h"

namespace dh::server {
namespace {

constexpr std::string_view kPrefix = "/webui/";

const WebUiAsset* FindAsset(std::string_view name) {
  for (const WebUiAsset& a : WebUiAssets()) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

const char* ContentType(std::string_view name) {
  auto ends = [&](std::string_view ext) {
    return name.size() >= ext.size() && name.substr(name.size() - ext.size()) == ext;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  if (ends(".png")) return "image/png";
  return "application/octet-stream";
}

// FNV-1a over the bytes: a stable validator for one build of the asset.
std::string ETag(const WebUiAsset& a) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < a.size; ++i) {
    h ^= a.data[i];
    h *= 1099511628211ull;
  }
  return fmt::format("\"{:016x}-{}\"", h, a.size);
}

void Serve(const WebUiAsset& a, const httplib::Request& req, httplib::Response& res) {
  const std::string etag = ETag(a);
  res.set_header("ETag", etag);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Content-Type-Options", "nosniff");
  const std::string_view name = a.name;
  if (name.size() > 5 && name.substr(name.size() - 5) == ".html") {
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' "
                   "data:; connect-src 'self'; base-uri 'none'; "
                   "frame-ancestors 'none'");
    res.set_header("Referrer-Policy", "no-referrer");
  }
  if (req.get_header_value("If-None-Match") == etag) {
    res.status = 304;
    return;
  }
  res.set_content(reinterpret_cast<const char*>(a.data), a.size, ContentType(name));
}

}  // namespace

bool IsWebUiPath(const std::string& path) {
  if (path == "/" || path == "/dashboard") return true;
  return path.size() > kPrefix.size() && path.compare(0, kPrefix.size(), kPrefix) == 0 &&
         FindAsset(std::string_view(path).substr(kPrefix.size())) != nullptr;
}

void RegisterWebUi(httplib::Server& http) {
  auto page = [](const char* file) {
    return [file](const httplib::Request& req, httplib::Response& res) {
      if (const WebUiAsset* a = FindAsset(file)) Serve(*a, req, res);
    };
  };
  http.Get("/", page("chat.html"));
  http.Get("/dashboard", page("dashboard.html"));
  // Every embedded file by its exact name (a table lookup; nothing touches the file system).
  for (const WebUiAsset& a : WebUiAssets()) {
    const WebUiAsset* asset = &a;
    http.Get(std::string(kPrefix) + a.name,
             [asset](const httplib::Request& req, httplib::Response& res) { Serve(*asset, req, res); });
  }
}

}  // namespace dh::server
