// Host memory (base/host_memory.h): the reservation rule, alignment of small and large blocks,
// that a large block is writable end to end, and that on Linux its mapping carries the
// MADV_HUGEPAGE advice (VmFlags "hg" in /proc/self/smaps); which memory ReleaseHostPages hands
// back, and that it hands back only the whole pages inside the range.
#include "base/host_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

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

#if defined(__linux__)
// How many of the 4 KiB pages of [p, p + bytes) (page aligned) are resident (mincore).
size_t ResidentPages(const void* p, size_t bytes) {
  std::vector<unsigned char> v(bytes / 4096);
  if (::mincore(const_cast<void*>(p), bytes, v.data()) != 0) return SIZE_MAX;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}
#endif

// A large block's pages inside a range go back to the system (not resident, reading as zero);
// the bytes of the pages the range only partly covers keep their values; memory that
// AllocateHostMemory did not map (the heap, a freed block) is left alone.
TEST(HostMemoryTest, ReleasesOnlyWholePagesInsideRegisteredMemory) {
  const size_t bytes = 4 * kMiB;
  auto* b = static_cast<unsigned char*>(AllocateHostMemory(bytes));
  ASSERT_NE(b, nullptr);
  std::memset(b, 0x5a, bytes);
  // [100000, 3000000): pages 25..732 lie wholly inside (page 24 holds bytes 98304..102399).
  const size_t begin = 100000, end = 3000000;
  const size_t first_page = (begin + 4095) / 4096, last_page = end / 4096;  // [first, last)
  EXPECT_EQ(ReleaseHostPages(b + begin, end - begin), (last_page - first_page) * 4096);
#if defined(__linux__)
  EXPECT_EQ(ResidentPages(b + first_page * 4096, (last_page - first_page) * 4096), 0u);
#endif
  for (size_t i : {size_t{0}, begin - 1, begin, first_page * 4096 - 1, last_page * 4096,
                   end - 1, end, bytes - 1}) {
    EXPECT_EQ(b[i], 0x5a) << i;  // outside the whole pages: kept
  }
  EXPECT_EQ(b[first_page * 4096], 0) << "a released page reads as zero";
  EXPECT_EQ(b[last_page * 4096 - 1], 0);
  // Past the block's end, and ranges with no whole page: nothing.
  EXPECT_EQ(ReleaseHostPages(b + bytes - 4096, 8192), 0u);
  EXPECT_EQ(ReleaseHostPages(b + 10, 4000), 0u);
  EXPECT_EQ(ReleaseHostPages(nullptr, 4096), 0u);
  FreeHostMemory(b, bytes);
  EXPECT_EQ(ReleaseHostPages(b, 8192), 0u) << "a freed block is no longer registered";

  std::vector<unsigned char> heap(3 * kMiB, 0x33);
  EXPECT_EQ(ReleaseHostPages(heap.data(), heap.size()), 0u);
  EXPECT_EQ(heap[heap.size() / 2], 0x33);
  // A mapping registered by its owner (a compile cache read into memory) is released too.
#if defined(__linux__)
  void* m = ::mmap(nullptr, kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  std::memset(m, 1, kMiB);
  EXPECT_EQ(ReleaseHostPages(m, kMiB), 0u);
  RegisterReleasableMemory(m, kMiB);
  EXPECT_EQ(ReleaseHostPages(m, kMiB), kMiB);
  EXPECT_EQ(ResidentPages(m, kMiB), 0u);
  UnregisterReleasableMemory(m);
  ::munmap(m, kMiB);
#endif
}

}  // namespace
}  // namespace dh
