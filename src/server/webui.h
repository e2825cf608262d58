// The built-in web UI of `deepharness serve`: the chat page at GET /, the live dashboard at GET
// /dashboard and their scripts and styles under GET /webui/<file>, all served from the copies
// embedded in the binary (webui_assets.h). The pages are static and need no API key; the API
// calls they make carry it. Turned off with `serve --no-webui`.
#pragma once

#include <string>

namespace httplib {
class Server;
}

namespace dh::server {

// True for the paths RegisterWebUi answers (the auth hook lets these through without a key).
bool IsWebUiPath(const std::string& path);
// Adds the GET routes. Responses carry the content type, an ETag (If-None-Match -> 304),
// Cache-Control: no-cache (revalidate, so a new binary's UI is picked up at once),
// X-Content-Type-Options: nosniff, and on the pages a Content-Security-Policy that allows only
// this server's own scripts, styles and API (no inline script, no other origin).
void RegisterWebUi(httplib::Server& http);

}  // namespace dh::server
