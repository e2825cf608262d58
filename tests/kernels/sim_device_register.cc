// Registers the simulated partial device backend (tests/sim_device) in this test binary, so the
// golden tests run on it like on every registered backend.
#include "backend/registry.h"
#include "sim_device/sim_device_backend.h"

namespace dh::test {
namespace {
DH_REGISTER_BACKEND("sim-device", [](const BackendOptions& o) -> Result<std::unique_ptr<Backend>> {
  return std::unique_ptr<Backend>(new SimDeviceBackend(o));
});
}  // namespace
}  // namespace dh::test
