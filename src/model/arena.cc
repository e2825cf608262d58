// Arena: slot i is reused for the i-th allocation of every step (steps of one model allocate in
// the same order), reallocated only when it is too small.
#include "model/arena.h"

namespace dh {

Tensor Arena::Alloc(DType dtype, std::initializer_list<int64_t> dims) {
  Tensor t(nullptr, dtype, dims);
  const size_t bytes = std::max<size_t>(t.nbytes(), 64);
  if (next_ == slots_.size()) slots_.emplace_back();
  Slot& slot = slots_[next_++];
  if (slot.capacity < bytes) {
    slot.buffer = backend_.Allocate(bytes + bytes / 4);
    DH_CHECK(slot.buffer != nullptr, "activation allocation of {} bytes failed", bytes);
    slot.capacity = bytes + bytes / 4;
  }
  t.data = slot.buffer->data();
  return t;
}

Tensor Arena::Upload(std::span<const int32_t> values) {
  Tensor t = Alloc(DType::kI32, {static_cast<int64_t>(values.size())});
  if (!values.empty()) backend_.CopyToDevice(t, values.data());
  return t;
}

}  // namespace dh
