// Backend registry: apps/ and tests/ register the concrete backends they link; everything else
// asks for one by name ("cpu", "reference", "cuda", ...).
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

}  // namespace dh
