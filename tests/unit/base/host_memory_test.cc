// Host memory (base/host_memory.h): the reservation rule, alignment of small and large blocks,
// that a large block is writable end to end, and that on Linux its mapping carries the
// MADV_HUGEPAGE advice (VmFlags "hg" in /proc/self/smaps).
#include "base/host_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dh {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(HostMemoryTest, ReservationRoundsSmallTo64AndLargeToHugePagesWithinAnEighth) {
  EXPECT_EQ(HostMemoryReservation(0), 0u);
  EXPECT_EQ(HostMemoryReservation(1), 64u);
  EXPECT_EQ(HostMemoryReservation(65), 128u);
  EXPECT_EQ(HostMemoryReservation(2 * kMiB - 1), 2 * kMiB);  // small: 64-byte rounding
  EXPECT_EQ(HostMemoryReservation(2 * kMiB), 2 * kMiB);
  // 2 MiB + 1 would need 2 MiB more (nearly double): only 4 KiB rounding, the tail stays small.
  EXPECT_EQ(HostMemoryReservation(2 * kMiB + 1), 2 * kMiB + 4096);
  EXPECT_EQ(HostMemoryReservation(5 * kMiB + 1), 5 * kMiB + 4096);  // 6 MiB would add > 1/8
  EXPECT_EQ(HostMemoryReservation(9 * kMiB), 10 * kMiB);             // adds exactly 1/9
  EXPECT_EQ(HostMemoryReservation(15 * kMiB + 1), 16 * kMiB);  // adds < 1/8
  EXPECT_EQ(HostMemoryReservation(16 * kMiB + 1), 18 * kMiB);
  EXPECT_EQ(HostMemoryReservation(SIZE_MAX), 0u);  // out of range, no overflow
  EXPECT_EQ(AllocateHostMemory(SIZE_MAX), nullptr);
  EXPECT_EQ(AllocateHostMemory(0), nullptr);
}

TEST(HostMemoryTest, SmallBlocksAre64ByteAligned) {
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096}, 2 * kMiB - 1}) {
    void* p = AllocateHostMemory(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    std::memset(p, 0x5a, bytes);
    FreeHostMemory(p, bytes);
  }
}

// The VmFlags line of the /proc/self/smaps entry whose range holds `p` ("" when not found).
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(HostMemoryTest, LargeBlocksAreHugePageAlignedAndAdvised) {
  for (size_t bytes : {2 * kMiB, 3 * kMiB + 12345, 24 * kMiB + 7}) {
    void* p = AllocateHostMemory(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u) << bytes;
    auto* b = static_cast<unsigned char*>(p);
    std::memset(b, 0xa5, bytes);  // every byte asked for is writable
    EXPECT_EQ(b[0], 0xa5);
    EXPECT_EQ(b[bytes - 1], 0xa5);
#if defined(__linux__)
    if (std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
      const std::string flags = VmFlagsOf(p);
      ASSERT_FALSE(flags.empty()) << "no smaps entry for the block of " << bytes;
      EXPECT_NE(flags.find(" hg"), std::string::npos) << bytes << ": " << flags;
    }
#endif
    FreeHostMemory(p, bytes);
#if defined(__linux__)
    EXPECT_EQ(VmFlagsOf(p), "") << "block of " << bytes << " still mapped after the free";
#endif
  }
}

}  // namespace
}  // namespace dh
