// Registers the CPU backend (Highway kernels, the default device) as "cpu".
#include "backend/cpu/cpu_backend.h"
#include "backend/registry.h"

namespace dh {
namespace {
DH_REGISTER_BACKEND("cpu", [](const BackendOptions& o) -> Result<std::unique_ptr<Backend>> {
  return std::unique_ptr<Backend>(new CpuBackend(o));
});
}  // namespace
}  // namespace dh
