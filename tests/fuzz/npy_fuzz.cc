// Fuzz target: .npy files (magic, version, header dict, dtype, shape vs data size).
#include "fuzz/fuzz_target.h"
#include "io/npy.h"

DH_FUZZ_TARGET(npy) {
  auto array = dh::ReadNpy(dh::fuzz::WriteInputFile(data, size));
  if (array.ok()) {
    size_t n = 1;
    for (int64_t d : array->shape) n *= static_cast<size_t>(d);
    volatile size_t sink = n + array->bytes.size();
    (void)sink;
  }
  return 0;
}
