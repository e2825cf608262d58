// Registers the reference backend (plain loops on host memory) as "reference".
#include "backend/reference/reference_backend.h"
#include "backend/registry.h"

namespace dh {
namespace {
DH_REGISTER_BACKEND("reference",
                    [](const BackendOptions& o) -> Result<std::unique_ptr<Backend>> {
                      return std::unique_ptr<Backend>(new ReferenceBackend(o));
                    });
}  // namespace
}  // namespace dh
