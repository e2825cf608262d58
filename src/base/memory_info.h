// How much memory this process may still use: the smaller of /proc/meminfo's MemAvailable and
// the cgroup (v2 memory.max - memory.current, or v1 limit - usage) headroom. Used to refuse a
// KV pool or a model that cannot fit before allocating it (the alternative is the OOM killer).
//
// Tests and users can simulate a machine: DEEPHARNESS_MEM_AVAILABLE (bytes, or a size such as
// 4GiB) replaces MemAvailable, DEEPHARNESS_CGROUP_DIR points at a directory holding cgroup v2
// memory.max / memory.current files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dh {

struct MemoryInfo {
  std::optional<uint64_t> mem_available;   // MemAvailable (or the override)
  std::optional<uint64_t> cgroup_limit;    // memory.max (none when "max" or absent)
  std::optional<uint64_t> cgroup_usage;    // memory.current
  std::string source;                      // what decided `available`, for messages
  uint64_t available = 0;                  // what we may still allocate (0: unknown)
};

MemoryInfo ReadMemoryInfo();

// This process's resident memory, and how much of its anonymous memory transparent huge pages
// back (/proc/self/smaps_rollup: Rss, Anonymous, AnonHugePages). Decode can read weights faster
// from 2 MiB pages than from 4 KiB ones, and on a nearly full machine the kernel may grant few
// (bench/README.md "Zen 5, session 20"), so `deepharness bench` reports it.
struct ResidentMemory {
  uint64_t rss = 0;
  uint64_t anonymous = 0;
  uint64_t anon_huge = 0;
};
// nullopt where the file is missing (not Linux) or lacks the Rss line.
std::optional<ResidentMemory> ReadResidentMemory();
// The same from smaps_rollup's text ("Name:   N kB" lines; the others are skipped).
std::optional<ResidentMemory> ParseSmapsRollup(const std::string& text);

// "8GiB", "512MiB", "1.5G", "100" -> bytes; nullopt when not a positive size.
std::optional<uint64_t> ParseByteSizeText(const std::string& text);

// 1536 MiB -> "1.5 GiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace dh
