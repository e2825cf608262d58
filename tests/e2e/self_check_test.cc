// Start-up self-check (apps/self_check.h, docs/reliability.md): serve compares every op of a few
// tokens with the reference backend before it accepts requests; /health reports the result; a
// backend that computes one op wrongly (the test hook DEEPHARNESS_TEST_SELF_CHECK_PERTURB) makes
// the server refuse to start with one line naming the op, exit 2.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "server_fixture.h"

namespace dh::e2e {
namespace {

// Runs the binary (bounded by `timeout` in case it starts serving), returns its exit code and
// output (stdout + stderr).
int RunBinary(const std::string& args, std::string* output, const std::string& env = "") {
  const std::string cmd =
      env + " timeout 120 " + std::string(DH_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf;
  output->clear();
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output->append(buf.data(), n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Json HealthSelfCheck(const ServerProcess& server) {
  const HttpResult health = server.Get("/health");
  EXPECT_EQ(health.status, 200) << health.body;
  const Json j = health.json();
  return j.is_object() && j.contains("self_check") ? j["self_check"] : Json();
}

TEST(SelfCheck, PassesOnTheServedModelAndHealthReportsIt) {
  ServerProcess server;
  ASSERT_TRUE(server.Start()) << server.log();
  const Json check = HealthSelfCheck(server);
  ASSERT_TRUE(check.is_object()) << server.Get("/health").body;
  EXPECT_EQ(check.value("state", ""), "passed") << check.dump();
  EXPECT_EQ(check.value("scope", ""), "all layers") << check.dump();
  EXPECT_GT(check.value("ops_checked", 0), 20) << check.dump();
  EXPECT_EQ(check.value("steps", 0), 4) << check.dump();
  EXPECT_NE(server.log().find("self-check passed (all layers"), std::string::npos) << server.log();
  EXPECT_EQ(server.Stop(), 0);
}

// Quantized weights run the CPU's integer-dot kernels: they must stay within the low-precision
// golden tolerance (2e-2), and `first` checks only the first two layers.
TEST(SelfCheck, PassesWithQuantizedWeightsAndFirstLayersScope) {
  for (const char* quant : {"int8", "int4"}) {
    ServerProcess server;
    ASSERT_TRUE(server.Start({"--quant", quant, "--no-compile-cache", "--self-check", "first"}))
        << quant << "\n" << server.log();
    const Json check = HealthSelfCheck(server);
    EXPECT_EQ(check.value("state", ""), "passed") << quant << " " << check.dump();
    EXPECT_EQ(check.value("scope", ""), "first 2 layers") << quant << " " << check.dump();
    EXPECT_EQ(server.Stop(), 0);
  }
}

// One wrong op -> one line naming it, exit 2, never "ready". Every op kind the served model
// (DeepSeek-V3 layout: MLA attention, MoE) calls is tried (13 of the 13 op kinds).
TEST(SelfCheck, WrongOpRefusesToStartNamingTheOp) {
  for (const char* op : {"Embedding", "RmsNorm", "AddRmsNorm", "MatMul", "Rope", "KvWrite",
                         "Attention", "SiluMul", "MoeGate", "MoeExperts", "Copy", "Add",
                         "GatherRows"}) {
    std::string out;
    const int code = RunBinary("serve --model-path " + TestModelDir() + " --port 0", &out,
                               std::string("DEEPHARNESS_TEST_SELF_CHECK_PERTURB=") + op);
    EXPECT_EQ(code, 2) << op << "\n" << out;
    const std::string expected = std::string("error: self-check: ") + op + " differs between";
    EXPECT_NE(out.find(expected), std::string::npos) << op << "\n" << out;
    EXPECT_NE(out.find("--no-self-check"), std::string::npos) << out;
    EXPECT_EQ(out.find("ready on"), std::string::npos) << out;
    size_t errors = 0;
    for (size_t at = out.find("error:"); at != std::string::npos; at = out.find("error:", at + 1))
      ++errors;
    EXPECT_EQ(errors, 1u) << out;
  }
}

// The hook perturbs only what the check sees: with the check off the server starts, serves, and
// /health says nothing about a check.
TEST(SelfCheck, OffSkipsTheCheck) {
  setenv("DEEPHARNESS_TEST_SELF_CHECK_PERTURB", "MatMul", 1);
  for (const char* flag : {"--no-self-check", "--self-check=off"}) {
    ServerProcess server;
    const bool started = server.Start({flag});
    EXPECT_TRUE(started) << flag << "\n" << server.log();
    if (started) {
      EXPECT_TRUE(HealthSelfCheck(server).is_null()) << flag;
      EXPECT_EQ(server.Stop(), 0);
    }
  }
  unsetenv("DEEPHARNESS_TEST_SELF_CHECK_PERTURB");
  std::string out;
  EXPECT_EQ(RunBinary("serve --model-path " + TestModelDir() + " --port 0 --self-check=maybe", &out),
            2);
  EXPECT_EQ(out.rfind("error: --self-check: expected auto, full, first or off", 0), 0u) << out;
}

}  // namespace
}  // namespace dh::e2e
