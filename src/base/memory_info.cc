#include "base/memory_info.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace dh {

namespace {

std::optional<uint64_t> ReadNumberFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text;
  in >> text;
  if (text.empty() || text == "max") return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    if (value > (UINT64_MAX - 9) / 10) return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

std::optional<uint64_t> ReadMemAvailable() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

// The cgroup v2 directory of this process ("0::/path" in /proc/self/cgroup).
std::string OwnCgroupDir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  }
  return "/sys/fs/cgroup";
}

}  // namespace

std::optional<ResidentMemory> ParseSmapsRollup(const std::string& text) {
  ResidentMemory r;
  bool have_rss = false;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = line.substr(0, colon);
    uint64_t* field = name == "Rss"             ? &r.rss
                      : name == "Anonymous"     ? &r.anonymous
                      : name == "AnonHugePages" ? &r.anon_huge
                                                : nullptr;
    if (field == nullptr) continue;
    std::istringstream fields(line.substr(colon + 1));
    uint64_t kib = 0;
    std::string unit;
    if (!(fields >> kib >> unit) || unit != "kB" || kib > UINT64_MAX / 1024) continue;
    *field = kib * 1024;
    if (field == &r.rss) have_rss = true;
  }
  if (!have_rss) return std::nullopt;
  return r;
}

std::optional<ResidentMemory> ReadResidentMemory() {
  std::ifstream in("/proc/self/smaps_rollup");
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return ParseSmapsRollup(text.str());
}

std::optional<uint64_t> ParseByteSizeText(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str()) return std::nullopt;
  const std::string unit(end);
  double scale = 1;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "K" || unit == "KiB" || unit == "KB") scale = 1024.0;
  else if (unit == "M" || unit == "MiB" || unit == "MB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB" || unit == "GB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB" || unit == "TB") scale = 1024.0 * 1024 * 1024 * 1024;
  else return std::nullopt;
  if (!(value > 0) || value * scale > 1e18) return std::nullopt;
  return static_cast<uint64_t>(value * scale);
}

std::string FormatBytes(uint64_t bytes) {
  char text[64];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(text, sizeof(text), "%.1f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(text, sizeof(text), "%.1f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0) std::snprintf(text, sizeof(text), "%.1f KiB", b / 1024.0);
  else std::snprintf(text, sizeof(text), "%llu B", static_cast<unsigned long long>(bytes));
  return text;
}

MemoryInfo ReadMemoryInfo() {
  MemoryInfo info;
  if (const char* env = std::getenv("DEEPHARNESS_MEM_AVAILABLE"); env && *env) {
    info.mem_available = ParseByteSizeText(env);
  } else {
    info.mem_available = ReadMemAvailable();
  }
  std::string dir;
  if (const char* env = std::getenv("DEEPHARNESS_CGROUP_DIR"); env && *env) dir = env;
  else dir = OwnCgroupDir();
  info.cgroup_limit = ReadNumberFile(dir + "/memory.max");
  info.cgroup_usage = ReadNumberFile(dir + "/memory.current");
  if (!info.cgroup_limit) {  // cgroup v1
    info.cgroup_limit = ReadNumberFile("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    info.cgroup_usage = ReadNumberFile("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (info.cgroup_limit && *info.cgroup_limit >= (1ull << 60)) info.cgroup_limit.reset();
  }
  if (info.mem_available) {
    info.available = *info.mem_available;
    info.source = "MemAvailable";
  }
  if (info.cgroup_limit) {
    const uint64_t used = info.cgroup_usage.value_or(0);
    const uint64_t headroom = *info.cgroup_limit > used ? *info.cgroup_limit - used : 0;
    if (info.available == 0 || headroom < info.available) {
      info.available = headroom;
      info.source = "the cgroup memory limit";
    }
  }
  return info;
}

}  // namespace dh
