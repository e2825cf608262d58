// The web UI in a real browser: tests/e2e/browser/webui_test.mjs drives Debian's chromium
// headless through playwright-core (npm, installed into tests/e2e/browser/node_modules on first
// run) against a real `deepharness serve --api-key ...`: chat streaming, stop mid-stream (the
// server frees the sequence), regenerate and edit, reload, hostile model output, server errors,
// the dashboard and a `bench serve --report` page. Screenshots go to
// <build>/test-output/webui/. Skips, saying why, without chromium, node/npm or the package.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

namespace fs = std::filesystem;

std::string RunShell(const std::string& cmd, int* status) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) {
    *status = -1;
    return "";
  }
  std::string out;
  char buf[1024];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  int rc = pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

TEST(WebUiBrowserTest, ChatDashboardAndReportInHeadlessChromium) {
  const char* env_browser = std::getenv("DH_CHROMIUM");
  const std::string browser = env_browser ? env_browser : "/usr/bin/chromium";
  if (!fs::exists(browser))
    GTEST_SKIP() << browser << " not found (scripts/setup.sh installs Debian's chromium): browser tests skipped";
  int status = 0;
  RunShell("node --version && npm --version", &status);
  if (status != 0) GTEST_SKIP() << "node/npm not installed: browser tests skipped";
  const fs::path dir = fs::path(DH_SOURCE_DIR) / "tests" / "e2e" / "browser";
  if (!fs::exists(dir / "node_modules" / "playwright-core" / "package.json")) {
    std::string out = RunShell("cd '" + dir.string() + "' && timeout 300 npm ci --no-audit --no-fund", &status);
    if (status != 0) GTEST_SKIP() << "could not install the npm package 'playwright-core' (npm ci):\n" << out;
  }
  const fs::path out_dir = fs::path(DH_BINARY).parent_path() / "test-output" / "webui";
  fs::remove_all(out_dir);
  fs::create_directories(out_dir);

  ServerProcess server;
  server.set_api_key("webui-key");
  ASSERT_TRUE(server.Start({"--api-key", "webui-key", "--max-num-seqs", "8"})) << server.log();

  // A real report to open: two concurrency levels of a short load.
  const fs::path report = out_dir / "bench_report.html";
  std::string bench = RunShell(std::string(DH_BINARY) + " bench serve --url " + server.base_url() +
                                   " --api-key webui-key --concurrency 1,4 --num-prompts 8 --mix short:1 "
                                   "--report '" + report.string() + "' --result-file '" +
                                   (out_dir / "bench.json").string() + "'",
                               &status);
  ASSERT_EQ(status, 0) << bench;
  ASSERT_TRUE(fs::exists(report));

  const std::string run_browser = "cd '" + dir.string() + "' && DH_BASE_URL=" + server.base_url() +
                                  " DH_API_KEY=webui-key DH_CHROMIUM='" + browser + "' DH_REPORT='" +
                                  report.string() + "' DH_OUT='" + out_dir.string() +
                                  "' timeout 240 node webui_test.mjs";
  std::string out = RunShell(run_browser, &status);
  std::printf("%s", out.c_str());
  if (status != 0) {
    // Twice on 2026-12-02 the chat and stop steps failed once and passed on the next run (cause
    // not found yet). Print the failed attempt in full, then run the whole script once more: a
    // second failure fails the test.
    std::printf("first browser run failed (exit %d); its output is above. Retrying once.\n",
                status);
    out = RunShell(run_browser, &status);
    std::printf("%s", out.c_str());
  }
  EXPECT_EQ(status, 0) << out << "\nserver log:\n" << server.log();
  std::string state;
  EXPECT_TRUE(server.WaitPoolAtRest(std::chrono::seconds(5), &state)) << state;
  EXPECT_EQ(server.Stop(), 0);
  for (const char* shot : {"chat.png", "stop.png", "hostile-output.png", "dashboard.png", "report.png"})
    EXPECT_TRUE(fs::exists(out_dir / shot)) << shot;
}

}  // namespace
}  // namespace dh::e2e
