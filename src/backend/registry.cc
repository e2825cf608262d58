// Backend registry (process-wide, registration happens once at start-up).
#include "backend/registry.h"

#include <map>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dh {
namespace {
std::mutex& RegistryMutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, BackendFactory>& Registry() {
  static std::map<std::string, BackendFactory> r;
  return r;
}
}  // namespace

void RegisterBackend(const std::string& name, BackendFactory factory) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[name] = std::move(factory);
}

std::vector<std::string> RegisteredBackends() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<std::string> names;
  for (const auto& [name, f] : Registry()) names.push_back(name);
  return names;
}

std::string RegisteredBackendList() { return fmt::format("{}", fmt::join(RegisteredBackends(), ", ")); }

Result<std::unique_ptr<Backend>> CreateBackend(const std::string& name,
                                               const BackendOptions& options) {
  BackendFactory factory;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(name);
    if (it != Registry().end()) factory = it->second;
  }
  if (!factory) {
    return Unsupported("--device: '{}' is not a backend of this build; registered backends: {}",
                       name, RegisteredBackendList());
  }
  return factory(options);
}

std::string_view WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kDense: return "dense";
    case WeightFormat::kFp8Block: return "fp8-block";
    case WeightFormat::kInt8: return "int8";
    case WeightFormat::kInt4: return "int4";
  }
  return "?";
}

}  // namespace dh
