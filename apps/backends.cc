// Backend registration for the binary: cpu (Highway, the default) and reference (plain loops).
#include "apps/backends.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/reference/reference_backend.h"
#include "backend/registry.h"

namespace dh::app {

void RegisterLinkedBackends() {
  RegisterBackend("reference", [](const BackendOptions& o) -> Result<std::unique_ptr<Backend>> {
    return std::unique_ptr<Backend>(new ReferenceBackend(o));
  });
  RegisterBackend("cpu", [](const BackendOptions& o) -> Result<std::unique_ptr<Backend>> {
    return std::unique_ptr<Backend>(new CpuBackend(o));
  });
}

}  // namespace dh::app
