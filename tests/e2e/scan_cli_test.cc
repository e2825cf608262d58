// `deepharness scan` through the real binary: exit codes (0 / 1 with --fail-on / 2 on bad input
// with one stderr line), the baseline round trip, and SARIF output validated against the official
// SARIF 2.1.0 schema with ajv (npm packages in tests/sarif; installed there with `npm ci` from the
// committed lockfile on first run; the check skips, saying why, when npm is unavailable).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "server_fixture.h"

namespace {

namespace fs = std::filesystem;
using dh::e2e::Shell;
using dh::e2e::ShellRun;

std::string Fixture() { return std::string(DH_SOURCE_DIR) + "/tests/fixtures/scan/cuda_service"; }
std::string Bin() { return std::string("'") + DH_BINARY + "'"; }

fs::path TempDir() {
  const fs::path d = fs::temp_directory_path() / ("dh_scan_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

TEST(ScanCliTest, ExitCodesAndBaseline) {
  const fs::path tmp = TempDir();
  ShellRun r = Shell(Bin() + " scan '" + Fixture() + "' --format json --output '" +
                (tmp / "r.json").string() + "'", true);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::file_size(tmp / "r.json") > 100);
  r = Shell(Bin() + " scan '" + Fixture() + "' --fail-on costly > /dev/null", true);
  EXPECT_EQ(r.status, 1) << r.out;
  r = Shell(Bin() + " scan '" + Fixture() + "/deploy' --fail-on costly --target ascend > /dev/null", true);
  EXPECT_EQ(r.status, 0) << r.out;  // deploy files hold no costly findings
  // A baseline of today's findings makes --fail-on any pass.
  r = Shell(Bin() + " scan '" + Fixture() + "' --write-baseline '" + (tmp / "base.tsv").string() +
            "' > /dev/null", true);
  EXPECT_EQ(r.status, 0) << r.out;
  r = Shell(Bin() + " scan '" + Fixture() + "' --baseline '" + (tmp / "base.tsv").string() +
            "' --fail-on any", true);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Findings: 0"), std::string::npos) << r.out;
  // Bad input: exit 2, one line on stderr naming the flag or path.
  for (const std::string& args :
       {std::string(" scan . --target tpu"), std::string(" scan /no/such/dir"),
        std::string(" scan . --format xml"), std::string(" scan . --fail-on sometimes")}) {
    r = Shell("(" + Bin() + args + " 2>&1 >/dev/null)", true);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
  fs::remove_all(tmp);
}

TEST(ScanCliTest, SarifValidatesAgainstTheOfficialSchema) {
  const fs::path tmp = TempDir();
  const fs::path sarif = tmp / "scan.sarif";
  ShellRun r = Shell(Bin() + " scan '" + Fixture() + "' --format sarif --output '" + sarif.string() + "'", true);
  ASSERT_EQ(r.status, 0) << r.out;
  // An empty scan is valid SARIF too.
  const fs::path empty = tmp / "empty.sarif";
  r = Shell(Bin() + " scan '" + std::string(DH_SOURCE_DIR) + "/docs' --format sarif --output '" +
            empty.string() + "'", true);
  ASSERT_EQ(r.status, 0) << r.out;

  if (Shell("node --version && npm --version", true).status != 0) {
    GTEST_SKIP() << "node/npm not installed: SARIF schema validation skipped";
  }
  const fs::path dir = fs::path(DH_SOURCE_DIR) / "tests" / "sarif";
  if (!fs::exists(dir / "node_modules" / "ajv-draft-04" / "package.json") ||
      !fs::exists(dir / "node_modules" / "@microsoft" / "jest-sarif" / "package.json")) {
    r = Shell("cd '" + dir.string() + "' && timeout 300 npm ci --no-audit --no-fund", true);
    if (r.status != 0) GTEST_SKIP() << "could not install tests/sarif npm packages:\n" << r.out;
  }
  r = Shell("cd '" + dir.string() + "' && node validate.mjs '" + sarif.string() + "' '" +
            empty.string() + "'", true);
  EXPECT_EQ(r.status, 0) << r.out;
  // The validator is not a rubber stamp: a run without a tool driver is rejected.
  {
    std::ofstream bad(tmp / "bad.sarif");
    bad << R"({"version": "2.1.0", "runs": [{"tool": {}, "results": []}]})";
  }
  r = Shell("cd '" + dir.string() + "' && node validate.mjs '" + (tmp / "bad.sarif").string() + "'", true);
  EXPECT_EQ(r.status, 1) << r.out;
  fs::remove_all(tmp);
}

}  // namespace
