// Fuzz target: a .safetensors file (header JSON, dtypes, shapes, offsets); every tensor it
// accepts is read end to end, so an offset the parser let through past the file shows up.
#include "fuzz/fuzz_target.h"
#include "io/safetensors.h"

DH_FUZZ_TARGET(safetensors) {
  const std::string path = dh::fuzz::WriteInputFile(data, size);
  auto file = dh::SafetensorsFile::Open(path, {.use_mmap = false});
  if (!file.ok()) return 0;
  unsigned sum = 0;
  for (const dh::TensorInfo& t : (*file)->tensors()) {
    const dh::Tensor view = t.View();
    const auto* bytes = static_cast<const uint8_t*>(view.data);
    for (size_t i = 0; i < view.nbytes(); ++i) sum += bytes[i];
    (void)t.ShapeString();
  }
  volatile unsigned sink = sum;
  (void)sink;
  return 0;
}
