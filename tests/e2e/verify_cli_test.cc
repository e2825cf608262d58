// `deepharness verify` through the real binary: the exit codes (0 clean, 1 problems found, 2 could
// not run, with one `error:` line), a sha256sum-format manifest that matches and one that does
// not, and the JSON report's fields (checks run, problems, the bytes of each read path).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "server_fixture.h"

namespace {

namespace fs = std::filesystem;
using dh::e2e::Shell;
using dh::e2e::ShellRun;

std::string Bin() { return std::string("'") + DH_BINARY + "'"; }
std::string Quote(const fs::path& p) { return "'" + p.string() + "'"; }

class VerifyCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = fs::temp_directory_path() / ("dh_verify_cli_" + std::to_string(::getpid()));
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
    model_ = tmp_ / "ds_v3_fp8";
    fs::copy(fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures/ds_v3_fp8", model_,
             fs::copy_options::recursive);
    // The manifest as sha256sum writes it, paths relative to the model directory.
    const ShellRun r = Shell("cd " + Quote(model_) +
                                " && sha256sum config.json model.safetensors > ../manifest.sha256");
    ASSERT_EQ(r.status, 0);
  }
  void TearDown() override { fs::remove_all(tmp_); }
  fs::path tmp_, model_;
};

TEST_F(VerifyCliTest, CleanCopyWithItsManifestExitsZero) {
  const ShellRun r = Shell(Bin() + " verify --model-path " + Quote(model_) + " --manifest " +
                              Quote(tmp_ / "manifest.sha256") + " --json --threads 2");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["clean"].get<bool>());
  EXPECT_EQ(j["problems"].size(), 0u);
  const std::vector<std::string> checks = j["checks"];
  for (const char* c : {"sha256", "structure", "fp8-scales", "packing", "tensors", "values"})
    EXPECT_NE(std::find(checks.begin(), checks.end(), c), checks.end()) << c;
  EXPECT_EQ(j["sha256_bytes"].get<uint64_t>(), fs::file_size(model_ / "config.json") +
                                                   fs::file_size(model_ / "model.safetensors"));
  const uint64_t values = j["values_bytes"];
  EXPECT_GT(values, 0u);
  EXPECT_EQ(j["values_read"]["mapped"].get<uint64_t>() + j["values_read"]["direct"].get<uint64_t>() +
                j["values_read"]["buffered"].get<uint64_t>(),
            values);
}

TEST_F(VerifyCliTest, ChangedFileExitsOneAndNamesIt) {
  // One byte of the weights' data region changed: the hash no longer matches.
  {
    std::fstream f(model_ / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 1));
  }
  const ShellRun r = Shell(Bin() + " verify --model-path " + Quote(model_) + " --manifest " +
                              Quote(tmp_ / "manifest.sha256") + " --quiet");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("sha256      model.safetensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("result: "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("config.json"), std::string::npos) << r.out;  // that one still matches
}

TEST_F(VerifyCliTest, CouldNotRunExitsTwoWithOneLine) {
  {
    std::ofstream bad(tmp_ / "bad.sha256");
    bad << "not-a-hash  model.safetensors\n";
  }
  for (const std::string& args :
       {" verify --model-path " + Quote(tmp_ / "no_such_dir"),
        " verify --model-path " + Quote(model_) + " --manifest " + Quote(tmp_ / "missing.sha256"),
        " verify --model-path " + Quote(model_) + " --manifest " + Quote(tmp_ / "bad.sha256"),
        " verify --model-path " + Quote(model_) + " --threads -1",
        " verify --model-path " + Quote(model_) + " --max-abs 0"}) {
    const ShellRun r = Shell("(" + Bin() + args + " 2>&1 >/dev/null)");
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << args << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << ": " << r.out;
  }
}

}  // namespace
