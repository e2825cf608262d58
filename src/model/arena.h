// Activation arena: backend buffers reused across forward steps. Reset() at the start of a step
// makes every buffer available again; Alloc hands out tensors, growing (never shrinking) when a
// larger step needs more. Keeps steady-state decoding free of allocations.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace dh {

class Arena {
 public:
  explicit Arena(Backend& backend) : backend_(backend) {}
  void Reset() { next_ = 0; }
  // Mark() / Rewind(mark): every tensor allocated after the mark is dead, so its slot may be
  // handed out again. Models rewind at the start of each layer, so a step holds one layer's
  // activations (not one per layer: a 4096-token prefill of 28 layers would need ~11 GB).
  size_t Mark() const { return next_; }
  void Rewind(size_t mark) { next_ = mark; }
  Tensor Alloc(DType dtype, std::initializer_list<int64_t> dims);
  // An i32 tensor on the device holding `values`.
  Tensor Upload(std::span<const int32_t> values);

 private:
  struct Slot {
    std::unique_ptr<Buffer> buffer;
    size_t capacity = 0;
  };
  Backend& backend_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
};

}  // namespace dh
