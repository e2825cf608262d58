// BufferChunks: backend memory for many blocks that live as long as each other (the weights a
// load converts, the CPU backend's prepacked copies), carved one after another from buffers of
// kBufferChunkBytes instead of allocated one by one. On the CPU a block under 2 MiB would come
// from the heap in 4 KiB pages (base/host_memory.h), while a buffer this large is 2 MiB aligned
// and advised as transparent huge pages: DeepSeek-V2-Lite's experts quantized to int4 at load
// (1.5 MB each, 8.3 of its 8.9 GiB) lay in 4 KiB pages and ran slower than the same bytes read
// from a compile cache into 2 MiB pages (bench/README.md "Zen 5, session 28"), and faulting in
// their prepacked copies 4 KiB at a time made that load take 24 s (docs/kernels.md). A block of a
// quarter of kBufferChunkBytes or more gets a buffer of its own, so the unused tail a buffer is
// left with (never written, so never resident) stays under a quarter. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace dh {

inline constexpr size_t kBufferChunkBytes = size_t{64} << 20;

class BufferChunks {
 public:
  // Every block starts on a multiple of `align` bytes (a power of two, at most 4096).
  explicit BufferChunks(size_t align) : align_(align) {}

  // The bytes of the new buffer Take(bytes) would allocate: 0 when the current one has room.
  size_t NewBufferBytes(size_t bytes) const;
  // `bytes` of `backend`'s memory; nullptr when bytes is 0 or out of range, or the backend has
  // no memory left.
  void* Take(Backend& backend, size_t bytes);
  // Hands over the buffers the blocks point into; the next Take starts a new buffer.
  std::vector<std::unique_ptr<Buffer>> Release();

 private:
  // bytes rounded up to the alignment; 0 when out of range.
  size_t Rounded(size_t bytes) const;

  size_t align_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  uint8_t* next_ = nullptr;  // the free part of the buffer being carved
  size_t left_ = 0;
};

}  // namespace dh
