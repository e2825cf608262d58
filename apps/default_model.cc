// Default model lookup relative to /proc/self/exe.
#include "apps/default_model.h"

#include <filesystem>
#include <system_error>
#include <vector>

namespace dh::app {
namespace {

std::vector<std::filesystem::path> Candidates() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  const std::filesystem::path bindir = exe.parent_path();
  return {bindir / ".." / "models" / kDefaultModelName,
          bindir / ".." / "share" / "deepharness" / "models" / kDefaultModelName};
}

}  // namespace

std::string DefaultModelPath() {
  for (const auto& dir : Candidates()) {
    std::error_code ec;
    if (std::filesystem::is_directory(dir, ec) &&
        std::filesystem::exists(dir / "config.json", ec)) {
      return std::filesystem::weakly_canonical(dir, ec).string();
    }
  }
  return "";
}

std::string DefaultModelCandidates() {
  std::string out;
  for (const auto& dir : Candidates()) {
    if (!out.empty()) out += ", ";
    out += dir.lexically_normal().string();
  }
  return out;
}

}  // namespace dh::app
