// The files of the web UI (webui/ in the source tree), embedded into the binary at build time by
// cmake/embed_webui.cmake. Names are relative to webui/ ("chat.html", "chat.js", ...).
#pragma once

#include <cstddef>
#include <vector>

namespace dh::server {

struct WebUiAsset {
  const char* name;
  const unsigned char* data;
  size_t size;
};

const std::vector<WebUiAsset>& WebUiAssets();

}  // namespace dh::server
