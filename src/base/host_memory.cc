// Host memory: aligned_alloc for small blocks, 2 MiB-aligned anonymous mappings advised as
// transparent huge pages for large ones (host_memory.h).
#include "base/host_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

namespace dh {
namespace {

constexpr size_t kSmallAlign = 64;
constexpr size_t kPageBytes = 4096;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

size_t HostMemoryReservation(size_t bytes) {
  if (bytes == 0 || bytes > (SIZE_MAX >> 2)) return 0;
  if (bytes < kHugePageBytes) return RoundUp(bytes, kSmallAlign);
  const size_t huge = RoundUp(bytes, kHugePageBytes);
  return huge - bytes <= bytes / 8 ? huge : RoundUp(bytes, kPageBytes);
}

void* AllocateHostMemory(size_t bytes) {
  const size_t reserve = HostMemoryReservation(bytes);
  if (reserve == 0) return nullptr;
  if (bytes < kHugePageBytes) return std::aligned_alloc(kSmallAlign, reserve);
  // Map one huge page more than needed, then unmap the unaligned head and the tail.
  const size_t span = reserve + kHugePageBytes;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = RoundUp(base, kHugePageBytes);
  if (start > base) ::munmap(p, start - base);
  const uintptr_t end = start + reserve;
  if (base + span > end) ::munmap(reinterpret_cast<void*>(end), base + span - end);
  void* data = reinterpret_cast<void*>(start);
#if defined(MADV_HUGEPAGE)
  ::madvise(data, reserve, MADV_HUGEPAGE);  // a hint: where refused, 4 KiB pages work the same
#endif
  return data;
}

void FreeHostMemory(void* data, size_t bytes) {
  if (data == nullptr) return;
  if (bytes < kHugePageBytes) {
    std::free(data);
  } else {
    ::munmap(data, HostMemoryReservation(bytes));
  }
}

}  // namespace dh
