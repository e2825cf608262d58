// Host memory for the backends' buffers (weights, KV cache, activations).
//
// Small blocks (under kHugePageBytes) come from aligned_alloc, 64-byte aligned. Large ones are
// anonymous mappings aligned to 2 MiB and advised MADV_HUGEPAGE, so that with transparent huge
// pages in `madvise` (or `always`) mode the kernel backs them with 2 MiB pages: the first write
// to a fresh KV cache or activation buffer then takes one fault per 2 MiB instead of one per
// 4 KiB (in a VM each fault costs ~15 us: the first 512-token prefill of a Qwen2-1.5B shape
// spent 125-163 ms in KvWrite, 30 ms with huge pages), and streaming reads miss the TLB less. The advice is only a hint: where the kernel
// refuses it or THP is `never`, the buffer keeps 4 KiB pages and works the same.
//
// The mapping is rounded up to a whole number of 2 MiB pages when that adds at most 1/8 of the
// size (always from 16 MiB up), since the kernel only uses a huge page for a 2 MiB range lying
// wholly inside the mapping; otherwise it is rounded to 4 KiB and its tail keeps small pages.
// HostMemoryReservation says how much is mapped: what the process may come to hold when every
// page is written.
#pragma once

#include <cstddef>

namespace dh {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// The bytes AllocateHostMemory(bytes) maps or allocates (see above); 0 for 0 bytes or when the
// size is out of range.
size_t HostMemoryReservation(size_t bytes);
// Memory for `bytes` (64-byte aligned, 2 MiB aligned from kHugePageBytes up); nullptr when the
// system has none or bytes is 0. Free with FreeHostMemory and the same `bytes`.
void* AllocateHostMemory(size_t bytes);
void FreeHostMemory(void* data, size_t bytes);

// Memory whose pages may be handed back while it stays mapped: every mapping AllocateHostMemory
// makes (from kHugePageBytes up) is registered until freed; a private anonymous mapping made
// elsewhere (a compile cache read into memory) registers itself and unregisters before unmapping.
void RegisterReleasableMemory(const void* data, size_t bytes);
void UnregisterReleasableMemory(const void* data);
// Hands the whole 4 KiB pages inside [data, data + bytes) back to the system (MADV_DONTNEED)
// when the range lies inside registered memory, and returns how many bytes that was (0 when it
// does not, or the kernel refused). Those pages read as zero afterwards: for bytes no reader
// will ask for again (a weight's row layout once a backend's own copy serves every product).
size_t ReleaseHostPages(const void* data, size_t bytes);

}  // namespace dh
