// Fuzz targets (docs/reliability.md "Fuzzing"). Each tests/fuzz/<name>_fuzz.cc defines one
// target with DH_FUZZ_TARGET(name) { ... } over (data, size). Built two ways:
//   - `make fuzz` (clang, DH_LIBFUZZER): one libFuzzer binary per target (fuzz_<name>);
//   - the normal build: every target registers into one `fuzz_replay` binary, and a ctest per
//     target replays its committed corpus tests/fuzz/corpus/<name>/ (no clang needed).
// A target must never abort on any input: errors come back as Status and are ignored here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dh::fuzz {

using FuzzFn = int (*)(const uint8_t* data, size_t size);
bool RegisterTarget(const char* name, FuzzFn fn);

// A file whose bytes are `data` (an in-memory file, reused across calls), for parsers that
// read paths; the returned path stays valid until the next call.
std::string WriteInputFile(const uint8_t* data, size_t size);

}  // namespace dh::fuzz

#define DH_FUZZ_CONCAT_(a, b) a##b
#define DH_FUZZ_CONCAT(a, b) DH_FUZZ_CONCAT_(a, b)

#ifdef DH_LIBFUZZER
#define DH_FUZZ_TARGET(name)                                                     \
  static int DH_FUZZ_CONCAT(FuzzOne_, name)(const uint8_t* data, size_t size);   \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {      \
    return DH_FUZZ_CONCAT(FuzzOne_, name)(data, size);                           \
  }                                                                              \
  static int DH_FUZZ_CONCAT(FuzzOne_, name)(const uint8_t* data, size_t size)
#else
#define DH_FUZZ_TARGET(name)                                                     \
  static int DH_FUZZ_CONCAT(FuzzOne_, name)(const uint8_t* data, size_t size);   \
  [[maybe_unused]] static const bool DH_FUZZ_CONCAT(registered_, name) =         \
      ::dh::fuzz::RegisterTarget(#name, DH_FUZZ_CONCAT(FuzzOne_, name));         \
  static int DH_FUZZ_CONCAT(FuzzOne_, name)(const uint8_t* data, size_t size)
#endif
