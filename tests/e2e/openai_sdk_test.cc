// Drives the server with the official OpenAI Node SDK (tests/e2e/openai_sdk_test.mjs). Installs
// the npm package `openai` into tests/e2e/node_modules on first run; skips, saying why, when npm
// is missing or the registry cannot be reached.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

TEST(OpenAiSdkTest, ChatCompletionsAndErrorsThroughTheNodeSdk) {
  namespace fs = std::filesystem;
  int status = 0;
  RunShell("node --version && npm --version", &status, true);
  if (status != 0) GTEST_SKIP() << "node/npm not installed: the OpenAI Node SDK test cannot run";
  const fs::path dir = fs::path(DH_SOURCE_DIR) / "tests" / "e2e";
  if (!fs::exists(dir / "node_modules" / "openai" / "package.json")) {
    const std::string install = fs::exists(dir / "package-lock.json")
                                    ? "npm ci --no-audit --no-fund"
                                    : "npm install --no-audit --no-fund";
    std::string out = RunShell("cd '" + dir.string() + "' && timeout 300 " + install, &status, true);
    if (status != 0) GTEST_SKIP() << "could not install the npm package 'openai' (" << install << "):\n" << out;
  }
  ServerProcess server;
  server.set_api_key("sdk-key");
  ASSERT_TRUE(server.Start({"--api-key", "sdk-key"})) << server.log();
  const std::string model = ServedModel(server);
  std::string out = RunShell("cd '" + dir.string() + "' && DH_BASE_URL=" + server.base_url() + "/v1 DH_MODEL='" +
                            model + "' DH_API_KEY=sdk-key timeout 300 node openai_sdk_test.mjs",
                        &status, true);
  EXPECT_EQ(status, 0) << out << "\nserver log:\n" << server.log();
  EXPECT_EQ(server.Stop(), 0);
}

// chat.completions.parse with zod, and the tool-calling flow (openai_sdk_structured_test.mjs).
TEST(OpenAiSdkTest, StructuredOutputAndToolCallsThroughTheNodeSdk) {
  namespace fs = std::filesystem;
  int status = 0;
  RunShell("node --version && npm --version", &status, true);
  if (status != 0) GTEST_SKIP() << "node/npm not installed: the OpenAI Node SDK test cannot run";
  const fs::path dir = fs::path(DH_SOURCE_DIR) / "tests" / "e2e";
  if (!fs::exists(dir / "node_modules" / "zod" / "package.json") ||
      !fs::exists(dir / "node_modules" / "openai" / "package.json")) {
    std::string out = RunShell("cd '" + dir.string() + "' && timeout 300 npm ci --no-audit --no-fund", &status, true);
    if (status != 0) GTEST_SKIP() << "could not install the npm packages (npm ci):\n" << out;
  }
  ServerProcess server;
  ASSERT_TRUE(server.Start()) << server.log();
  const std::string model = ServedModel(server);
  std::string out = RunShell("cd '" + dir.string() + "' && DH_BASE_URL=" + server.base_url() + "/v1 DH_MODEL='" +
                                 model + "' timeout 300 node openai_sdk_structured_test.mjs",
                             &status, true);
  EXPECT_EQ(status, 0) << out << "\nserver log:\n" << server.log();
  EXPECT_EQ(server.Stop(), 0);
}

// The same SDK script against `serve --tp-size 2` started without mpirun (serve starts
// `mpirun -np 2` itself): rank 0 serves, rank 1 follows its steps (docs/parallel.md).
TEST(OpenAiSdkTest, ChatCompletionsThroughTheNodeSdkWithTensorParallelism) {
  namespace fs = std::filesystem;
  int status = 0;
  RunShell("node --version && npm --version", &status, true);
  if (status != 0) GTEST_SKIP() << "node/npm not installed: the OpenAI Node SDK test cannot run";
  RunShell("command -v mpirun", &status, true);
  if (status != 0) GTEST_SKIP() << "mpirun not installed (openmpi-bin): --tp-size 2 cannot run";
  const fs::path dir = fs::path(DH_SOURCE_DIR) / "tests" / "e2e";
  if (!fs::exists(dir / "node_modules" / "openai" / "package.json")) {
    std::string out = RunShell("cd '" + dir.string() + "' && timeout 300 npm ci --no-audit --no-fund", &status, true);
    if (status != 0) GTEST_SKIP() << "could not install the npm packages (npm ci):\n" << out;
  }
  ServerProcess server;
  server.set_api_key("sdk-key");
  ASSERT_TRUE(server.Start({"--api-key", "sdk-key", "--tp-size", "2", "--threads", "1"},
                           std::chrono::seconds(240)))
      << server.log();
  const std::string model = ServedModel(server);
  std::string out = RunShell("cd '" + dir.string() + "' && DH_BASE_URL=" + server.base_url() + "/v1 DH_MODEL='" +
                            model + "' DH_API_KEY=sdk-key timeout 300 node openai_sdk_test.mjs",
                        &status, true);
  EXPECT_EQ(status, 0) << out << "\nserver log:\n" << server.log();
  EXPECT_EQ(server.Stop(), 0) << server.log();
}

}  // namespace
}  // namespace dh::e2e
