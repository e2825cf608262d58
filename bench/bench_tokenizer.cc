// Tokenizer throughput on one core with the DeepSeek-V3 tokenizer: English prose (MB/s), a 1 MB
// string without spaces, and "a" x n for n = 10k, 100k, 1M (growth should be ~n log n).
// Needs the shared data folder (data/tokenizers/deepseek-v3, data/corpus/tinyshakespeare.txt):
// $DH_SHARED_DIR, else ../shared next to the source tree, else ../shared from the working dir.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace dh {
namespace {

std::filesystem::path SharedDir() {
  if (const char* env = std::getenv("DH_SHARED_DIR")) return env;
#ifdef DH_SOURCE_DIR
  return std::filesystem::path(DH_SOURCE_DIR) / ".." / "shared";
#else
  return std::filesystem::path("..") / "shared";
#endif
}
const std::filesystem::path kShared = SharedDir();

const Tokenizer* DeepSeek() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    auto t = Tokenizer::Load((kShared / "data" / "tokenizers" / "deepseek-v3").string());
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return tokenizer.get();
}

void Encode(benchmark::State& state, const std::string& text) {
  const Tokenizer* t = DeepSeek();
  if (t == nullptr) {
    state.SkipWithError("deepseek-v3 tokenizer not found under ../shared");
    return;
  }
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = t->Encode(text, false);
    if (!ids.ok()) {
      state.SkipWithError(ids.status().message().c_str());
      return;
    }
    tokens = ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
}

// The cache of word encodings is warm after the first iteration; the first pass is what a
// server sees for new text, the later ones what it sees for repeated vocabulary.
void BM_EncodeShakespeare(benchmark::State& state) {
  std::ifstream in(kShared / "data" / "corpus" / "tinyshakespeare.txt", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) {
    state.SkipWithError("tinyshakespeare.txt not found under ../shared");
    return;
  }
  Encode(state, ss.str());
}
BENCHMARK(BM_EncodeShakespeare)->Unit(benchmark::kMillisecond);

void BM_EncodeNoSpaces1MB(benchmark::State& state) {
  std::string letters;
  uint32_t x = 12345;
  while (letters.size() < (1u << 20)) {
    x = x * 1103515245u + 12345u;
    letters.push_back(static_cast<char>('a' + (x >> 16) % 26));
  }
  Encode(state, letters);
}
BENCHMARK(BM_EncodeNoSpaces1MB)->Unit(benchmark::kMillisecond);

void BM_EncodeRepeatedA(benchmark::State& state) {
  Encode(state, std::string(static_cast<size_t>(state.range(0)), 'a'));
}
BENCHMARK(BM_EncodeRepeatedA)
    ->Arg(10'000)
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dh

BENCHMARK_MAIN();
