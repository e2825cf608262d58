// The web UI's routes over plain HTTP (no browser): pages and assets served from the binary
// with their content types, ETag/304, no-cache and CSP headers, reachable without the API key
// while the API still needs it, and gone with --no-webui.
#include <gtest/gtest.h>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

TEST(WebUiHttpTest, PagesAndAssetsWithHeadersAndAuth) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--api-key", "k1"})) << server.log();
  server.set_api_key("");  // requests below go without the key unless they add it

  HttpResult page = server.Get("/");
  ASSERT_EQ(page.status, 200) << page.body;
  EXPECT_EQ(page.header("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(page.header("Cache-Control"), "no-cache");
  EXPECT_EQ(page.header("X-Content-Type-Options"), "nosniff");
  const std::string csp = page.header("Content-Security-Policy");
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("default-src 'none'"), std::string::npos) << csp;
  EXPECT_NE(page.body.find("<script type=\"module\" src=\"/webui/chat.js\"></script>"), std::string::npos);
  const std::string etag = page.header("ETag");
  ASSERT_FALSE(etag.empty());
  EXPECT_EQ(server.Get("/", {{"If-None-Match", etag}}).status, 304);
  EXPECT_EQ(server.Get("/", {{"If-None-Match", "\"other\""}}).status, 200);

  HttpResult dash = server.Get("/dashboard");
  ASSERT_EQ(dash.status, 200);
  EXPECT_NE(dash.body.find("/webui/dashboard.js"), std::string::npos);
  for (const auto& [path, type] : std::vector<std::pair<std::string, std::string>>{
           {"/webui/chat.js", "text/javascript; charset=utf-8"},
           {"/webui/dashboard.js", "text/javascript; charset=utf-8"},
           {"/webui/markdown.js", "text/javascript; charset=utf-8"},
           {"/webui/prometheus.js", "text/javascript; charset=utf-8"},
           {"/webui/api.js", "text/javascript; charset=utf-8"},
           {"/webui/style.css", "text/css; charset=utf-8"}}) {
    HttpResult r = server.Get(path);
    EXPECT_EQ(r.status, 200) << path;
    EXPECT_EQ(r.header("Content-Type"), type) << path;
    EXPECT_GT(r.body.size(), 100u) << path;
    EXPECT_TRUE(r.header("Content-Security-Policy").empty()) << path;
  }
  // The pages need no key; the API and unknown files still do.
  EXPECT_EQ(server.Get("/v1/models").status, 401);
  EXPECT_EQ(server.Get("/metrics").status, 401);
  EXPECT_EQ(server.Get("/webui/missing.js").status, 401);
  EXPECT_EQ(server.Get("/webui/missing.js", {{"Authorization", "Bearer k1"}}).status, 404);
  EXPECT_EQ(server.Get("/v1/models", {{"Authorization", "Bearer k1"}}).status, 200);
  EXPECT_EQ(server.Stop(), 0);
}

TEST(WebUiHttpTest, NoWebUiFlagRemovesThePages) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--no-webui"})) << server.log();
  EXPECT_EQ(server.Get("/").status, 404);
  EXPECT_EQ(server.Get("/dashboard").status, 404);
  EXPECT_EQ(server.Get("/webui/chat.js").status, 404);
  EXPECT_EQ(server.Get("/v1/models").status, 200);
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
}  // namespace dh::e2e
