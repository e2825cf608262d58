// fuzz_replay TARGET PATH...: runs fuzz target TARGET (tests/fuzz/fuzz_target.h) over every file
// named or found (recursively) under the PATHs. The normal build's ctest replays the committed
// corpora this way, so CI needs no clang; a crash or abort fails the test.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "fuzz/fuzz_target.h"

namespace dh::fuzz {
std::map<std::string, FuzzFn>& Targets();
}

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  auto& targets = dh::fuzz::Targets();
  if (argc < 3 || !targets.count(argv[1])) {
    std::fprintf(stderr, "usage: fuzz_replay TARGET PATH...; targets:");
    for (const auto& [name, fn] : targets) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  const dh::fuzz::FuzzFn fn = targets[argv[1]];
  std::vector<fs::path> files;
  for (int i = 2; i < argc; ++i) {
    const fs::path p = argv[i];
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "error: %s: no such file or directory\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "error: no inputs under the given paths\n");
    return 2;
  }
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    std::fprintf(stderr, "%s\n", f.c_str());
    fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%s: %zu inputs replayed\n", argv[1], files.size());
  return 0;
}
