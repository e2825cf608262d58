// BufferChunks: blocks carved from large backend buffers (buffer_chunks.h).
#include "backend/buffer_chunks.h"

#include <utility>

namespace dh {

size_t BufferChunks::Rounded(size_t bytes) const {
  if (bytes == 0 || bytes > SIZE_MAX - align_) return 0;
  return (bytes + align_ - 1) / align_ * align_;
}

size_t BufferChunks::NewBufferBytes(size_t bytes) const {
  const size_t need = Rounded(bytes);
  if (need >= kBufferChunkBytes / 4) return bytes;  // a buffer of its own
  return need <= left_ ? 0 : kBufferChunkBytes;
}

void* BufferChunks::Take(Backend& backend, size_t bytes) {
  const size_t need = Rounded(bytes);
  if (need == 0) return nullptr;
  const bool own = need >= kBufferChunkBytes / 4;
  if (!own && need <= left_) {
    void* p = next_;
    next_ += need;
    left_ -= need;
    return p;
  }
  std::unique_ptr<Buffer> buf = backend.Allocate(own ? bytes : kBufferChunkBytes);
  if (buf == nullptr || buf->data() == nullptr) return nullptr;
  auto* p = static_cast<uint8_t*>(buf->data());
  buffers_.push_back(std::move(buf));
  if (!own) {  // a new shared buffer: the rest is carved by the next blocks
    next_ = p + need;
    left_ = kBufferChunkBytes - need;
  }
  return p;
}

std::vector<std::unique_ptr<Buffer>> BufferChunks::Release() {
  next_ = nullptr;
  left_ = 0;
  return std::exchange(buffers_, {});
}

}  // namespace dh
