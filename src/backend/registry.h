// Backend registry. Each backend folder src/backend/<name>/ registers itself with one
// DH_REGISTER_BACKEND line in its <name>_register.cc; CMake links those registration objects
// into every binary that links the backends (docs/backends.md), so there is no central list.
// Everything else asks for a backend by name ("cpu", "reference", "cuda", ...).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"

namespace dh {

using BackendFactory = std::function<Result<std::unique_ptr<Backend>>(const BackendOptions&)>;

void RegisterBackend(const std::string& name, BackendFactory factory);
std::vector<std::string> RegisteredBackends();
// Error names the device and lists the available ones.
Result<std::unique_ptr<Backend>> CreateBackend(const std::string& name, const BackendOptions& options);
// "cpu, reference" (sorted): for help texts and errors.
std::string RegisteredBackendList();

// A static registrar: DH_REGISTER_BACKEND("name", factory) at namespace scope in a backend
// folder's *_register.cc registers the factory before main() runs.
struct BackendRegistrar {
  BackendRegistrar(const char* name, BackendFactory factory) {
    RegisterBackend(name, std::move(factory));
  }
};
#define DH_BACKEND_CONCAT_INNER(a, b) a##b
#define DH_BACKEND_CONCAT(a, b) DH_BACKEND_CONCAT_INNER(a, b)
#define DH_REGISTER_BACKEND(name, factory)                                            \
  [[maybe_unused]] static const ::dh::BackendRegistrar DH_BACKEND_CONCAT(         \
      dh_backend_registrar_, __LINE__)(name, factory)

}  // namespace dh
