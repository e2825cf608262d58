// Fuzz target: the compile-cache reader. First byte even: the bytes are a whole cache file
// (header, hashes, key, table) checked by CheckCompileCacheFile; odd: the rest is a table
// decoded by ParseTable directly (the hashes would otherwise keep the fuzzer out of it).
#include "fuzz/fuzz_target.h"
#include "weights/compile_cache.h"
#include "weights/compile_cache_format.h"

DH_FUZZ_TARGET(compile_cache) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    (void)dh::CheckCompileCacheFile(dh::fuzz::WriteInputFile(data + 1, size - 1), "");
  } else {
    (void)dh::compile_cache::ParseTable(std::span<const uint8_t>(data + 1, size - 1),
                                        uint64_t{1} << 30);
  }
  return 0;
}
