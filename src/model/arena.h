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
