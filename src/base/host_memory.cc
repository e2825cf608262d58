// Host memory: aligned_alloc for small blocks, 2 MiB-aligned anonymous mappings advised as
// transparent huge pages for large ones (host_memory.h).
#include "base/host_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>

namespace dh {
namespace {

constexpr size_t kSmallAlign = 64;
constexpr size_t kPageBytes = 4096;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Registered releasable ranges: start -> bytes.
struct Releasable {
  std::mutex mu;
  std::map<uintptr_t, size_t> ranges;
};
Releasable& Registry() {
  static Releasable* r = new Releasable();  // never destroyed: buffers may outlive statics
  return *r;
}

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
  RegisterReleasableMemory(data, reserve);
  return data;
}

void FreeHostMemory(void* data, size_t bytes) {
  if (data == nullptr) return;
  if (bytes < kHugePageBytes) {
    std::free(data);
  } else {
    UnregisterReleasableMemory(data);
    ::munmap(data, HostMemoryReservation(bytes));
  }
}

void RegisterReleasableMemory(const void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return;
  Releasable& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.ranges[reinterpret_cast<uintptr_t>(data)] = bytes;
}

void UnregisterReleasableMemory(const void* data) {
  Releasable& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.ranges.erase(reinterpret_cast<uintptr_t>(data));
}

size_t ReleaseHostPages(const void* data, size_t bytes) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(data);
  if (data == nullptr || bytes == 0 || b > UINTPTR_MAX - bytes) return 0;
  const uintptr_t e = b + bytes;
  const uintptr_t pb = RoundUp(b, kPageBytes), pe = e / kPageBytes * kPageBytes;
  if (pe <= pb) return 0;
  // Under the lock, so that the range cannot be unregistered and unmapped meanwhile.
  Releasable& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.ranges.upper_bound(b);  // the first range starting after b
  if (it == r.ranges.begin()) return 0;
  --it;
  if (e > it->first + it->second) return 0;  // not wholly inside one registered range
  if (::madvise(reinterpret_cast<void*>(pb), pe - pb, MADV_DONTNEED) != 0) return 0;
  return pe - pb;
}

}  // namespace dh
