// Perplexity of every integer-dot kernel (issue 22: bound +0.5 %) against the exact f32-product
// path: `deepharness perplexity` on the embedded model's validation text (models/shakespeare-v3,
// the text of quant_perplexity_test.cc, its first 8192 tokens in windows of 256) with int8, int4
// and int4 with lm_head in int8 (--quant int4,lm_head=int8, so lm_head runs on the integer
// kernels too) quantized at load, run with DH_INTEGER_DOT=off and DH_INTEGER_DOT=<path> for each
// kernel the CPU has (avx2, avxvnni, vnni512, read from /proc/cpuinfo). Each path must also move
// the perplexity (> 1e-7 relative), so the test cannot pass with the integer kernels off.
// Bf16DotPerplexity does the same for the bf16 weights as stored (x rounded to bf16 for
// `vdpbf16ps`, DH_BF16_DOT=auto, against DH_BF16_DOT=off) on CPUs with AVX512-BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server_fixture.h"

namespace {

namespace fs = std::filesystem;
using dh::e2e::RunShell;

const fs::path kModel = fs::path(DH_SOURCE_DIR) / "models/shakespeare-v3";

// Whether /proc/cpuinfo lists CPU flag f.
bool HasFlag(const char* f) {
  static const std::string flags = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("flags", 0) == 0) return " " + line.substr(line.find(':') + 1) + " ";
    }
    return std::string();
  }();
  return flags.find(std::string(" ") + f + " ") != std::string::npos;
}

// The integer kernels this CPU has, by the flags the kernels check.
std::vector<std::string> CpuPaths() {
  std::vector<std::string> paths;
  if (HasFlag("avx2") && HasFlag("fma")) paths.push_back("avx2");
  if (HasFlag("avx2") && HasFlag("avx_vnni")) paths.push_back("avxvnni");
  if (HasFlag("avx512f") && HasFlag("avx512bw") && HasFlag("avx512vl") && HasFlag("avx512dq") &&
      HasFlag("avx512_vnni")) {
    paths.push_back("vnni512");
  }
  return paths;
}

const fs::path kCorpus = fs::path(DH_SOURCE_DIR) / "../shared/data/corpus/tinyshakespeare.txt";

// The embedded model's validation text (the corpus from eval.json's offset) in a file named
// `name` under the temporary directory; returns its path.
fs::path ValidationFile(const std::string& name) {
  std::ifstream eval_in(kModel / "eval.json");
  const auto eval = nlohmann::json::parse(eval_in);
  std::ifstream in(kCorpus, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const fs::path val_file = fs::temp_directory_path() / name;
  std::ofstream(val_file, std::ios::binary)
      << ss.str().substr(eval["validation_char_offset"].get<size_t>());
  return val_file;
}

// `deepharness perplexity` of the embedded model on val_file with environment `env` and `quant`.
double Perplexity(const fs::path& val_file, const std::string& env, const std::string& quant) {
  int code = 0;
  const std::string out = RunShell(
      env + " " + std::string(DH_BINARY) +
          " perplexity -q --json --add-special-tokens --threads 2 --model-path " +
          kModel.string() + " --file " + val_file.string() +
          " --context 256 --stride 256 --max-tokens 8192 --quant " + quant,
      &code);
  EXPECT_EQ(code, 0) << env << " " << quant << ": " << out;
  return code == 0 ? nlohmann::json::parse(out)["perplexity"].get<double>() : NAN;
}

TEST(IntegerDotPerplexity, EveryPathWithinHalfAPercentOfExact) {
  if (!fs::exists(kCorpus)) GTEST_SKIP() << "no " << kCorpus << ": perplexity not checked";
  const std::vector<std::string> paths = CpuPaths();
  if (paths.empty()) GTEST_SKIP() << "CPU has no integer-dot kernel";
  const fs::path val_file = ValidationFile("dh_intdot_shakespeare_val.txt");
  for (const char* quant : {"int8", "int4", "int4,lm_head=int8"}) {
    const double exact = Perplexity(val_file, "DH_INTEGER_DOT=off", quant);
    ASSERT_TRUE(std::isfinite(exact)) << quant;
    for (const std::string& path : paths) {
      const double ppl = Perplexity(val_file, "DH_INTEGER_DOT=" + path, quant);
      const double rel = (ppl - exact) / exact;
      std::printf("%s %s: perplexity %.4f (exact %.4f, %+.3f %%, bound +0.5 %%)\n", quant,
                  path.c_str(), ppl, exact, 100 * rel);
      EXPECT_LE(rel, 0.005) << quant << " " << path;
      EXPECT_GT(std::fabs(rel), 1e-7) << quant << " " << path << ": perplexity unchanged";
    }
  }
}

// The bf16 weights as stored: x rounded to bf16 in every bf16 matmul (DH_BF16_DOT=auto: on
// `vdpbf16ps` from 4 rows, into the f32 kernels below) against the exact f32 x (off); and the
// same weights quantized to FP8 at load (x * block scale rounded to bf16 for `vdpbf16ps` at every
// row count, gemm_bf16.h). Same bound; the perplexity must move.
TEST(Bf16DotPerplexity, WithinHalfAPercentOfExact) {
  if (!fs::exists(kCorpus)) GTEST_SKIP() << "no " << kCorpus << ": perplexity not checked";
  if (!HasFlag("avx512_bf16") || !HasFlag("avx512bw") || !HasFlag("avx512vl")) {
    GTEST_SKIP() << "CPU has no AVX512-BF16: bf16 weights always take the exact x";
  }
  const fs::path val_file = ValidationFile("dh_bf16dot_shakespeare_val.txt");
  for (const char* quant : {"none", "fp8"}) {
    const double exact = Perplexity(val_file, "DH_BF16_DOT=off", quant);
    ASSERT_TRUE(std::isfinite(exact)) << quant;
    const double ppl = Perplexity(val_file, "DH_BF16_DOT=auto", quant);
    const double rel = (ppl - exact) / exact;
    std::printf("bf16 dot, --quant %s: perplexity %.4f (exact %.4f, %+.3f %%, bound +0.5 %%)\n",
                quant, ppl, exact, 100 * rel);
    EXPECT_LE(rel, 0.005) << quant;
    EXPECT_GT(std::fabs(rel), 1e-7) << quant << ": perplexity unchanged: is x rounded?";
  }
}

}  // namespace
