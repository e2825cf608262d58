// `deepharness compile` and the compile cache through the real binary: compile writes one file
// and reports an up-to-date one; logits and `run` output with the cache equal those without; a
// damaged file is logged, ignored and rewritten by the next load; --no-compile-cache and
// XDG_CACHE_HOME behave as documented (docs/compile-cache.md).
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures";
const fs::path kEmbedded = fs::path(DH_SOURCE_DIR) / "models/shakespeare-v3";

struct CliResult {
  int code = -1;
  std::string out, err;
};

// Runs the binary with `args` (and optional environment assignments in `env`), capturing stdout
// and stderr.
CliResult Deepharness(const std::string& args, const fs::path& tmp, const std::string& env = "") {
  const fs::path err_file = tmp / "stderr.txt";
  const std::string cmd =
      env + " " + std::string(DH_BINARY) + " " + args + " 2>" + err_file.string();
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  return r;
}

class CompileCacheCli : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> n{0};
    tmp_ = fs::temp_directory_path() /
           ("dh_compile_cli_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
  std::vector<fs::path> CacheFiles(const fs::path& dir) const {
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) files.push_back(e.path());
    return files;
  }
  std::string ReadFile(const fs::path& p) const {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  fs::path tmp_;
};

TEST_F(CompileCacheCli, CompiledLogitsEqualCheckpointLogits) {
  const fs::path cache = tmp_ / "cache";
  const std::string model = "--model-path " + (kFixtures / "ds_v2_lite").string() + " --quant int4";
  CliResult c = Deepharness("compile " + model + " --output " + cache.string(), tmp_);
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("compiled "), std::string::npos) << c.out;
  auto files = CacheFiles(cache);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].extension(), ".dhc");
  EXPECT_NE(c.out.find(files[0].string()), std::string::npos) << c.out;

  CliResult again = Deepharness("compile " + model + " --output " + cache.string(), tmp_);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("up to date: " + files[0].string()), std::string::npos) << again.out;

  const std::string ids = " --token-ids 5,17,99,3,250 ";
  CliResult with = Deepharness("logits " + model + ids + "--compile-cache " + cache.string() + " -o " +
                             (tmp_ / "with.npy").string(), tmp_);
  ASSERT_EQ(with.code, 0) << with.err;
  EXPECT_NE(with.err.find("compile cache: loaded " + files[0].string()), std::string::npos)
      << with.err;
  CliResult mapped = Deepharness("logits " + model + ids + "--mmap --compile-cache " + cache.string() +
                               " -o " + (tmp_ / "mapped.npy").string(), tmp_);
  ASSERT_EQ(mapped.code, 0) << mapped.err;
  EXPECT_NE(mapped.err.find("mapped"), std::string::npos) << mapped.err;
  CliResult without = Deepharness("logits " + model + ids + "--no-compile-cache --compile-cache " +
                                cache.string() + " -o " + (tmp_ / "without.npy").string(), tmp_);
  ASSERT_EQ(without.code, 0) << without.err;
  EXPECT_EQ(without.err.find("compile cache"), std::string::npos) << without.err;
  const std::string a = ReadFile(tmp_ / "with.npy");
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, ReadFile(tmp_ / "mapped.npy"));
  EXPECT_EQ(a, ReadFile(tmp_ / "without.npy"));

  // Other options (no --quant): another file, not this one.
  CliResult other = Deepharness("logits --model-path " + (kFixtures / "ds_v2_lite").string() + ids +
                              "--compile-cache " + cache.string() + " -o " +
                              (tmp_ / "other.npy").string(), tmp_);
  ASSERT_EQ(other.code, 0) << other.err;
  EXPECT_EQ(other.err.find("compile cache"), std::string::npos) << other.err;
  EXPECT_EQ(CacheFiles(cache).size(), 1u);
}

TEST_F(CompileCacheCli, RunUsesTheCacheAndRebuildsADamagedOne) {
  if (!fs::exists(kEmbedded / "model.safetensors")) GTEST_SKIP() << "no embedded model";
  const fs::path cache = tmp_ / "cache";
  const std::string model = "--model-path " + kEmbedded.string();
  CliResult c = Deepharness("compile " + model + " --output " + cache.string(), tmp_);
  ASSERT_EQ(c.code, 0) << c.err;
  auto files = CacheFiles(cache);
  ASSERT_EQ(files.size(), 1u);
  const std::string run = "run " + model +
                          " --prompt 'To be, or not' --max-tokens 12 --temperature 0 --raw ";
  CliResult plain = Deepharness(run + "--no-compile-cache", tmp_);
  ASSERT_EQ(plain.code, 0) << plain.err;
  CliResult cached = Deepharness(run + "--compile-cache " + cache.string(), tmp_);
  ASSERT_EQ(cached.code, 0) << cached.err;
  EXPECT_NE(cached.err.find("compile cache: loaded"), std::string::npos) << cached.err;
  EXPECT_EQ(cached.out, plain.out);

  // Garbage in the cache file: logged, the checkpoint is loaded, and the file is rewritten.
  std::ofstream(files[0], std::ios::binary | std::ios::trunc) << "not a cache file at all";
  CliResult damaged = Deepharness(run + "--compile-cache " + cache.string(), tmp_);
  ASSERT_EQ(damaged.code, 0) << damaged.err;
  EXPECT_NE(damaged.err.find("compile cache: not using"), std::string::npos) << damaged.err;
  EXPECT_NE(damaged.err.find("shorter than"), std::string::npos) << damaged.err;
  EXPECT_NE(damaged.err.find("compile cache: wrote"), std::string::npos) << damaged.err;
  EXPECT_EQ(damaged.out, plain.out);
  CliResult healed = Deepharness(run + "--compile-cache " + cache.string(), tmp_);
  ASSERT_EQ(healed.code, 0) << healed.err;
  EXPECT_NE(healed.err.find("compile cache: loaded"), std::string::npos) << healed.err;
  EXPECT_EQ(healed.out, plain.out);
  EXPECT_EQ(CacheFiles(cache).size(), 1u);
}

TEST_F(CompileCacheCli, DefaultDirectoryAndBadFlags) {
  const std::string model = "--model-path " + (kFixtures / "llama_f32").string();
  CliResult c = Deepharness("compile " + model, tmp_, "XDG_CACHE_HOME=" + tmp_.string());
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(CacheFiles(tmp_ / "deepharness").size(), 1u);
  CliResult info = Deepharness("info --json " + model, tmp_, "XDG_CACHE_HOME=" + tmp_.string());
  ASSERT_EQ(info.code, 0) << info.err;
  EXPECT_NE(info.err.find("compile cache: loaded"), std::string::npos) << info.err;

  CliResult bad = Deepharness("compile --no-compile-cache " + model, tmp_);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("error: --no-compile-cache"), std::string::npos) << bad.err;

  // An output path that cannot be a directory: one error line, a failing exit code.
  std::ofstream(tmp_ / "file") << "x";
  CliResult unwritable = Deepharness("compile " + model + " --output " + (tmp_ / "file").string(), tmp_);
  EXPECT_NE(unwritable.code, 0);
  EXPECT_NE(unwritable.err.find("error: "), std::string::npos) << unwritable.err;
}

}  // namespace
